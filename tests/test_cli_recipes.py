"""``comlrl train algo=NAME``: each recipe runs end to end from the command line (a few
steps of the built-in stories260k, in-process to keep CI fast) and writes its outputs."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from comlrl.algos.cli.main import main

TINY = ["num_steps=2", "progress=false"]
STORY = ["task.kwargs.limit=4", "max_new_tokens=16"]


def _rows(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_final(out: Path, agents: int) -> None:
    for i in range(agents):
        assert (out / "final" / f"agent_{i}" / "config.json").is_file()
        assert (out / "final" / f"agent_{i}" / "model.safetensors").is_file()


def _eval_and_collect(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``comlrl eval`` and ``comlrl collect`` of the run's final agents read its config.yaml
    (the recipe's own settings, e.g. critics or preference pairs, left out: they sample)."""
    models = [a for i in (0, 1) for a in ("--model", str(out / "final" / f"agent_{i}"))]
    capsys.readouterr()
    assert main(["eval", *models, "eval_limit=2"]) == 0, capsys.readouterr().err
    mode = "sampled, k=4" if out.name == "madpo" else "greedy"  # as the run evaluated
    assert f"eval coop_story:test (2 problems, {mode}" in capsys.readouterr().out
    (row,) = _rows(out / "evals" / "final" / "eval.jsonl")
    assert row["task"] == "coop_story" and row["num_problems"] == 2.0
    rows = out.parent / f"{out.name}_rows.jsonl"
    argv = ["collect", *models, "-n", "2", "--min-reward=-1e9", "--output", str(rows)]
    assert main(argv) == 0, capsys.readouterr().err
    assert {r["agent"] for r in _rows(rows)} == {0, 1}


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Send this process a real SIGINT (a terminal's Ctrl-C) right after the metrics row of
    ``step`` is written: the recipe's handler must finish the step, checkpoint and stop."""
    from comlrl.algos.training.run.data import JsonlWriter

    original = JsonlWriter.write

    def write(self: JsonlWriter, row: Any) -> None:
        original(self, row)
        if self.path.name == "metrics.jsonl" and row.get("step") == step:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(JsonlWriter, "write", write)


def _assert_same_outputs(out: Path, reference: Path) -> None:
    """The logs and the final weights of a resumed run equal the uninterrupted run's.

    Tolerance 1e-6 absolute, as in tests/test_run_lifecycle.py: the resumed run repeats
    the same float32 operations in the same order from bit-identical weights, optimizer
    moments and random streams (they match bit for bit here); 1e-6 leaves room only for a
    BLAS picking another kernel, which moves float32 sums of O(1) terms by ~1e-7. Lost
    state (moments, data order, a sampling stream) changes them by far more.
    """
    import torch
    from safetensors.torch import load_file

    for name in ("metrics.jsonl", "samples.jsonl", "eval.jsonl"):
        _assert_same_rows(out / name, reference / name)
    files = sorted(p.relative_to(reference) for p in (reference / "final").rglob("*.safetensors"))
    assert files
    for rel in files:
        got_t, want_t = load_file(out / rel), load_file(reference / rel)
        assert got_t.keys() == want_t.keys(), rel
        for k in want_t:
            torch.testing.assert_close(got_t[k], want_t[k], atol=1e-6, rtol=0, msg=f"{rel} {k}")


def _assert_same_rows(got_path: Path, want_path: Path) -> None:
    """Same rows, floats within 1e-6 (see :func:`_assert_same_outputs`); timings aside."""
    assert got_path.exists() == want_path.exists(), got_path
    if not want_path.exists():
        return
    got, want = _rows(got_path), _rows(want_path)
    name = want_path.name
    assert [r.get("step") for r in got] == [r.get("step") for r in want], name
    assert len(got) == len(want) and want, name
    for g, w in zip(got, want, strict=True):
        keys = {k for k in w if not k.startswith("time/") and not k.endswith("_per_s")}
        assert keys == {k for k in g if not k.startswith("time/") and not k.endswith("_per_s")}
        for k in sorted(keys):
            if isinstance(w[k], float):
                assert abs(g[k] - w[k]) <= 1e-6, (
                    f"{name} step {w.get('step')} {k}: {g[k]} != {w[k]}"
                )
            else:
                assert g[k] == w[k], f"{name} step {w.get('step')} {k}: {g[k]!r} != {w[k]!r}"


@pytest.mark.parametrize("algo", ["iac", "maac"])
def test_actor_critic_recipes_run_on_the_default_task_and_resume_exactly(
    algo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / algo
    argv = [
        "train",
        f"algo={algo}",
        "num_steps=3",
        "progress=false",
        *STORY,
        "log_samples=1",
        "save_every=1",
        "keep_last=2",
        "eval_every=2",
        "eval_limit=2",
        "parallel_agents=false",
    ]
    assert main([*argv, f"output_dir={out}"]) == 0
    cap = capsys.readouterr()
    assert "2 agents (builtin:stories260k) on coop_story (4 examples), " + algo.upper() in cap.err
    assert cap.out.strip().splitlines()[-1].startswith("done: 3 steps, reward first quarter ")
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("critic/value_loss" in r or "value_loss/agent_0" in r for r in rows), rows[0].keys()
    _check_final(out, 2)
    critic = out / "final" / ("critic_0" if algo == "iac" else "critic")
    assert critic.is_dir()
    assert (out / "config.yaml").read_text().startswith(f"algo: {algo}\n")
    _eval_and_collect(out, capsys)
    # Ctrl-C after step 1: the step finishes, a checkpoint is written, exit 130
    run = tmp_path / f"{algo}-interrupted"
    _interrupt_after(monkeypatch, 1)
    assert main([*argv, f"output_dir={run}"]) == 130
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert f"interrupted at step 1; checkpoint: {run / 'checkpoints' / 'step-000001'}" in err, err
    assert f"resume with: comlrl train --resume {run}" in err
    assert main(["train", "--resume", str(run)]) == 0
    assert f"resuming {run} at step 1 of 3" in capsys.readouterr().out
    _assert_same_outputs(run, out)
    # a finished run has nothing left to do; unsafe overrides are refused
    assert main(["train", "--resume", str(run), "learning_rate=0.5"]) == 2
    assert "cannot change learning_rate" in capsys.readouterr().err


def test_a_lora_runs_agents_evaluate_and_collect_from_their_adapter_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("peft", reason="LoRA needs peft: pip install 'comlrl-algos[lora]'")
    out = tmp_path / "lora"
    argv = ["train", "lora.r=4", "lora.target_modules=all-linear", *TINY, *STORY]
    argv += ["batch_size=2", "learning_rate=0.05", "eval_every=2", "eval_limit=2"]
    assert main([*argv, f"output_dir={out}"]) == 0, capsys.readouterr().err
    for i in (0, 1):  # adapters only, each naming its base
        assert not (out / "final" / f"agent_{i}" / "config.json").exists()
        assert (out / "final" / f"agent_{i}" / "comlrl_base.json").is_file()
    _eval_and_collect(out, capsys)
    # the adapters loaded into one base again: the greedy evaluation of the last step
    (trained,) = _rows(out / "eval.jsonl")
    (again,) = _rows(out / "evals" / "final" / "eval.jsonl")
    assert trained["step"] == again["step"] == 2
    assert again["reward_mean"] == pytest.approx(trained["reward_mean"], abs=1e-6)


def _interrupted_and_resumed(
    argv: list[str],
    run: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    total: int,
    step: int = 1,
) -> None:
    """Run ``argv`` into ``run`` with a Ctrl-C after ``step`` (exit 130, a checkpoint),
    then ``comlrl train --resume run`` to the end."""
    _interrupt_after(monkeypatch, step)
    assert main([*argv, f"output_dir={run}"]) == 130
    monkeypatch.undo()
    err = capsys.readouterr().err
    where = run / "checkpoints" / f"step-{step:06d}"
    assert f"interrupted at step {step}; checkpoint: {where}" in err, err
    assert main(["train", "--resume", str(run)]) == 0, capsys.readouterr().err
    assert f"resuming {run} at step {step} of {total}" in capsys.readouterr().out


def test_madpo_runs_on_the_default_task_and_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "madpo"
    argv = ["train", "algo=madpo", "num_steps=3", "progress=false", *STORY, "batch_size=2"]
    argv += ["save_every=1", "keep_last=2", "eval_split=test", "eval_limit=2", "eval_every=2"]
    assert main([*argv, f"output_dir={out}"]) == 0
    cap = capsys.readouterr()
    assert "MADPO, 3 steps of 2 prompts x 4 candidates" in cap.err
    assert cap.out.strip().splitlines()[-1].startswith("done: 3 steps, reward_mean first quarter")
    assert (out / "reward_curve.png").is_file()
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(isinstance(r["reward_mean"], float) and "num_pairs" in r for r in rows)
    evals = _rows(out / "eval.jsonl")  # before step 1, at step 2, after the last
    assert [r["step"] for r in evals] == [0, 2, 3] and "eval/reward_mean" in evals[1]
    assert not any(k.startswith("eval/") for r in rows for k in r)
    _check_final(out, 2)
    saved = (out / "config.yaml").read_text()
    assert saved.startswith("algo: madpo\n") and "num_generations: 4" in saved
    _eval_and_collect(out, capsys)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-000002",
        "step-000003",
    ]
    run = tmp_path / "madpo-interrupted"
    _interrupted_and_resumed(argv, run, monkeypatch, capsys, 3)
    _assert_same_outputs(run, out)


def test_marlhf_resumes_its_rl_phase_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "marlhf"
    argv = [
        "train",
        "algo=marlhf",
        "num_steps=3",
        "progress=false",
        *STORY,
        "batch_size=2",
        "eval_every=2",
    ]
    argv += ["num_generations=2", "num_candidates=2", "num_collect_batches=2", "log_samples=1"]
    argv += ["reward.num_epochs=2", "save_every=1", "parallel_agents=false"]
    assert main([*argv, f"output_dir={out}"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("done: 3 steps")
    assert (out / "final" / "reward_model" / "head.safetensors").is_file()
    _eval_and_collect(out, capsys)
    run = tmp_path / "marlhf-interrupted"
    _interrupted_and_resumed(argv, run, monkeypatch, capsys, 3)
    _assert_same_outputs(run, out)
    _assert_same_rows(run / "reward_model_metrics.jsonl", out / "reward_model_metrics.jsonl")


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
def test_one_model_recipes_train_on_a_jsonl_file_and_resume_exactly(
    algo: str,
    row: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps(row) for _ in range(4)) + "\n")
    out = tmp_path / algo
    argv = ["train", f"algo={algo}", f"data={data}", *TINY, "batch_size=2", "learning_rate=1e-3"]
    argv.append("save_every=1")
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
    # Ctrl-C after step 1, then --resume: the same rows and final weights
    _interrupted_and_resumed(argv, tmp_path / f"{algo}-interrupted", monkeypatch, capsys, 2)
    _assert_same_outputs(tmp_path / f"{algo}-interrupted", out)


def test_missing_data_and_unknown_keys_fail_before_any_model_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["train", "algo=dpo"]) == 2
    assert "needs data=PATH.jsonl" in capsys.readouterr().err
    assert main(["train", "algo=iac", "critic_typ=q"]) == 2
    err = capsys.readouterr().err
    assert "unknown key for algo=iac: 'critic_typ'; did you mean 'critic_type'" in err
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


@pytest.mark.parametrize("algo", ["magrpo", "iac"])
def test_eval_on_start_writes_the_baseline_row(algo: str, tmp_path: Path) -> None:
    out = tmp_path / algo
    argv = ["train", f"algo={algo}", *TINY, *STORY, "batch_size=2", f"output_dir={out}"]
    assert main([*argv, "eval_every=2", "eval_on_start=true", "eval_limit=2"]) == 0
    assert [r["step"] for r in _rows(out / "eval.jsonl")] == [0, 2]


@pytest.mark.parametrize("algo", ["magrpo", "iac", "madpo"])
def test_resuming_a_finished_run_says_so(
    algo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / algo
    argv = ["train", f"algo={algo}", *TINY, *STORY, "batch_size=2", f"output_dir={out}"]
    assert main(argv) == 0
    assert json.loads((out / "final" / "checkpoint.json").read_text())["step"] == 2
    capsys.readouterr()
    assert main(["train", "--resume", str(out)]) == 0
    assert "finished at step 2" in capsys.readouterr().out
    # longer, but save_every=0 left no optimizer state to continue from: refused, clearly
    assert main(["train", "--resume", str(out), "num_steps=4"]) == 2
    assert "without a step checkpoint (save_every=0)" in capsys.readouterr().err


def test_a_bug_during_training_keeps_its_traceback_and_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only configuration errors exit 2 with a message: a ValueError raised by a training
    step is a bug, so it propagates (traceback and all) and the run keeps its checkpoint."""
    from comlrl.algos.recipes.group_baseline import recipe as gb

    original = gb.GroupBaselineRecipe.step

    def step(run: Any) -> Any:
        if run.global_step == 1:
            raise ValueError("a bug in step 2")
        return original(run)

    monkeypatch.setattr(gb.GroupBaselineRecipe, "step", step)
    out = tmp_path / "bug"
    argv = ["train", "num_steps=3", "progress=false", *STORY, "batch_size=2", "save_every=1"]
    with pytest.raises(ValueError, match="a bug in step 2"):
        main([*argv, f"output_dir={out}"])
    assert (out / "checkpoints" / "step-000001" / "checkpoint.json").is_file()


def test_a_bug_in_a_preference_step_keeps_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from comlrl.algos.recipes.preference.supervised import recipe as preference

    calls: list[int] = []
    original = preference.sft_nll

    def sft_nll(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("a bug in step 2")
        return original(*args, **kwargs)

    monkeypatch.setattr(preference, "sft_nll", sft_nll)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "Once upon a time,", "completion": " Lily ran."}) + "\n")
    out = tmp_path / "sft"
    argv = ["train", "algo=sft", f"data={data}", *TINY, "batch_size=1", "save_every=1"]
    with pytest.raises(ValueError, match="a bug in step 2"):
        main([*argv, f"output_dir={out}"])
    assert (out / "checkpoints" / "step-000001" / "checkpoint.json").is_file()


def test_a_configuration_error_exits_2_with_a_message_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bad"
    assert main(["train", *TINY, *STORY, "task.split=nope", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("comlrl: ") and "nope" in err and "Traceback" not in err
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("algo", ["iac", "maac", "madpo"])
def test_every_rl_recipe_writes_tensorboard_events_and_a_reward_curve(
    algo: str, tmp_path: Path
) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("matplotlib")
    out = tmp_path / algo
    argv = ["train", f"algo={algo}", *TINY, *STORY, "report_to=[tensorboard]"]
    argv += ["batch_size=2", f"output_dir={out}"]
    assert main(argv) == 0
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "reward_curve.png").is_file()
