"""CoMLRL 1.4.3's checkpoint arguments on the compat preference trainers (MADPO, MARLHF,
MADPOIter, MARLHFIter): ``train(checkpoint_dir=...)`` killed inside an epoch (a round),
then ``train(resume_from_checkpoint=...)`` in a freshly built trainer, equals the
uninterrupted run.

Tolerance: exact (``torch.equal``, rows compared with ``==``). The resumed run gets back
every input of its next step (weights, AdamW moments and step counts, the preference pairs
or the fitted reward model, the shuffle and data cursors, torch's/Python's/NumPy's global
streams and each agent's sampling generator), and on one CPU the same kernels on the same
inputs in the same order give the same bits; a tolerance would hide a stream that was not
restored (a missed one changes the sampled completions or the pair order, so whole steps).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from comlrl.trainers.preference import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

PROMPTS = ["Once upon a time", "The cat sat", "Lily had a red", "Tom went to the"]
_TIMED = ("time/", "tokens_per_s", "prompts_per_s")


class _Stop(RuntimeError):
    """Raised from the W&B hook to kill a run after a given number of logged steps."""


def _letters(c1: list[str], c2: list[str]) -> list[float]:
    return [(b.count("e") - a.count("e") + len(a) % 3) / 4 for a, b in zip(c1, c2)]


_COMMON = {"num_turns": 1, "num_train_epochs": 3, "max_new_tokens": 6,
           "agent_learning_rate": 1e-3, "rollout_buffer_size": 2, "train_batch_size": 2,
           "eval_interval": 0, "preference_num_candidates": 3,
           "preference_pairs_per_sample": 2}  # fmt: skip


def _madpo(model: str) -> MADPOTrainer:
    torch.manual_seed(0)
    return MADPOTrainer(agent_model=model, num_agents=2, reward_func=_letters,
                        train_dataset=[{"prompt": p} for p in PROMPTS],
                        args=MADPOConfig(**_COMMON))  # fmt: skip


def _marlhf(model: str, rl: str = "magrpo") -> MARLHFTrainer:
    torch.manual_seed(0)
    args = MARLHFConfig(**_COMMON, num_generations=2, rl_algorithm=rl,
                        reward_model_name=model, reward_num_train_epochs=2,
                        reward_train_batch_size=2, reward_learning_rate=1e-3,
                        reward_model_device="cpu")  # fmt: skip
    return MARLHFTrainer(agent_model=model, num_agents=2, reward_func=_letters,
                         train_dataset=[{"prompt": p} for p in PROMPTS], args=args)  # fmt: skip


def _kill_after(target: Any, steps: int) -> None:
    """Make ``target._wandb_log`` raise :class:`_Stop` at the ``steps + 1``-th step row
    (after that step's optimizer update: the live weights fit no saved cursor)."""
    seen = {"n": 0}

    def log(row: dict[str, Any]) -> None:
        if "step" in row:
            seen["n"] += 1
            if seen["n"] > steps:
                raise _Stop(f"killed after {steps} steps")

    target._wandb_log = log


def _untimed(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if not k.startswith(_TIMED)} for r in rows]


def _assert_same_state(left: Any, right: Any) -> None:
    for a, b in zip(left.agents, right.agents, strict=True):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert torch.equal(x, y), name
    for oa, ob in zip(left.optimizers, right.optimizers, strict=True):
        sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
        assert sa.keys() == sb.keys() and sa
        for i in sa:
            for key in sa[i]:
                assert torch.equal(torch.as_tensor(sa[i][key]), torch.as_tensor(sb[i][key]))


@pytest.mark.parametrize("k", [1, 2])
def test_madpo_killed_in_epoch_k_plus_1_and_resumed_equals_the_uninterrupted_run(
    stories260k: str, tmp_path: Path, k: int
) -> None:
    whole = _madpo(stories260k)
    np.random.seed(5)
    rows = whole.train()
    numpy_after = np.random.random()
    per_epoch = math.ceil(len(whole.preference_pairs) / 2)
    assert per_epoch >= 2 and len(rows) == 3 * per_epoch  # the kill lands inside an epoch

    killed = _madpo(stories260k)
    _kill_after(killed, k * per_epoch + 1)
    np.random.seed(5)
    with pytest.raises(_Stop):
        killed.train(checkpoint_dir=tmp_path / "run")
    # checkpoint-1: the pairs (epoch 0), then one per completed epoch
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        f"checkpoint-{i}" for i in range(1, k + 2)
    ]
    with pytest.raises(RuntimeError, match="epoch boundary"):
        killed.save_checkpoint(tmp_path / "mid-epoch")

    resumed = _madpo(stories260k)
    resumed._build_pairs = lambda: pytest.fail("a resume must not rebuild the pairs")  # type: ignore[method-assign]
    np.random.seed(99)
    torch.manual_seed(99)
    rest = resumed.train(resume_from_checkpoint=tmp_path / "run" / f"checkpoint-{k + 1}")

    assert _untimed(rest) == _untimed(rows[k * per_epoch :])
    assert [p.to_state() for p in resumed.preference_pairs] == [
        p.to_state() for p in whole.preference_pairs
    ]
    _assert_same_state(resumed, whole)
    assert resumed.env_step == whole.env_step
    assert np.random.random() == numpy_after
    assert resumed._checkpoint_progress == {
        "kind": "madpo", "epoch": 3, "updates_seen": 3 * per_epoch, "complete": True
    }  # fmt: skip


@pytest.mark.parametrize(
    ("rl", "boundary"), [("magrpo", "reward"), ("magrpo", "rl_epoch_1"), ("iac", "rl_epoch_1")]
)
def test_marlhf_killed_in_the_rl_stage_and_resumed_equals_the_uninterrupted_run(
    stories260k: str, tmp_path: Path, rl: str, boundary: str
) -> None:
    whole = _marlhf(stories260k, rl)
    np.random.seed(5)
    rows = whole.train()
    numpy_after = np.random.random()
    assert len(rows) == 6  # 3 epochs x 4 prompts / 2 per step

    killed = _marlhf(stories260k, rl)
    done = 0 if boundary == "reward" else 2
    _kill_after(killed.rl_trainer, done + 1)
    np.random.seed(5)
    with pytest.raises(_Stop):
        killed.train(checkpoint_dir=tmp_path / "run")
    # checkpoint-1: the fitted reward model, then one per completed RL epoch
    last = tmp_path / "run" / f"checkpoint-{1 + done // 2}"
    assert sorted(p.name for p in (tmp_path / "run").iterdir())[-1] == last.name

    resumed = _marlhf(stories260k, rl)
    resumed._preference.collect_pairs = lambda: pytest.fail("pairs collected again")
    resumed._preference.train_reward_model = lambda: pytest.fail("reward model refitted")
    np.random.seed(99)
    torch.manual_seed(99)
    rest = resumed.train(resume_from_checkpoint=last)

    assert _untimed(rest) == _untimed(rows[done:])
    _assert_same_state(resumed.rl_trainer, whole.rl_trainer)
    for (name, x), (_, y) in zip(
        resumed.reward_model.state_dict().items(), whole.reward_model.state_dict().items()
    ):
        assert torch.equal(x, y), name
    assert resumed.reward_model_history == whole.reward_model_history
    assert resumed.rl_trainer.env_step == whole.rl_trainer.env_step == 24
    assert np.random.random() == numpy_after
    kind = "magrpo" if rl == "magrpo" else "actor_critic"
    assert resumed._checkpoint_progress == {
        "kind": "marlhf", "phase": "complete", "rl": {"kind": kind, "epoch": 3}
    }  # fmt: skip


def test_a_missing_checkpoint_folder_fails_before_any_training(
    stories260k: str, tmp_path: Path
) -> None:
    trainer = _madpo(stories260k)
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        trainer.train(resume_from_checkpoint=tmp_path / "nowhere" / "checkpoint-3")
    assert trainer.preference_pairs == []
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.agents[0].parameters()))


def test_a_checkpoint_of_another_trainer_type_fails_before_any_training(
    stories260k: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    magrpo = MAGRPOTrainer(
        agent_model=stories260k, num_agents=2, reward_func=_letters,
        train_dataset=[{"prompt": p} for p in PROMPTS],
        args=MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=2,
                          max_new_tokens=4, rollout_buffer_size=4, eval_interval=0),
    )  # fmt: skip
    magrpo.train(checkpoint_dir=tmp_path / "magrpo")
    madpo = _madpo(stories260k)
    madpo.train(checkpoint_dir=tmp_path / "madpo", checkpoint_interval=100)
    for trainer, other in (
        (_madpo(stories260k), tmp_path / "magrpo" / "checkpoint-1"),
        (_marlhf(stories260k), tmp_path / "madpo" / "checkpoint-1"),
    ):
        model = trainer.agents[0]
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(ValueError, match="was written by comlrl.trainers"):
            trainer.train(resume_from_checkpoint=other)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert trainer.preference_pairs == []


@pytest.mark.parametrize(
    ("progress", "error"),
    [([1], "checkpoint progress must be a dict, got \\[1\\]"),
     ({"kind": "marlhf", "phase": "complete"}, "holds no madpo epoch cursor: .*marlhf")],
)  # fmt: skip
def test_a_cursor_of_another_shape_or_trainer_is_refused_naming_it(
    progress: Any, error: str
) -> None:
    from comlrl.trainers.preference._checkpoints_hooks143 import check_cursor

    assert check_cursor({}, "madpo", "madpo epoch cursor") is False  # nothing trained yet
    assert check_cursor({"kind": "madpo", "epoch": 0}, "madpo", "madpo epoch cursor") is True
    with pytest.raises(ValueError, match=error):
        check_cursor(progress, "madpo", "madpo epoch cursor")


def _iterative(model: str, cls: type, tmp: Path) -> Any:
    from comlrl.trainers.preference import (
        MADPOIterConfig,
        MADPOIterTrainer,
        MARLHFIterConfig,
    )

    torch.manual_seed(0)
    fields = {**_COMMON, "num_train_epochs": 1, "num_iterations": 3,
              "comparator_policy": "history", "comparator_history_k": 1,
              "preference_replay_mode": "all_history", "preference_replay_sample_size": 4,
              "preference_replay_dir": str(tmp / "replay"), "pair_selection": "reward_gap"}  # fmt: skip
    if cls is MADPOIterTrainer:
        args: Any = MADPOIterConfig(**fields)
    else:
        args = MARLHFIterConfig(**fields, num_generations=2, rl_algorithm="magrpo",
                                reward_model_name=model, reward_num_train_epochs=1,
                                reward_train_batch_size=2, reward_learning_rate=1e-3,
                                reward_model_device="cpu",
                                preference_scoring_reward="reward_model")  # fmt: skip
    return cls(agent_model=model, num_agents=2, reward_func=_letters,
               train_dataset=[{"prompt": p} for p in PROMPTS], args=args)  # fmt: skip


@pytest.mark.parametrize("name", ["MADPOIterTrainer", "MARLHFIterTrainer"])
def test_iterative_killed_in_round_3_and_resumed_equals_the_uninterrupted_run(
    stories260k: str, tmp_path: Path, name: str
) -> None:
    import comlrl.trainers.preference as preference

    cls = getattr(preference, name)
    whole = _iterative(stories260k, cls, tmp_path / "whole")
    np.random.seed(5)
    rows = whole.train()
    numpy_after = np.random.random()
    assert {r["iteration"] for r in rows} == {1.0, 2.0, 3.0}  # every round trained

    killed = _iterative(stories260k, cls, tmp_path / "killed")
    finish = killed.rounds.finish

    def finish_then_die(r: int) -> None:
        finish(r)
        if r == 2:  # round 3 trained and snapshot, not committed
            raise _Stop("killed in round 3")

    killed.rounds.finish = finish_then_die
    np.random.seed(5)
    with pytest.raises(_Stop):
        killed.train(checkpoint_dir=tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint-1", "checkpoint-2"]

    resumed = _iterative(stories260k, cls, tmp_path / "killed")  # the replay shards are there
    np.random.seed(99)
    torch.manual_seed(99)
    rest = resumed.train(resume_from_checkpoint=tmp_path / "run" / "checkpoint-2")

    assert _untimed(rest) == _untimed([r for r in rows if r["iteration"] == 3.0])
    assert resumed.round_history == whole.round_history
    if name == "MADPOIterTrainer":
        _assert_same_state(resumed, whole)
        assert resumed.env_step == whole.env_step
    else:
        _assert_same_state(resumed.rl_trainer, whole.rl_trainer)
        assert resumed.rl_trainer.env_step == whole.rl_trainer.env_step
        assert resumed.reward_model_history == whole.reward_model_history
        for (key, x), (_, y) in zip(
            resumed.reward_model.state_dict().items(), whole.reward_model.state_dict().items()
        ):
            assert torch.equal(x, y), key
    assert np.random.random() == numpy_after
    assert resumed._checkpoint_progress["iteration"] == 3
