"""Checkpoints of CoMLRL 1.4.3's iterative preference trainers (MADPOIter, MARLHFIter):
1.4.3's ``train()`` checkpoint arguments, one commit per round, in ``comlrl.algos``'
step-checkpoint format (:mod:`comlrl.utils.checkpoint` describes the folder;
:mod:`comlrl.trainers.preference._checkpoints` the MADPO and MARLHF parts reused here).

The cursor is ``{"kind": "madpo_iter" | "marlhf_iter", "iteration", "updates_seen",
"total_pairs", "complete"}`` (1.4.3's keys; ``iteration``: rounds finished,
``updates_seen``: optimizer steps taken, ``total_pairs``: pairs generated), committed
after every round (its pairs, its training and the comparator's snapshot), the last one
always written. The trainer's part holds
the rounds (:meth:`~comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds.state_dict`:
the pairing and ordering streams, the round rows, the replay of every round's pairs,
the history comparator's snapshots and its agents' sampling streams); MADPOIter's run
part is MADPO's (agents, AdamW moments, step, every random stream), MARLHFIter's the RL
trainer's run plus the reward model as last fitted (every round refits it from the
initial weights, so its optimizer never outlives a round) and the RL counters.

Not in the folder: the files the run writes elsewhere. A replay kept on disk
(``preference_replay_dir``) is referred to by its shard files, which must still exist
when the run resumes; ``policy_checkpoint_dir`` snapshots are outputs and are not read
back.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from comlrl.trainers.preference._checkpoints_hooks143 import check_count, check_cursor
from comlrl.utils._checkpoint_mixin import TrainingCheckpointMixin

__all__ = ["MADPOIterCheckpoints", "MARLHFIterCheckpoints"]


class _RoundCheckpoints:
    """The round loop with commits and the cursor's check, shared by both trainers."""

    args: Any
    rounds: Any
    _train_rows: list[dict[str, Any]]
    _checkpoint_kind: str

    def _checkpoint_start_epoch(self, progress: Any) -> int:
        """The finished rounds of an iterative cursor (``{}``: none).

        Raises:
            ValueError: another trainer's cursor, or a missing/invalid ``iteration`` or
                ``complete``.
        """
        kind = self._checkpoint_kind
        if not check_cursor(progress, kind, f"{kind} round cursor"):
            return 0
        done = check_count(progress, "iteration", int(self.args.num_iterations), kind)
        for key in ("updates_seen", "total_pairs"):
            check_count(progress, key, 2**62, kind)
        if type(progress.get("complete")) is not bool:
            raise ValueError(f"Incomplete {kind} checkpoint cursor {dict(progress)!r}: 'complete'")
        return done

    def _checkpoint_check(self, section: Mapping[str, Any], where: str) -> None:
        TrainingCheckpointMixin._checkpoint_check(self, section, where)  # type: ignore[arg-type]
        extra = section.get("extra") or {}
        if section["progress"] and not isinstance(extra.get("rounds"), Mapping):
            raise ValueError(
                f"Incomplete {self._checkpoint_kind} checkpoint {where}: it holds a round "
                "cursor but not the rounds' state (replay, comparator, streams)."
            )

    def _updates_seen(self) -> int:
        raise NotImplementedError

    def _run_rounds(self) -> list[dict[str, float]]:
        """``num_iterations`` rounds over every training prompt from the cursor on
        (:meth:`comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds.begin`, the round's
        training, :meth:`~comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds.finish`),
        committing after each."""
        a, rounds = self.args, self.rounds
        progress = dict(self.__dict__.get("_checkpoint_progress") or {})
        start, total = int(progress.get("iteration", 0)), int(a.num_iterations)
        save = self._save_policy if a.policy_checkpoint_dir else None  # type: ignore[attr-defined]
        batch = int(a.train_batch_size or a.rollout_buffer_size)
        history: list[dict[str, float]] = []
        if save is not None and start == 0:
            save("initial")
        for r in range(start, total):
            self._checkpoint_save_blocked = True  # between boundaries from here
            train_pairs, row = rounds.begin(r, self._scoring_env(r), list(self._train_rows), batch)  # type: ignore[attr-defined]
            self._log(row)  # type: ignore[attr-defined]
            if train_pairs:
                history.extend(self._train_round(train_pairs, r))  # type: ignore[attr-defined]
            rounds.finish(r)
            if save is not None:
                save(f"iteration_{r:04d}")
            done = r + 1
            self._checkpoint_commit(  # type: ignore[attr-defined]
                {"kind": self._checkpoint_kind, "iteration": done,
                 "updates_seen": int(self._updates_seen()), "total_pairs": int(rounds.total_pairs),
                 "complete": done == total},
                done == total,
            )  # fmt: skip
        if rounds.total_pairs == 0 and start < total:
            warnings.warn(
                f"{type(self).__name__}: every current/comparator joint action tied under the "
                "reward in every round; no pairs, no training (raise the candidates or the "
                "temperature).",
                stacklevel=3,
            )
        return history


class MADPOIterCheckpoints(_RoundCheckpoints):
    """MADPOIter's part: the rounds (the MADPO run is written by
    :class:`~comlrl.trainers.preference._checkpoints.MADPOCheckpoints`)."""

    _checkpoint_kind = "madpo_iter"

    def _updates_seen(self) -> int:
        return int(self._run.step)  # type: ignore[attr-defined]

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {
            "last_train_log_step": int(self.__dict__.get("_last_train_log_step", -1)),
            "rounds": self.rounds.state_dict(),
        }

    def _checkpoint_load_extra(self, extra: Mapping[str, Any]) -> None:
        self._last_train_log_step = int(extra.get("last_train_log_step", -1))
        self.rounds.load_state_dict(extra["rounds"])


class MARLHFIterCheckpoints(_RoundCheckpoints):
    """MARLHFIter's part: the rounds, the reward model as last fitted and the RL stage's
    counters (its run is written by the RL trainer)."""

    rl_trainer: Any
    reward_model: Any
    reward_model_history: list[dict[str, float]]
    _reward_trained: bool
    _checkpoint_kind = "marlhf_iter"

    def _updates_seen(self) -> int:
        return int(self.rl_trainer._run.step)

    def _checkpoint_extra(self) -> dict[str, Any]:
        from comlrl.algos.training.checkpoint import cpu_state_dict

        rl = self.rl_trainer
        trained = bool(self._reward_trained) and self.reward_model is not None
        return {
            "rl": rl._checkpoint_extra(),
            "rl_env_step": int(rl.env_step),
            "rounds": self.rounds.state_dict(),
            "reward_trained": trained,
            "reward_model": cpu_state_dict(self.reward_model) if trained else None,
            "reward_model_history": [dict(r) for r in self.reward_model_history],
        }

    def _checkpoint_load_extra(self, extra: Mapping[str, Any]) -> None:
        rl = self.rl_trainer
        rl._checkpoint_load_extra(extra.get("rl") or {})
        rl.env_step = int(extra["rl_env_step"])
        self.rounds.load_state_dict(extra["rounds"])
        self.reward_model_history = [dict(r) for r in extra.get("reward_model_history") or []]
        self._reward_trained = bool(extra["reward_trained"])
        if self._reward_trained:
            if self.reward_model is None:  # centralized: built when training starts
                self._fresh_reward_model()  # type: ignore[attr-defined]
            self.reward_model.load_state_dict(dict(extra["reward_model"]), strict=True)
            self.reward_model.eval()

    def _checkpoint_check(self, section: Mapping[str, Any], where: str) -> None:
        super()._checkpoint_check(section, where)
        extra = section.get("extra") or {}
        if (
            section["progress"]
            and extra.get("reward_trained")
            and extra.get("reward_model") is None
        ):
            raise ValueError(
                f"{where}: the checkpoint says the reward model was fitted but holds none"
            )
