"""Reporting: TensorBoard, W&B (offline), reward_curve.png, missing extras, the summary line."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import ConfigError, TrainConfig
from comlrl.algos.training.run import reporting
from comlrl.algos.training.run.reporting import (
    RewardCurveReporter,
    build_reporters,
    check_report_to,
    close_reporters,
)
from comlrl.algos.training.run.summary import (
    quarter_means,
    reward_series,
    rolling_mean,
    summary_line,
)

ROWS = [
    {"step": s, "reward_mean": s / 10, "turn_0/reward_mean": s / 10, "turn_1/reward_mean": s / 5}
    for s in range(1, 9)
]


def test_rolling_mean_is_a_trailing_window() -> None:
    assert rolling_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert rolling_mean([1.0, 3.0], 5) == [1.0, 2.0]
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        rolling_mean([1.0], 0)


def test_reward_series_has_one_line_per_turn() -> None:
    rows = [*ROWS, {"step": 9, "reward_mean": 0.9, "turn_0/reward_mean": 0.9}]  # no turn 1
    series = reward_series(rows)
    assert list(series) == [0, 1]
    assert series[0][0] == list(range(1, 10)) and series[1][0] == list(range(1, 9))
    assert series[1][1][0] == pytest.approx(0.2)
    assert reward_series([{"step": 1, "reward_mean": 0.3}]) == {0: ([1], [0.3])}


def test_quarter_means_and_summary_line(tmp_path: Path) -> None:
    assert quarter_means([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0]) == (0.0, 2.0)
    assert quarter_means([0.5]) == (0.5, 0.5)
    history = [
        {"reward_mean": v, "prompts_per_s": 3.0} for v in [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0]
    ]
    line = summary_line(history, tmp_path)
    assert line.startswith("done: 8 steps, reward first quarter 0.45 -> last quarter 1.00 (+0.55)")
    assert "reward_curve.png" not in line
    (tmp_path / "reward_curve.png").write_bytes(b"")
    assert "reward_curve.png" in summary_line(history, tmp_path)


def test_missing_extras_fail_before_training_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        reporting.importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("tensorboard", "wandb") else real(name, *a),
    )
    check_report_to(["jsonl"])  # needs nothing
    with pytest.raises(ConfigError) as info:
        check_report_to(["jsonl", "tensorboard", "wandb"])
    message = str(info.value)
    assert "pip install 'comlrl-algos[tensorboard]'" in message
    assert "pip install 'comlrl-algos[wandb]'" in message
    with pytest.raises(ConfigError, match=r"comlrl-algos\[tensorboard\]"):
        build_reporters(TrainConfig(report_to=["tensorboard"]), "unused")


def test_report_to_accepts_a_string_and_always_keeps_jsonl() -> None:
    assert TrainConfig(report_to="tensorboard").report_to == ["jsonl", "tensorboard"]  # type: ignore[arg-type]
    assert TrainConfig(report_to=["wandb", "jsonl"]).report_to == ["wandb", "jsonl"]
    with pytest.raises(ValueError, match="report_to"):
        TrainConfig(report_to=["mlflow"])  # type: ignore[list-item]


def test_reward_curve_without_matplotlib_prints_one_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(reporting, "missing_extra", lambda extra: f"no {extra} here")
    reporter = RewardCurveReporter(tmp_path / "reward_curve.png")
    for row in ROWS:
        reporter.log(row)
    reporter.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "comlrl: reward_curve.png skipped: matplotlib is not installed "
        "(pip install 'comlrl-algos[plot]', then `comlrl plot RUN_DIR` draws it)"
    ]
    assert not (tmp_path / "reward_curve.png").exists()


def test_reward_curve_png_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    reporter = RewardCurveReporter(tmp_path / "reward_curve.png", title="t")
    for row in ROWS:
        reporter.log(row)
    reporter.close()
    data = (tmp_path / "reward_curve.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    with pytest.raises(ValueError, match="nothing to plot"):
        reporting.plot_reward_curve([{"step": 1}], tmp_path / "x.png")


def test_close_reporters_closes_all_then_raises_the_first_failure() -> None:
    closed: list[str] = []

    class Boom:
        def log(self, row: Any) -> None: ...
        def close(self) -> None:
            closed.append("boom")
            raise RuntimeError("disk full")

    class Ok:
        def log(self, row: Any) -> None: ...
        def close(self) -> None:
            closed.append("ok")

    with pytest.raises(RuntimeError, match="disk full"):
        close_reporters([Boom(), Ok()])
    assert closed == ["boom", "ok"]


def _train(tok: Any, tmp_path: Path, **overrides: Any) -> list[dict[str, float]]:
    cfg = TrainConfig(
        num_steps=3,
        batch_size=2,
        num_generations=2,
        max_new_tokens=4,
        learning_rate=1e-3,
        output_dir=str(tmp_path),
        progress=False,
        log_samples=0,
        **overrides,
    )
    agents = [
        HFAgent(build_default_model(len(tok), seed=i), tok, name=f"agent_{i}") for i in range(2)
    ]
    trainer = MultiAgentTrainer(
        agents,
        cfg,
        dataset=[{"t": "a"}, {"t": "b"}],
        reward_func=lambda c1, c2: [len(a) / 10 for a in c1],
        formatters=[lambda ex: ex["t"], lambda ex: ex["t"]],
    )
    return trainer.train()


def test_training_writes_tensorboard_scalars_and_the_reward_curve(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    history = _train(tiny_tokenizer, tmp_path, report_to=["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("reward_mean")
    assert [e.step for e in events] == [1, 2, 3]
    assert [e.value for e in events] == pytest.approx([r["reward_mean"] for r in history])
    assert "loss/agent_1" in acc.Tags()["scalars"]
    assert (tmp_path / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3  # jsonl is always written


def test_training_logs_to_wandb_offline_without_network(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="the [wandb] extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    _train(tiny_tokenizer, tmp_path, report_to=["wandb"], wandb_project="p", reward_curve=False)
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, list((tmp_path / "wandb").iterdir())
    # wandb's writer process may still be flushing the run file when finish() returns.
    data = b""
    for _ in range(300):
        data = runs[0].read_bytes()
        if b"loss/agent_0" in data:
            break
        time.sleep(0.1)
    assert b"reward_mean" in data and b"loss/agent_0" in data, data[:200]
    assert not (tmp_path / "reward_curve.png").exists()


def test_a_resumed_run_is_summed_up_and_plotted_from_step_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """metrics.jsonl holds steps 1-8 (step 6 redone after a resume); the resumed process
    itself only saw steps 6-8."""
    rows = [
        {"step": s, "reward_mean": 0.1 * s, "turn_0/reward_mean": 0.1 * s, "prompts_per_s": 1.0}
        for s in range(1, 9)
    ]
    lines = [json.dumps(r) for r in rows[:6]] + ["not json"] + [json.dumps(r) for r in rows[5:]]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert [r["step"] for r in reporting.read_metrics(tmp_path / "metrics.jsonl")] == list(
        range(1, 9)
    )
    line = summary_line(rows[5:], tmp_path)
    assert line.startswith("done: 8 steps, reward first quarter 0.15 -> last quarter 0.75"), line
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    seen: list[list[int]] = []
    real = reporting.plot_reward_curve

    def spy(rows: Any, path: Any, **kwargs: Any) -> Path:
        seen.append([r["step"] for r in rows])
        return real(rows, path, **kwargs)

    monkeypatch.setattr(reporting, "plot_reward_curve", spy)
    reporter = RewardCurveReporter(tmp_path / "c.png", metrics_path=tmp_path / "metrics.jsonl")
    for row in rows[5:]:
        reporter.log(row)
    reporter.close()
    assert seen == [list(range(1, 9))] and (tmp_path / "c.png").is_file()
