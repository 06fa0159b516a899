"""The errors a new user meets first (issue 31, "tried as a new user would"): misspelt task
options, YAML sections and ``TrainConfig(...)`` keywords get a did-you-mean; a turn count
above a task's ``max_turns`` option names that option; ``--print-config`` refuses what
``train`` would; a reward function of the wrong arity fails before any generation; no
error sends anyone to ``pip install comlrl-envs`` (not on PyPI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from comlrl.algos.cli.main import main
from comlrl.algos.training.config.rl import TrainConfig
from pydantic import ValidationError


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Any:
    """The built-in tiny-qwen2's tokenizer (trained on the spot, ~1 s)."""
    from comlrl.algos.models.loading import build_default_tokenizer

    return build_default_tokenizer()


def _train(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["train", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flag", [[], ["--print-config"]])
def test_a_misspelt_task_option_gets_a_did_you_mean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: list[str]
) -> None:
    code, err = _train(capsys, "task.kwargs.limt=2", f"output_dir={tmp_path}", *flag)
    assert code == 2
    assert "task.kwargs.limt: did you mean task.kwargs.limit?" in err, err


def test_a_misspelt_key_of_a_yaml_section_gets_a_did_you_mean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("task:\n  nme: coop_story\nlora:\n  rr: 4\n")
    code, err = _train(capsys, "--config", str(path), "--print-config")
    assert code == 2
    assert "task.nme: unknown field (got 'coop_story'); did you mean 'name'?" in err, err
    assert "lora.rr: unknown field (got 4); did you mean 'r'?" in err, err


def test_trainconfig_in_python_says_did_you_mean_instead_of_extra_forbidden() -> None:
    with pytest.raises(
        ValidationError, match=r"unknown field 'learnin_rate'; did you mean 'learning_rate'\?"
    ):
        TrainConfig(learnin_rate=1e-3)  # type: ignore[call-arg]
    with pytest.raises(
        ValidationError, match=r"unknown field 'task.nme'; did you mean 'task.name'\?"
    ):
        TrainConfig(task={"nme": "coop_story"})  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", [[], ["--print-config"]])
def test_too_many_turns_for_a_task_names_its_max_turns_option(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: list[str]
) -> None:
    argv = ["task.name=coop_humaneval", "models=[builtin:tiny-qwen2]", f"output_dir={tmp_path}"]
    code, err = _train(capsys, *argv, "num_turns=6", *flag)
    assert code == 2
    assert "set task.kwargs.max_turns=6" in err and "pick a multi-turn task" not in err, err
    assert main(["train", *argv, "num_turns=6", "task.kwargs.max_turns=6", "--print-config"]) == 0


def test_print_config_refuses_what_train_refuses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for bad, says in (
        ("models=[./no/such/model]", "no such directory"),
        ("task.name=coop_humanevl", "did you mean 'coop_humaneval'"),
        ("num_agents=3", "written for 2 agents"),
    ):
        code, err = _train(capsys, bad, "--print-config")
        assert code == 2 and says in err, (bad, err)


def test_a_reward_function_of_the_wrong_arity_fails_before_any_generation(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from comlrl.algos.models.loading import build_default_model
    from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.core import check_reward_arity

    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer) for i in range(2)
    ]
    for agent in agents:  # any generation at all fails the test
        monkeypatch.setattr(agent, "generate", lambda *a, **k: pytest.fail("generated"))

    def one_list(completions: list[str]) -> list[float]:
        return [0.0] * len(completions)

    with pytest.raises(TypeError, match=r"one_list\(completions_agent1, completions_agent2\)"):
        MultiAgentTrainer(
            agents,
            TrainConfig(output_dir=str(tmp_path), num_steps=1, progress=False),
            dataset=[{"text": "x"}],
            formatters=[lambda ex: ex["text"]] * 2,
            reward_func=one_list,
        )
    # the forms CoMLRL accepts pass
    check_reward_arity(lambda a, b: [0.0], 2)
    check_reward_arity(lambda a, b, example=None: [0.0], 2)
    check_reward_arity(lambda *completions, **kw: [0.0], 3)


def test_no_error_says_pip_install_comlrl_envs(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _train(capsys, "task.name=nope", "--print-config")
    assert code == 2
    assert (
        "not on PyPI" in err and "pip install ./packages/comlrl-core ./packages/comlrl-envs" in err
    )
    assert "pip install comlrl-envs" not in err
    src = Path(__file__).resolve().parents[2]  # packages/
    offenders = [
        str(p)
        for p in src.glob("comlrl-*/src/**/*.py")
        if "pip install comlrl-envs" in p.read_text(encoding="utf-8")
    ]
    assert not offenders, offenders


def test_multi_turn_runs_count_turns_from_0_in_the_closing_line_plot_and_feedback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One convention: turn_0 is the first turn in the metric keys, the closing line, the
    plot legend and the code suites' feedback text; the closing line names each turn
    (reward_mean is turn_0's) instead of silently showing turn 0 only."""
    from comlrl.algos.training.run.summary import plot_reward_curve, summary_line
    from comlrl.envs.code.feedback import verdict_line

    rows = [
        {"step": s, "reward_mean": 0.1 * s, "turn_0/reward_mean": 0.1 * s,
         "turn_1/reward_mean": 0.5, "prompts_per_s": 1.0}
        for s in range(1, 9)
    ]  # fmt: skip
    line = summary_line(rows, tmp_path)
    assert "turn_0 0.15 -> 0.75 (+0.60), turn_1 0.50 -> 0.50 (+0.00)" in line, line
    single = summary_line(
        [{k: v for k, v in r.items() if "turn_" not in k} for r in rows], tmp_path
    )
    assert "reward first quarter 0.15 -> last quarter 0.75 (+0.60)" in single, single

    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    seen: list[list[str]] = []
    save = Figure.savefig

    def savefig(fig: Figure, *a: Any, **k: Any) -> Any:
        seen.append(fig.axes[0].get_legend_handles_labels()[1])
        return save(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", savefig)
    plot_reward_curve(rows, tmp_path / "curve.png")
    # the curves are named as the metrics name them: turns count from 0
    assert seen and seen[0][0] == "turn_0/reward_mean" and "turn_1/reward_mean" in seen[0]
    assert verdict_line({"status": "failed", "passed": 2, "total": 7}, 0).startswith(
        "Turn 0: 2 of 7 tests passed"
    )
