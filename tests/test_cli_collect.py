"""``comlrl collect``: rejection sampling into SFT rows, and the SFT-then-RL pipeline
(collect -> ``algo=sft`` -> MAGRPO -> ``comlrl eval``) on the built-in model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comlrl.algos.cli.main import main

COLLECT = ["collect", "--model", "builtin:stories260k", "task.kwargs.limit=8", "max_new_tokens=12"]


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_collect_keeps_exactly_the_joint_actions_at_or_above_the_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    every = tmp_path / "all.jsonl"
    assert main([*COLLECT, "-n", "16", "--min-reward=-1e9", "--output", str(every)]) == 0
    out = capsys.readouterr()
    assert "16 joint actions sampled on 4 examples (G=4" in out.out
    assert "collect" in out.err  # the progress bar
    rows = _rows(every)
    assert {r["agent"] for r in rows} == {0, 1}
    for r in rows:
        assert isinstance(r["prompt"], str) and r["prompt"]
        assert isinstance(r["completion"], str)
        assert str(r["example_id"]).startswith("coop_story/")
    rewards = sorted({float(r["reward"]) for r in rows})  # type: ignore[arg-type]
    assert len(rewards) > 1, "every joint action had one reward: the threshold cannot split"
    threshold = rewards[len(rewards) // 2]
    kept = tmp_path / "kept.jsonl"
    args = [*COLLECT, "-n", "16", f"--min-reward={threshold}", "--output", str(kept)]
    assert main(args) == 0
    # same seed, same samples: the kept rows are the rows of the full set at or above R
    expected = [r for r in rows if float(r["reward"]) >= threshold]  # type: ignore[arg-type]
    assert _rows(kept) == expected and expected
    assert main(args) == 2  # an existing output is refused
    assert "pass --overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite", "-n", "0"]) == 2


def _assert_prompts_as_rendered(
    rows: list[dict[str, object]], model: str, task_name: str, **kwargs: object
) -> None:
    """Every row's prompt is the task's prompt rendered for ``model`` as its agent renders
    it (chat template where the tokenizer has one)."""
    from comlrl.algos.models.chat_template import render_prompts, resolve_prompt_format
    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.core import get_task

    task = get_task(task_name, **kwargs)
    examples = {ex.get("task_id", ex.get("id")): ex for ex in task.load("train")}
    _, tokenizer = load_model_and_tokenizer(model)
    fmt = resolve_prompt_format(tokenizer, "auto")
    assert rows
    for r in rows:
        prompt = task.prompts(examples[r["example_id"]])[int(r["agent"])]  # type: ignore[call-overload]
        assert r["prompt"] == render_prompts(tokenizer, [prompt], fmt)[0]
    task.close()


def test_rows_of_a_code_task_hold_the_prompt_the_model_saw(tmp_path: Path) -> None:
    rows_path = tmp_path / "rows.jsonl"
    args = ["collect", "--model", "builtin:tiny-qwen2", "task.name=coop_humaneval"]
    args += ["task.kwargs.limit=2", "num_generations=2", "max_new_tokens=8"]
    assert main([*args, "-n", "4", "--min-reward=-1e9", "--output", str(rows_path)]) == 0
    rows = _rows(rows_path)
    _assert_prompts_as_rendered(rows, "builtin:tiny-qwen2", "coop_humaneval", limit=2)


def test_collected_rows_are_what_the_model_saw_and_sft_trains_on_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows_path = tmp_path / "rows.jsonl"
    args = [*COLLECT, "-n", "8", "--min-reward=-1e9", "--output", str(rows_path)]
    assert main(args) == 0
    _assert_prompts_as_rendered(_rows(rows_path), "builtin:stories260k", "coop_story", limit=8)
    sft = tmp_path / "sft"
    train = ["train", "algo=sft", f"data={rows_path}", "num_steps=2", "batch_size=4"]
    assert main([*train, f"output_dir={sft}", "progress=false"]) == 0
    assert (sft / "final" / "agent_0").is_dir()
    # the fine-tuned model alone: its run's config is an SFT config, not a team's
    sft_eval = ["eval", "--model", str(sft / "final" / "agent_0"), "eval_limit=2"]
    assert main([*sft_eval, "--output-dir", str(tmp_path / "sft_eval")]) == 0
    # ... then MAGRPO from the fine-tuned model, then a held-out evaluation
    rl = tmp_path / "rl"
    rl_args = ["train", "--model", str(sft / "final" / "agent_0"), "num_steps=2", "batch_size=2"]
    assert main([*rl_args, "max_new_tokens=12", f"output_dir={rl}", "progress=false"]) == 0
    ev = [
        "eval",
        "--model",
        str(rl / "final" / "agent_0"),
        "--model",
        str(rl / "final" / "agent_1"),
        "eval_limit=2",
    ]
    assert main(ev) == 0
    assert "reward_mean=" in capsys.readouterr().out
