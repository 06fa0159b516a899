"""``comlrl train algo=NAME``: each recipe runs end to end from the command line (a few
steps of the built-in stories260k, in-process to keep CI fast) and writes its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comlrl.algos.cli import main

TINY = ["num_steps=2", "progress=false"]
STORY = ["task.kwargs.limit=4", "max_new_tokens=16"]


def _rows(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_final(out: Path, agents: int) -> None:
    for i in range(agents):
        assert (out / "final" / f"agent_{i}" / "config.json").is_file()
        assert (out / "final" / f"agent_{i}" / "model.safetensors").is_file()


@pytest.mark.parametrize("algo", ["iac", "maac"])
def test_actor_critic_recipes_run_on_the_default_task(
    algo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / algo
    assert main(["train", f"algo={algo}", *TINY, *STORY, f"output_dir={out}", "log_samples=1"]) == 0
    cap = capsys.readouterr()
    assert "2 agents (builtin:stories260k) on coop_story (4 examples), " + algo.upper() in cap.err
    assert cap.out.strip().splitlines()[-1].startswith("done: 2 steps, reward first quarter ")
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all("critic/value_loss" in r or "value_loss/agent_0" in r for r in rows), rows[0].keys()
    _check_final(out, 2)
    critic = out / "final" / ("critic_0" if algo == "iac" else "critic")
    assert critic.is_dir()
    # its checkpoints hold no optimizer state: --resume says so before loading anything
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"algo={algo}" in err and "cannot be resumed yet" in err


def test_madpo_runs_on_the_default_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "madpo"
    assert main(["train", "algo=madpo", *TINY, *STORY, "batch_size=2", f"output_dir={out}"]) == 0
    cap = capsys.readouterr()
    assert "MADPO, 2 steps of 2 prompts x 4 candidates" in cap.err
    assert cap.out.strip().splitlines()[-1].startswith("done: 2 steps, reward_mean first quarter")
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(isinstance(r["reward_mean"], float) and "num_pairs" in r for r in rows)
    _check_final(out, 2)
    saved = (out / "config.yaml").read_text()
    assert saved.startswith("algo: madpo\n") and "num_candidates: 4" in saved


@pytest.mark.parametrize(
    ("algo", "row"),
    [
        (
            "sft",
            {"prompt": "Once upon a time, Lily had a ball.", "completion": " She played all day."},
        ),
        (
            "dpo",
            {
                "prompt": "Once upon a time, Lily had a ball.",
                "chosen": " She played.",
                "rejected": " The the.",
            },
        ),
    ],
)
def test_one_model_recipes_train_on_a_jsonl_file(
    algo: str, row: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps(row) for _ in range(4)) + "\n")
    out = tmp_path / algo
    argv = ["train", f"algo={algo}", f"data={data}", *TINY, "batch_size=2", "learning_rate=1e-3"]
    assert main([*argv, f"output_dir={out}"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("done: 2 steps, loss first quarter "), summary
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    # a learning rate of 1e-3 on four copies of one row: the loss must fall
    assert rows[1]["loss"] < rows[0]["loss"]
    _check_final(out, 1)
    assert json.loads((out / "final" / "checkpoint.json").read_text())["step"] == 2
    # the saved config reproduces the run: `comlrl train --config out/config.yaml`
    assert main(["train", "--config", str(out / "config.yaml"), "--print-config"]) == 0
    assert capsys.readouterr().out.startswith(f"algo: {algo}\n")
    # a second run into the same folder is refused without --overwrite
    assert main([*argv, f"output_dir={out}"]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_missing_data_and_unknown_keys_fail_before_any_model_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["train", "algo=dpo"]) == 2
    assert "needs data=PATH.jsonl" in capsys.readouterr().err
    assert main(["train", "algo=iac", "estimatr=grpo"]) == 2
    err = capsys.readouterr().err
    assert "unknown key for algo=iac: 'estimatr'; did you mean 'estimator'" in err
    assert "Valid keys of iac (ActorCriticConfig):" in err
    assert main(["train", "algo=ppo"]) == 2
    assert "unknown algo='ppo'" in capsys.readouterr().err


def test_recipes_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes"]) == 0
    listed = capsys.readouterr().out
    assert main(["train", "algo=list"]) == 0
    assert capsys.readouterr().out == listed
    for name in ("magrpo (grpo)", "iac", "maac", "madpo", "marlhf", "dpo", "sft"):
        assert f"\n{name} " in "\n" + listed
