"""The CoMLRL 1.4.3-hook forms of MADPO's and MARLHF's checkpointed loops
(:mod:`comlrl.trainers.preference._checkpoints`), for a trainer assembled by hand whose
state is attributes (models, optimizers) and whose steps are 1.4.3's hooks: MADPO
(``_build_preference_dataset()``, ``_update_from_preference_batch(batch)``), MARLHF
(``_build_preference_dataset()``, ``_init_reward_model()``, ``_train_reward_model(pairs)``,
then per RL epoch ``get_train_dataloader()``, ``_train_step_returns(item)``,
``_drain_ready_buffers(agents)``). Its checkpoints are attribute snapshots
(:mod:`comlrl.utils._trainer_snapshot`) whose cursor is checked before anything is
restored; the cursors are the ones our trainers commit (MADPO's also holds the pairs).
As 1.4.3, a train() without ``checkpoint_dir`` keeps no pairs, so such a trainer then
refuses ``save_checkpoint``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "MADPOHookCheckpoints143",
    "MARLHFHookCheckpoints143",
    "check_count",
    "start_logger_quietly",
]


def check_cursor(progress: Any, kind: str, cursor: str) -> bool:
    """Whether ``progress`` (a checkpoint's cursor) is a started cursor of ``kind``: False
    for ``{}`` (nothing trained yet), True for a mapping whose ``kind`` is ``kind``.

    Args:
        cursor: what such a cursor is called in the error (``"madpo epoch cursor"``).

    Raises:
        ValueError: ``progress`` is not a mapping, or is another trainer's cursor.
    """
    if not isinstance(progress, Mapping):
        raise ValueError(f"checkpoint progress must be a dict, got {progress!r}")
    if not progress:
        return False
    if progress.get("kind") != kind:
        raise ValueError(f"the checkpoint holds no {cursor}: {dict(progress)!r}")
    return True


def check_count(progress: Mapping[str, Any], key: str, high: int, kind: str) -> int:
    """``progress[key]`` as an int in ``[0, high]``.

    Raises:
        ValueError: the key is missing, not an int (``True``, ``"1"``, ``0.5``) or out of range.
    """
    if key not in progress:
        raise ValueError(f"Incomplete {kind} checkpoint cursor {dict(progress)!r}: no {key!r}")
    value = progress[key]
    if type(value) is not int or not 0 <= value <= high:
        raise ValueError(
            f"{kind} checkpoint cursor {key}={value!r} must be an int between 0 and {high}"
        )
    return value


def start_logger_quietly(trainer: Any) -> None:
    """Start the W&B run of a trainer on 1.4.3's hooks that has none yet (a resumed one)
    without moving a global random stream."""
    from comlrl.utils._trainer_snapshot import global_rng, set_global_rng

    if trainer.__dict__.get("wandb_config") is None or trainer.__dict__.get("wandb_initialized"):
        return
    streams = global_rng()
    try:
        trainer._init_wandb()
    finally:
        set_global_rng(streams)


class MADPOHookCheckpoints143:
    """MADPO's loop on 1.4.3's hooks and its snapshot cursor check."""

    args: Any
    env_step: int
    _checkpoint_start_epoch: Any
    _checkpoint_save_blocked: bool
    _checkpoint_progress: dict[str, Any]

    def _checkpoint_validate_progress(self, state: Mapping[str, Any]) -> int:
        """The cursor check of an attribute snapshot (a trainer on 1.4.3's hooks, whose
        cursor holds its pairs), before anything is restored.

        Raises:
            ValueError: as :meth:`_checkpoint_start_epoch`, or no ``preference_pairs``.
        """
        progress = state["progress"]
        epoch = self._checkpoint_start_epoch(progress)
        if progress and not isinstance(progress.get("preference_pairs"), list):
            raise ValueError(
                f"Incomplete madpo checkpoint cursor: no preference_pairs in {sorted(progress)}"
            )
        return epoch

    def _madpo_hook_epochs(self) -> list[dict[str, float]]:
        """The loop of a trainer on 1.4.3's hooks (``_build_preference_dataset()``,
        ``_update_from_preference_batch(batch)``, ``evaluate``; models and optimizers as
        attributes, checkpointed as an attribute snapshot): the pairs ride in the cursor,
        each epoch's order is ``torch.randperm`` on the global stream. Returns ``[]``."""
        import torch

        a = self.args
        start_logger_quietly(self)
        self._checkpoint_untracked_preference = False
        progress = dict(self.__dict__.get("_checkpoint_progress") or {})
        total = int(a.num_train_epochs)
        if not progress:
            pairs = list(self._build_preference_dataset())  # type: ignore[attr-defined]
            progress = {"kind": "madpo", "epoch": 0, "updates_seen": 0,
                        "preference_pairs": pairs, "complete": not pairs}  # fmt: skip
            self._checkpoint_commit(progress, True)  # type: ignore[attr-defined]
        if progress["complete"]:
            return []
        pairs, updates = list(progress["preference_pairs"]), int(progress["updates_seen"])
        batch, every = int(a.train_batch_size), int(getattr(a, "eval_interval", 0) or 0)
        for epoch in range(int(progress["epoch"]), total):
            self._checkpoint_save_blocked = True
            order = torch.randperm(len(pairs)).tolist()
            for start in range(0, len(order), batch):
                if every > 0 and updates % every == 0:
                    self.evaluate(num_eval_samples=int(a.eval_num_samples))  # type: ignore[attr-defined]
                self._update_from_preference_batch([pairs[i] for i in order[start : start + batch]])  # type: ignore[attr-defined]
                updates += 1
                n = len(order[start : start + batch])
                self.env_step += (
                    int(a.environment_steps_per_pair) * n if a.use_environment_step else 1
                )
            done = epoch + 1
            self._checkpoint_commit(  # type: ignore[attr-defined]
                {"kind": "madpo", "epoch": done, "updates_seen": updates,
                 "preference_pairs": pairs, "complete": done == total},
                done == total,
            )  # fmt: skip
        if self.__dict__.get("_checkpoint_dir") is None:  # 1.4.3 keeps no pairs then
            self._checkpoint_progress = {
                k: v for k, v in self._checkpoint_progress.items() if k != "preference_pairs"
            }
            self._checkpoint_untracked_preference = True
        return []


class MARLHFHookCheckpoints143:
    """MARLHF's stages on 1.4.3's hooks and its snapshot cursor check."""

    args: Any
    reward_model: Any
    reward_optimizer: Any
    _checkpoint_start_epoch: Any
    _checkpoint_save_blocked: bool
    _checkpoint_progress: dict[str, Any]

    def _checkpoint_validate_progress(self, state: Mapping[str, Any]) -> int:
        """The cursor check of an attribute snapshot (a trainer on 1.4.3's hooks), before
        anything is restored; then, as 1.4.3, the reward model a past-the-fit cursor needs
        is built (``_init_reward_model``) and a saved run without a reward optimizer
        leaves none.

        Raises:
            ValueError: as :meth:`_checkpoint_start_epoch`; such a cursor without a saved
                reward model; an actor-critic RL cursor (its nested trainer's snapshot is
                not provided).
        """
        progress = state["progress"]
        epoch = self._checkpoint_start_epoch(progress)
        if not progress:
            return epoch
        if "reward_model" not in state["models"]:
            raise ValueError(
                f"the cursor {dict(progress)!r} needs the fitted reward model, which the "
                "checkpoint does not hold"
            )
        if progress["rl"].get("kind") == "actor_critic":
            raise ValueError(
                "the checkpoint's actor-critic progress needs a nested RL trainer snapshot, "
                "which comlrl.trainers does not write; resume from the reward-phase checkpoint."
            )
        if getattr(self, "reward_model", None) is None:
            self._init_reward_model()  # type: ignore[attr-defined]
        if "reward_optimizer" not in state["optimizers"]:
            self.reward_optimizer = None
        return epoch

    def _marlhf_hook_stages(self) -> list[dict[str, float]]:
        """The stages of a trainer on 1.4.3's hooks (``_build_preference_dataset``,
        ``_init_reward_model``, ``_train_reward_model(pairs)``, then per RL epoch
        ``get_train_dataloader``, ``_train_step_returns(item)``, ``_drain_ready_buffers``;
        checkpointed as an attribute snapshot). Returns ``[]``."""
        a = self.args
        start_logger_quietly(self)
        self._checkpoint_untracked_preference = False
        progress = dict(self.__dict__.get("_checkpoint_progress") or {})
        kind = "actor_critic" if a.rl_algorithm in ("iac", "maac") else "magrpo"
        if not progress:
            pairs = list(self._build_preference_dataset())  # type: ignore[attr-defined]
            self._init_reward_model()  # type: ignore[attr-defined]
            self._train_reward_model(pairs)  # type: ignore[attr-defined]
            progress = {"kind": "marlhf", "phase": "online_rl", "rl": {}}
            self._checkpoint_commit(progress, True)  # type: ignore[attr-defined]
        total, every = int(a.num_train_epochs), int(getattr(a, "eval_interval", 0) or 0)
        if self.reward_model is not None:
            self.reward_model.eval()  # the RL stage scores with it
        for epoch in range(int(progress["rl"].get("epoch", 0)), total):
            if progress["phase"] == "complete":
                break
            self._checkpoint_save_blocked = True
            for index, batch in enumerate(self.get_train_dataloader()):  # type: ignore[attr-defined]
                if every > 0 and index % every == 0:
                    self.evaluate(num_eval_samples=int(a.eval_num_samples))  # type: ignore[attr-defined]
                self._train_step_returns(batch[0])  # type: ignore[attr-defined]
            buffers = getattr(self, "rollout_buffers", None) or []
            self._drain_ready_buffers([i for i, b in enumerate(buffers) if b])  # type: ignore[attr-defined]
            done = epoch + 1
            self._checkpoint_commit(  # type: ignore[attr-defined]
                {"kind": "marlhf", "phase": "complete" if done == total else "online_rl",
                 "rl": {"kind": kind, "epoch": done}},
                done == total,
            )  # fmt: skip
        if self.__dict__.get("_checkpoint_dir") is None:
            self._checkpoint_untracked_preference = True
        return []
