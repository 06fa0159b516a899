"""Step checkpoints: exact resume in process, atomic folders, pruning, logs cut back, safe configs."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
from pathlib import Path

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import ConfigError, TrainConfig
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.lifecycle import (
    StopAtStepBoundary,
    clear_run_outputs,
    existing_run_outputs,
    resume_config,
    truncate_jsonl,
    used_output_dir_message,
)
from comlrl.core import RewardFunctionError

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(5)]


def _length_reward(c1: list[str], c2: list[str]) -> list[float]:
    return [-abs(len(a) - len(b)) / 50.0 for a, b in zip(c1, c2)]


def _trainer(tok, out: Path, reward=_length_reward, **overrides) -> MultiAgentTrainer:  # type: ignore[no-untyped-def]
    """Two tiny agents; 5 examples in batches of 2, so epochs straddle steps."""
    settings = dict(
        num_steps=4,
        batch_size=2,
        num_generations=3,
        max_new_tokens=8,
        learning_rate=1e-2,
        output_dir=str(out),
        progress=False,
        parallel_agents=False,
        seed=5,
    )
    cfg = TrainConfig(**{**settings, **overrides})
    torch.manual_seed(0)
    agents = [
        HFAgent(build_default_model(len(tok), seed=i), tok, name=f"agent_{i}") for i in range(2)
    ]
    return MultiAgentTrainer(
        agents,
        cfg,
        dataset=DATA,
        reward_func=reward,
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# test"],
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_resumed_trainer_continues_bit_for_bit(tiny_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Fresh agents (other weights: the models here are rebuilt from their seeds) resumed at
    step 2 give exactly the uninterrupted run's rows 3 and 4: weights, RAdam moments, the
    data order mid-epoch and all random streams came back (same ops, same thread: exact)."""
    full = _trainer(tiny_tokenizer, tmp_path / "full", save_every=2)
    want = full.train()
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "full", copy)
    shutil.rmtree(copy / "final")
    shutil.rmtree(copy / "checkpoints" / "step-000004")
    random.seed(1234)  # scramble what the checkpoint must restore
    torch.manual_seed(1234)
    resumed = _trainer(tiny_tokenizer, copy, save_every=2)
    resumed.data.next_batch(3)
    assert resumed.resume(copy / "checkpoints" / "step-000002") == 2
    assert [r["step"] for r in _rows(copy / "metrics.jsonl")] == [1, 2], (
        "rows after the checkpoint go"
    )
    got = resumed.train()
    assert [r["step"] for r in got] == [3, 4]
    for g, w in zip(got, want[2:], strict=True):
        for key in (
            "reward_mean",
            "reward_std",
            "loss/agent_0",
            "loss/agent_1",
            "grad_norm/agent_1",
            "completion_len_mean/agent_0",
            "advantage_std/agent_1",
        ):
            assert g[key] == w[key], (g["step"], key, g[key], w[key])
    a = torch.load(copy / "checkpoints" / "step-000004" / ckpt.STATE_FILE, weights_only=True)
    b = torch.load(
        tmp_path / "full" / "checkpoints" / "step-000004" / ckpt.STATE_FILE, weights_only=True
    )
    assert a["data"] == b["data"] and a["rng"]["run"] == b["rng"]["run"]
    for x, y in zip(a["rng"]["agents"], b["rng"]["agents"], strict=True):
        assert torch.equal(x, y)


def test_a_reward_that_raises_at_step_4_leaves_step_3_which_resumes_to_the_unbroken_run(
    tiny_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """save_every=0 (the default): an exception in step 4 of 8 writes the checkpoint of
    step 3 as Ctrl-C would, the exception says where and how to resume, and the resumed
    run (reward fixed) gives exactly the rows of a run that never failed: the failed
    step's batch and random draws were put back before the checkpoint."""
    want = _trainer(tiny_tokenizer, tmp_path / "full", num_steps=8).train()
    completed: list[int] = [0]

    def buggy(c1: list[str], c2: list[str]) -> list[float]:
        if completed[0] == 3:  # in step 4
            raise ZeroDivisionError("a rare branch of the reward")
        return _length_reward(c1, c2)

    out = tmp_path / "run"
    broken = _trainer(tiny_tokenizer, out, num_steps=8, reward=buggy)
    step = group_baseline.GroupBaselineRecipe.step

    def counting_step(run):  # type: ignore[no-untyped-def]
        completed[0] = run.global_step
        return step(run)

    monkeypatch.setattr(group_baseline.GroupBaselineRecipe, "step", counting_step)
    with pytest.raises(RewardFunctionError, match="a rare branch") as caught:
        broken.train()
    monkeypatch.undo()
    saved = out / "checkpoints" / "step-000003"
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert f"step 3 (the last completed step) was saved: {saved}" in notes, notes
    assert f"comlrl train --resume {out}" in notes
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000003"]
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1, 2, 3]
    assert ckpt.latest_checkpoint(out) == saved

    fixed = _trainer(tiny_tokenizer, out, num_steps=8)
    assert fixed.resume(saved) == 3
    got = fixed.train()
    assert [r["step"] for r in got] == [4, 5, 6, 7, 8]
    for g, w in zip(got, want[3:], strict=True):
        for key in ("reward_mean", "loss/agent_0", "loss/agent_1", "grad_norm/agent_0"):
            assert g[key] == w[key], (g["step"], key, g[key], w[key])
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == list(range(1, 9))


def test_a_failure_in_the_first_step_saves_nothing_and_says_so(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    def broken_reward(c1: list[str], c2: list[str]) -> list[float]:
        raise KeyError("answer")

    out = tmp_path / "run"
    with pytest.raises(RewardFunctionError) as caught:
        _trainer(tiny_tokenizer, out, reward=broken_reward).train()
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "no step checkpoint to resume from" in notes and "--resume" not in notes, notes
    assert not (out / "checkpoints").exists()


def test_the_refusal_of_a_used_folder_names_only_a_checkpoint_that_exists(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    _trainer(tiny_tokenizer, out, num_steps=1).train()  # save_every=0: final/, no checkpoint
    with pytest.raises(ConfigError) as caught:
        _trainer(tiny_tokenizer, out, num_steps=1).train()
    assert "no step checkpoint to resume from" in str(caught.value)
    assert "trainer.resume" not in str(caught.value), str(caught.value)
    text = used_output_dir_message(out, ["metrics.jsonl"], api=False)
    assert "--resume" not in text and "--overwrite" in text
    _trainer(tiny_tokenizer, out, num_steps=2, save_every=1).train(overwrite=True)
    text = used_output_dir_message(out, ["metrics.jsonl"], api=False)
    newest = out / "checkpoints" / "step-000002"
    assert f"({newest}) with: comlrl train --resume {out}" in text, text


def test_resume_without_the_optimizer_state_would_differ(tiny_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The exactness above is not vacuous: with fresh (empty) Adam moments instead of the
    saved ones, step 3 samples the same completions but step 4's losses differ."""
    want = _trainer(tiny_tokenizer, tmp_path / "full", save_every=2, optimizer="adamw").train()
    saved = tmp_path / "full" / "checkpoints" / "step-000002"
    state = ckpt.load_training_state(saved)
    fresh = _trainer(tiny_tokenizer, tmp_path / "other", optimizer="adamw")
    state["optimizers"] = [o.state_dict() for o in fresh.optimizers]
    for i, agent in enumerate(fresh.agents):
        ckpt.load_agent_weights(agent.model, saved / f"agent_{i}")
    fresh.global_step = ckpt.restore_state(
        state,
        optimizers=fresh.optimizers,
        data=fresh.data,
        rng=fresh.rng,
        generators=[a.generator for a in fresh.agents],
    )
    row3, row4 = fresh.step().row, fresh.step().row
    fresh.close()
    assert (
        row3["reward_mean"] == want[2]["reward_mean"]
        and row3["loss/agent_0"] == want[2]["loss/agent_0"]
    )
    assert (row4["loss/agent_0"], row4["loss/agent_1"]) != (
        want[3]["loss/agent_0"],
        want[3]["loss/agent_1"],
    )


def test_a_failed_save_leaves_no_step_folder_and_is_cleaned_up(
    tiny_tokenizer, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    trainer = _trainer(tiny_tokenizer, tmp_path / "run")
    trainer.step()

    def broken_save(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        trainer.checkpoint()
    monkeypatch.undo()
    root = tmp_path / "run" / "checkpoints"
    assert not (root / "step-000001").exists() and ckpt.latest_checkpoint(tmp_path / "run") is None
    assert [p.name for p in root.iterdir()] == [f".step-000001.tmp-{os.getpid()}"]
    (root / ".reward_model.tmp-123").mkdir()  # MARLHF's reward model, half written
    (root / "reward_model").mkdir()  # a complete one stays
    assert len(ckpt.clean_partial_checkpoints(tmp_path / "run")) == 2
    assert [p.name for p in root.iterdir()] == ["reward_model"]
    (root / "reward_model").rmdir()
    with pytest.raises(ckpt.CheckpointError, match="not a complete step checkpoint"):
        ckpt.load_training_state(root / "step-000001")
    trainer.close()


def test_keep_last_prunes_old_step_checkpoints_but_never_final(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    _trainer(tiny_tokenizer, tmp_path / "run", save_every=1, keep_last=2).train()
    steps = [s for s, _ in ckpt.list_checkpoints(tmp_path / "run")]
    assert steps == [3, 4]
    assert json.loads((tmp_path / "run" / "final" / ckpt.META_FILE).read_text())["step"] == 4
    assert (tmp_path / "run" / "final" / "agent_1" / "config.json").is_file()


def test_prune_spares_the_folder_just_written(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        p = ckpt.step_checkpoint_path(tmp_path, step)
        p.mkdir(parents=True)
        (p / ckpt.STATE_FILE).write_bytes(b"x")
        ckpt.write_meta(p, step)
    (tmp_path / "checkpoints" / ".step-000004.tmp-1").mkdir()
    deleted = ckpt.prune_checkpoints(tmp_path, 1, keep=ckpt.step_checkpoint_path(tmp_path, 2))
    assert [p.name for p in deleted] == ["step-000001"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        ".step-000004.tmp-1",
        "step-000002",
        "step-000003",
    ]
    with pytest.raises(ValueError, match="keep_last must be >= 1, got 0"):
        ckpt.prune_checkpoints(tmp_path, 0)


def test_cpu_state_dict_is_a_copy_that_later_training_does_not_change() -> None:
    layer = torch.nn.Linear(3, 2)
    saved = ckpt.cpu_state_dict(layer)
    assert set(saved) == {"weight", "bias"}
    assert all(t.device.type == "cpu" and not t.requires_grad for t in saved.values())
    before = saved["weight"].clone()
    with torch.no_grad():
        layer.weight.add_(1.0)  # a CPU module: a plain .to("cpu") would alias its storage
    torch.testing.assert_close(saved["weight"], before, rtol=0, atol=0)
    assert not torch.equal(saved["weight"], layer.weight)


def test_data_stream_state_round_trips_mid_epoch() -> None:
    a = DataStream(list(range(7)), seed=3)
    a.next_batch(5)
    b = DataStream(list(range(7)), seed=99)
    b.load_state_dict(a.state_dict())
    assert a.next_batch(12) == b.next_batch(12) and a.epoch == b.epoch == 3
    with pytest.raises(ValueError, match="over 7 examples but the dataset now has 6"):
        DataStream(list(range(6))).load_state_dict(a.state_dict())


def test_truncate_jsonl_drops_later_rows_and_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        '{"step": 1}\n{"step": 2, "x": 1}\n{"other": true}\n{"step": 3}\n{"step": 4, "x"'
    )
    assert truncate_jsonl(log, 2) == 2  # step 3 and the torn line
    assert log.read_text() == '{"step": 1}\n{"step": 2, "x": 1}\n{"other": true}\n'
    assert truncate_jsonl(log, 2) == 0 and truncate_jsonl(tmp_path / "missing.jsonl", 1) == 0
    log.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        truncate_jsonl(log, 1)


def test_resume_allows_only_settings_that_do_not_change_the_steps(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(TrainConfig(output_dir="/elsewhere", learning_rate=1e-5).model_dump())
    )
    cfg = resume_config(tmp_path, ["num_steps=50", "eval_every=5", "keep_last=3"])
    assert (cfg.num_steps, cfg.eval_every, cfg.output_dir) == (50, 5, str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"cannot change learning_rate \(run: 1e-05, asked: 0.1\)"
    ):
        resume_config(tmp_path, ["learning_rate=0.1", "num_steps=50"])
    with pytest.raises(ConfigError, match="task"):
        resume_config(tmp_path, ["task.kwargs.limit=3"])
    with pytest.raises(ConfigError, match="has no config.yaml"):
        resume_config(tmp_path / "nope", [])


def test_outputs_of_an_earlier_run_are_found_and_cleared_alone(tmp_path: Path) -> None:
    assert existing_run_outputs(tmp_path) == []
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    assert existing_run_outputs(tmp_path) == [], "a lone config.yaml is not a run"
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "checkpoints" / "step-000001").mkdir(parents=True)
    (tmp_path / "mine.txt").write_text("keep")
    assert existing_run_outputs(tmp_path) == ["metrics.jsonl", "checkpoints"]
    assert clear_run_outputs(tmp_path) == ["metrics.jsonl", "config.yaml", "checkpoints"]
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_first_ctrl_c_asks_to_stop_the_second_stops_now() -> None:
    # the handler in force before (Python's default, or SIG_IGN where the test process was
    # started in the background) comes back afterwards
    before = signal.getsignal(signal.SIGINT)
    with StopAtStepBoundary() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between bytecodes of the main thread
            if stop.requested:
                break
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
    assert signal.getsignal(signal.SIGINT) is before


def test_resuming_on_other_data_is_refused_with_both_sizes(tiny_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _trainer(tiny_tokenizer, tmp_path / "run", save_every=1, num_steps=1).train()
    other = _trainer(tiny_tokenizer, tmp_path / "run")
    other.data.dataset = DATA[:4]
    with pytest.raises(ckpt.CheckpointError, match="over 5 examples but the dataset now has 4"):
        other.resume(tmp_path / "run" / "checkpoints" / "step-000001")
    other.close()


def test_atomic_folder_replaces_only_a_complete_folder(tmp_path: Path) -> None:
    from comlrl.algos.training.run.saving import atomic_folder

    target = tmp_path / "reward_model"
    with atomic_folder(target) as tmp:
        (tmp / "a.txt").write_text("one")
    assert (target / "a.txt").read_text() == "one"
    with pytest.raises(OSError, match="disk full"):
        with atomic_folder(target) as tmp:
            (tmp / "a.txt").write_text("two")
            raise OSError("disk full")
    assert (target / "a.txt").read_text() == "one"  # the old folder is untouched
    assert ckpt.clean_partial_checkpoints(tmp_path) == []  # not under checkpoints/
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".reward_model.tmp-{os.getpid()}",
        "reward_model",
    ]
    with atomic_folder(target) as tmp:
        (tmp / "b.txt").write_text("three")
    assert [p.name for p in target.iterdir()] == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["reward_model"]
