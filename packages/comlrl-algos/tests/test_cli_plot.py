"""``comlrl plot RUN_DIR`` and the reward figure: metric-named curves, integer step ticks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comlrl.algos.cli.main import main
from comlrl.algos.training.run import reporting
from comlrl.algos.training.run.summary import curve_series, reward_figure

#: a two-turn run of three steps; step 2 never reached turn 1
ROWS = [
    {"step": 1, "reward_mean": 0.2, "turn_0/reward_mean": 0.2, "turn_1/reward_mean": 0.4},
    {"step": 2, "reward_mean": 0.3, "turn_0/reward_mean": 0.3},
    {"step": 3, "reward_mean": 0.5, "turn_0/reward_mean": 0.5, "turn_1/reward_mean": 0.7},
]


def _run_dir(tmp_path: Path, rows: list[dict[str, float]] = ROWS) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text(
        "task:\n  name: coop_story\nmodels: [builtin:stories260k]\nestimator: grpo\n"
    )
    return run


def test_curves_are_named_as_the_metrics_name_them() -> None:
    series = curve_series(ROWS)
    assert list(series) == ["turn_0/reward_mean", "turn_1/reward_mean"]
    assert series["turn_1/reward_mean"] == ([1, 3], [0.4, 0.7])
    assert list(curve_series([{"step": 1, "reward_mean": 0.1}])) == ["reward_mean"]
    mixed = curve_series([{"step": 1, "turn_0/reward_mean": 0.1, "reward/mbpp": 0.0}])
    assert list(mixed) == ["turn_0/reward_mean", "reward/mbpp"]


def test_the_figure_has_metric_labels_and_integer_step_ticks() -> None:
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    fig = reward_figure(ROWS, window=2)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [
        "turn_0/reward_mean",
        "turn_0/reward_mean, rolling mean (2 steps)",
        "turn_1/reward_mean",
        "turn_1/reward_mean, rolling mean (2 steps)",
    ]
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    # matplotlib's default locator puts 1.0, 1.25, 1.5, ... on a 3-step axis
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_comlrl_plot_remakes_the_curve_of_a_run_made_without_matplotlib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    run = _run_dir(tmp_path)
    assert not (run / "reward_curve.png").exists()
    assert main(["plot", str(run)]) == 0
    assert f"wrote {run / 'reward_curve.png'} (3 steps)" in capsys.readouterr().out
    assert (run / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["plot", str(run), "--output", str(tmp_path / "x.png"), "--window", "1"]) == 0
    assert (tmp_path / "x.png").is_file()


def test_comlrl_plot_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "has no metrics rows" in capsys.readouterr().err
    run = _run_dir(tmp_path, [{"step": 1, "loss": 0.5}])
    if reporting.missing_extra("plot") is None:
        assert main(["plot", str(run)]) == 2
        assert "nothing to plot" in capsys.readouterr().err
    monkeypatch.setattr(reporting, "missing_extra", lambda extra: f"no {extra} here")
    assert main(["plot", str(run)]) == 2
    assert "no plot here" in capsys.readouterr().err
