"""CoMLRL 1.4.3's checkpoint API on the compat trainers: ``train(checkpoint_dir=...,
resume_from_checkpoint=...)``, ``save_checkpoint``/``load_checkpoint`` and
``read_checkpoint_metadata``, written in comlrl.algos' step-checkpoint format.

Tolerance: a resumed run is compared with the uninterrupted one *exactly*
(``torch.equal``, i.e. atol = rtol = 0). Resuming restores every input of the next step
(weights, AdamW moments and step counts, the data cursor, torch's/Python's/NumPy's global
streams and each agent's sampling generator), and on one CPU the same kernels on the same
inputs in the same order give the same bits; any tolerance would hide a stream that was
not restored (a missed RNG changes the sampled completions, hence whole rewards).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.utils import read_checkpoint_metadata

PROMPTS = ["Once upon a time", "The cat sat", "Lily had a red", "Tom went to the"]
#: per-step row entries that are timings (they differ between any two runs)
_TIMED = ("time/", "tokens_per_s", "prompts_per_s")


class _Stop(RuntimeError):
    """Raised by the reward function to kill a run mid-training."""


def _letters(c1: list[str], c2: list[str]) -> list[float]:
    return [(b.count("e") - a.count("e")) / 4 for a, b in zip(c1, c2)]


class _CountingReward:
    """A stateful reward (``state_dict``/``load_state_dict``); raises :class:`_Stop` at
    call ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls, self.stop_at = 0, stop_at

    def __call__(self, c1: list[str], c2: list[str]) -> list[float]:
        self.calls += 1
        if self.stop_at is not None and self.calls >= self.stop_at:
            raise _Stop(f"killed at reward call {self.calls}")
        return _letters(c1, c2)

    def state_dict(self) -> dict[str, int]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.calls = int(state["calls"])


def _magrpo(
    model: str, reward: Any = _letters, prompts: list[str] = PROMPTS, **fields: Any
) -> MAGRPOTrainer:
    torch.manual_seed(0)  # the same initial state for every trainer of a test
    args = {"num_turns": 1, "num_train_epochs": 3, "num_generations": 2, "max_new_tokens": 6,
            "agent_learning_rate": 1e-3, "rollout_buffer_size": 2, "eval_interval": 0, **fields}  # fmt: skip
    return MAGRPOTrainer(agent_model=model, num_agents=2, reward_func=reward,
                         train_dataset=[{"prompt": p} for p in prompts], args=MAGRPOConfig(**args))  # fmt: skip


def _untimed(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if not k.startswith(_TIMED)} for r in rows]


def _assert_same_models(left: Any, right: Any) -> None:
    for a, b in zip(left.agents, right.agents, strict=True):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert torch.equal(x, y), name
    for oa, ob in zip(left.optimizers, right.optimizers, strict=True):
        sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
        assert sa.keys() == sb.keys()
        for i in sa:
            for key in sa[i]:
                assert torch.equal(torch.as_tensor(sa[i][key]), torch.as_tensor(sb[i][key])), (
                    i,
                    key,
                )


@pytest.mark.parametrize("k", [1, 2])
def test_magrpo_killed_after_epoch_k_and_resumed_equals_the_uninterrupted_run(
    stories260k: str, tmp_path: Path, k: int
) -> None:
    whole = _magrpo(stories260k, _CountingReward())
    np.random.seed(5)
    rows = whole.train()
    numpy_after = np.random.random()
    assert len(rows) == 6  # 3 epochs x 4 prompts / 2 per step
    start = [p.detach().clone() for p in _magrpo(stories260k).agents[0].parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(start, whole.agents[0].parameters()))

    # killed in epoch k + 1 (a step's 2 prompts x 2 samples = 4 reward calls)
    killed = _magrpo(stories260k, _CountingReward(stop_at=8 * k + 3))
    np.random.seed(5)
    with pytest.raises(Exception, match="killed at reward call"):  # wrapped by the reward adapter
        killed.train(checkpoint_dir=tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        f"checkpoint-{i}" for i in range(1, k + 1)
    ]
    with pytest.raises(RuntimeError, match="epoch boundary"):
        killed.save_checkpoint(tmp_path / "mid-epoch")  # weights of no saved cursor

    reward = _CountingReward()
    resumed = _magrpo(stories260k, reward)
    np.random.seed(99)  # every stream comes back from the checkpoint, none is reseeded
    torch.manual_seed(99)
    rest = resumed.train(resume_from_checkpoint=tmp_path / "run" / f"checkpoint-{k}")

    assert _untimed(rest) == _untimed(rows[2 * k :])
    _assert_same_models(resumed, whole)
    assert resumed.env_step == whole.env_step == 24  # joint actions scored: 6 steps x 2 x 2
    assert reward.calls == 24  # the callback's own state came back (8 per epoch)
    assert np.random.random() == numpy_after
    assert resumed._checkpoint_progress == {"kind": "magrpo", "epoch": 3}


def test_interval_and_total_limit_choose_the_folders_kept(stories260k: str, tmp_path: Path) -> None:
    _magrpo(stories260k).train(checkpoint_dir=tmp_path / "a", checkpoint_interval=2)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["checkpoint-2", "checkpoint-3"]
    _magrpo(stories260k).train(checkpoint_dir=tmp_path / "b", checkpoint_total_limit=1)
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["checkpoint-3"]
    meta = read_checkpoint_metadata(tmp_path / "b" / "checkpoint-3")
    assert meta["trainer_class"] == "comlrl.trainers.reinforce.MAGRPOTrainer"
    assert meta["sequence"] == 3 and meta["version"] == 1 and meta["wandb"] is None
    assert len(meta["run_id"]) == 32
    folder = tmp_path / "b" / "checkpoint-3"  # comlrl.algos' step-checkpoint layout
    assert {p.name for p in folder.iterdir()} == {
        "agent_0",
        "agent_1",
        "training_state.pt",
        "checkpoint.json",
    }
    torch.load(folder / "training_state.pt", weights_only=True)  # no pickled code


@pytest.mark.parametrize("bad", [True, 1.0, 0, -1, "1"])
def test_a_bad_checkpoint_interval_fails_before_training(bad: Any) -> None:
    trainer = MAGRPOTrainer.__new__(MAGRPOTrainer)  # nothing else is read before the check
    with pytest.raises(ValueError, match="checkpoint_interval must be a positive integer"):
        trainer.train(checkpoint_interval=bad)
    with pytest.raises(ValueError, match="checkpoint_total_limit"):
        trainer.train(checkpoint_total_limit=0)


def test_resume_refuses_a_checkpoint_that_does_not_fit_before_changing_anything(
    stories260k: str, tmp_path: Path
) -> None:
    source = _magrpo(stories260k, num_train_epochs=1)
    source.train(checkpoint_dir=tmp_path)
    other = _magrpo(stories260k, num_train_epochs=1, agent_learning_rate=2e-3)
    before = [p.detach().clone() for p in other.agents[0].parameters()]
    with pytest.raises(ValueError, match="differs in agent_learning_rate"):
        other.train(resume_from_checkpoint=tmp_path / "checkpoint-1")
    assert all(torch.equal(a, b) for a, b in zip(before, other.agents[0].parameters()))
    assert other._base_run().step == 0
    changed = _magrpo(stories260k, prompts=[*PROMPTS[:3], "A dog"], num_train_epochs=1)
    with pytest.raises(ValueError, match="train_dataset differs"):
        changed.train(resume_from_checkpoint=tmp_path / "checkpoint-1")
    # a longer run may resume a shorter one's last checkpoint (num_train_epochs may change)
    longer = _magrpo(stories260k, num_train_epochs=2)
    assert len(longer.train(resume_from_checkpoint=tmp_path / "checkpoint-1")) == 2
    with pytest.raises(FileExistsError, match="checkpoint-1"):
        _magrpo(stories260k, num_train_epochs=1).train(checkpoint_dir=tmp_path)
    foreign = tmp_path / "foreign"  # neither ours nor CoMLRL 1.4.3's
    foreign.mkdir()
    torch.save({"format": 1, "step": 3}, foreign / "training_state.pt")
    with pytest.raises(ValueError, match="not a checkpoint comlrl.trainers"):
        longer.load_checkpoint(foreign)
    torch.save({"__kind__": "dict", "items": []}, foreign / "training_state.pt")
    with pytest.raises(ValueError, match="a CoMLRL 1.4.3 checkpoint of None"):
        longer.load_checkpoint(foreign)
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        longer.load_checkpoint(tmp_path / "checkpoint-1" / "agent_0")


def test_save_and_load_checkpoint_round_trip_a_finished_run(
    stories260k: str, tmp_path: Path
) -> None:
    done = _magrpo(stories260k, num_train_epochs=1)
    done.train()
    state = torch.get_rng_state()
    done.save_checkpoint(tmp_path / "manual")
    assert torch.equal(torch.get_rng_state(), state)  # saving draws no random numbers
    loaded = _magrpo(stories260k, num_train_epochs=1)
    assert loaded.load_checkpoint(tmp_path / "manual") == {"kind": "magrpo", "epoch": 1}
    _assert_same_models(loaded, done)
    assert loaded.train() == []  # nothing left to train


def test_iac_resumed_after_epoch_1_equals_the_uninterrupted_run(
    stories260k: str, tmp_path: Path
) -> None:
    def iac(reward: Any = _letters) -> IACTrainer:
        torch.manual_seed(0)
        return IACTrainer(agent_model=stories260k, reward_func=reward,
                          train_dataset=[{"prompt": p} for p in PROMPTS],
                          args=IACConfig(num_turns=1, num_train_epochs=2, max_new_tokens=6,
                                         rollout_buffer_size=2, agent_learning_rate=1e-3,
                                         use_separate_critic=False, eval_interval=0))  # fmt: skip

    whole = iac()
    rows = whole.train()
    killed = iac(_CountingReward(stop_at=5))  # in epoch 2 (2 calls per step: 1 sample per prompt)
    with pytest.raises(Exception, match="killed at reward call"):  # wrapped by the reward adapter
        killed.train(checkpoint_dir=tmp_path)
    resumed = iac(_CountingReward())
    rest = resumed.train(resume_from_checkpoint=tmp_path / "checkpoint-1")
    assert _untimed(rest) == _untimed(rows[2:])
    for a, b in zip(resumed.agents, whole.agents, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    for ca, cb in zip(resumed.value_critics, whole.value_critics, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(ca.head.parameters(), cb.head.parameters()))


def _tag_143(value: Any) -> Any:
    """CoMLRL 1.4.3's tagged encoding of a training state (written here by hand, so the
    test needs no 1.4.3 install): dicts, lists and tuples as ``{"__kind__", "items"}``."""
    if isinstance(value, dict):
        return {"__kind__": "dict", "items": [(_tag_143(k), _tag_143(v)) for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return {"__kind__": kind, "items": [_tag_143(v) for v in value]}
    if isinstance(value, np.ndarray):
        return {"__kind__": "numpy", "dtype": value.dtype.str, "shape": list(value.shape),
                "data": value.tobytes()}  # fmt: skip
    return value


def _state_143(trainer: MAGRPOTrainer, epoch: int) -> dict[str, Any]:
    """What CoMLRL 1.4.3's MAGRPOTrainer saves at an epoch boundary (its layout)."""
    import dataclasses
    import random

    def component(objs: list[Any]) -> dict[str, Any]:
        return {"many": True, "classes": [type(o).__qualname__ for o in objs],
                "states": [o.state_dict() for o in objs], "metadata": [{}] * len(objs),
                "training": [None] * len(objs)}  # fmt: skip

    return {
        "version": 1,
        "trainer_class": "comlrl.trainers.reinforce.magrpo.MAGRPOTrainer",
        "config": {
            k: v for k, v in dataclasses.asdict(trainer.args).items() if k != "agent_devices"
        },
        "dataset": {"class": "builtins.list", "length": 4, "fingerprint": None},
        "tokenizers": [],
        "models": {"agents": component(trainer.agents)},
        "optimizers": {"optimizers": component(trainer.optimizers)},
        "schedulers": {},
        "runtime": {
            "env_step": trainer.env_step,
            "_last_train_log_step": -1,
            "rollout_buffers": [[], []],
        },
        "callbacks": {},
        "progress": {"kind": "magrpo", "epoch": epoch},
        "sequence": epoch,
        "run_id": "b" * 32,
        "wandb": None,
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        },
        "rng_devices": {"agents.0": "cpu", "agents.1": "cpu"},
        "extra": None,
    }


def test_a_1_4_3_checkpoint_folder_resumes_its_weights_moments_counters_and_streams(
    stories260k: str, tmp_path: Path
) -> None:
    source = _magrpo(stories260k, num_train_epochs=2)
    source._train_step()  # one epoch by hand: 2 steps of 2 prompts
    source._train_step()
    source.env_step = 8
    folder = tmp_path / "run143" / "checkpoint-1"
    folder.mkdir(parents=True)
    np.random.seed(3)
    torch.save(_tag_143(_state_143(source, epoch=1)), folder / "training_state.pt")
    numpy_next, torch_next = np.random.random(), torch.rand(())

    meta = read_checkpoint_metadata(folder)
    assert meta == {"version": 1, "trainer_class": "comlrl.trainers.reinforce.magrpo.MAGRPOTrainer",
                    "sequence": 1, "run_id": "b" * 32, "wandb": None}  # fmt: skip
    other = _magrpo(stories260k, num_train_epochs=2, discount=0.9)
    before = [p.detach().clone() for p in other.agents[0].parameters()]
    with pytest.raises(ValueError, match="differs in discount"):
        other.load_checkpoint(folder)
    assert all(torch.equal(a, b) for a, b in zip(before, other.agents[0].parameters()))

    resumed = _magrpo(stories260k, num_train_epochs=2)
    np.random.seed(99)
    assert resumed.load_checkpoint(folder) == {"kind": "magrpo", "epoch": 1}
    _assert_same_models(resumed, source)
    assert (resumed._base_run().step, resumed.env_step) == (2, 8)
    assert np.random.random() == numpy_next and torch.equal(torch.rand(()), torch_next)
    rows = resumed.train(resume_from_checkpoint=folder, checkpoint_dir=tmp_path / "ours")
    assert len(rows) == 2 and resumed.env_step == 16  # epoch 2: 2 steps x 4 joint actions
    assert [p.name for p in (tmp_path / "ours").iterdir()] == ["checkpoint-2"]
    assert read_checkpoint_metadata(tmp_path / "ours" / "checkpoint-2")["run_id"] == "b" * 32


class _Run:
    def __init__(self, run_id: str) -> None:
        self.id, self.project, self.entity, self.finished = run_id, "research", "team", False

    def finish(self) -> None:
        self.finished = True


def test_a_resumed_trainer_logs_into_the_checkpoint_wandb_run() -> None:
    from types import SimpleNamespace

    from comlrl.utils._checkpoint_wandb import (
        check_wandb_resume,
        record_wandb_run,
        restore_wandb_identity,
    )

    saved = {"id": "saved-id", "project": "research", "entity": "team"}
    opened = _Run("fresh-id")  # an eager constructor opened its own run
    trainer = SimpleNamespace(wandb_config={"name": "x"}, wandb_initialized=True)
    record_wandb_run(trainer, opened)
    check_wandb_resume(trainer, saved)
    restore_wandb_identity(trainer, saved)
    assert opened.finished and not trainer.wandb_initialized
    assert trainer.wandb_config == {"name": "x", "id": "saved-id", "resume": "allow",
                                    "project": "research", "entity": "team"}  # fmt: skip
    chosen = SimpleNamespace(wandb_config={"id": "mine"}, wandb_initialized=False)
    restore_wandb_identity(chosen, saved)  # the caller's choice wins
    assert chosen.wandb_config == {"id": "mine"}
    external = _Run("external")
    foreign = SimpleNamespace(wandb_config={}, wandb_initialized=True)
    record_wandb_run(foreign, external, previous_run=external)
    with pytest.raises(ValueError, match="external W&B run"):
        check_wandb_resume(foreign, saved)
    assert not external.finished
