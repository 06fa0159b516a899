"""Checkpoints of the CoMLRL 1.4.3 preference trainers (MADPO and MARLHF): 1.4.3's
``train(resume_from_checkpoint=, checkpoint_dir=, checkpoint_interval=,
checkpoint_total_limit=)`` in ``comlrl.algos``' step-checkpoint format
(:mod:`comlrl.utils.checkpoint` describes the folder; the iterative trainers' rounds are
:mod:`comlrl.trainers.preference._iter_checkpoints`).

Each trainer's ``train()`` is one loop that commits a cursor at its boundaries (with
``checkpoint_dir`` a commit writes ``checkpoint-<n>``; without, it is only recorded):

- **MADPO** (``{"kind": "madpo", "epoch", "updates_seen", "complete"}``): once the
  preference pairs are built (epoch 0; always written, as generating them is the
  expensive part), then after every epoch over them. The trainer's part holds the pairs
  (:meth:`~comlrl.algos.recipes.preference.iterative.replay.IterPair.to_state`) and the epoch
  shuffle's stream; the MADPO run's part the agents, AdamW moments, step and every
  random stream (:func:`comlrl.algos.recipes.preference.madpo.recipe.madpo_checkpoint`).
- **MARLHF** (``{"kind": "marlhf", "phase", "rl"}``): once the reward model is fitted
  (``phase="online_rl"``, ``rl={}``; always written), then after every epoch of the RL
  stage (``rl``: the RL trainer's own cursor, ``{"kind": "magrpo" | "actor_critic",
  "epoch"}``), ``phase="complete"`` at the end. The trainer's part holds the fitted
  reward model's weights, its fit rows and the RL trainer's counters and reference
  models; the RL stage's run (agents, critics, optimizers, data cursor, streams) is
  written by the RL trainer. The reward model's optimizer is not saved: the fit builds
  it and drops it, so none exists at any boundary (``reward_optimizer`` stays the one the
  trainer was built with).

A resume is checked whole (class, config, data, callbacks, the cursor's shape, the pairs
or the reward model the cursor needs) before anything changes, and then continues as the
uninterrupted run would have (the pairs and the reward model are not rebuilt). A trainer
assembled by hand on 1.4.3's hooks runs the loops of
:mod:`comlrl.trainers.preference._checkpoints_hooks143` instead.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comlrl.trainers.preference._checkpoints_hooks143 import (
    MADPOHookCheckpoints143,
    MARLHFHookCheckpoints143,
    check_count,
    check_cursor,
)
from comlrl.utils.checkpoint import SECTION, check_checkpoint_options

__all__ = ["MADPOCheckpoints", "MARLHFCheckpoints", "check_count", "start_train"]

_PHASES = ("online_rl", "complete")


def start_train(
    trainer: Any,
    resume_from_checkpoint: str | Path | None,
    checkpoint_dir: str | Path | None,
    checkpoint_interval: Any,
    checkpoint_total_limit: Any,
) -> None:
    """The start of a preference ``train()``: check the options (before anything else, as
    1.4.3), then resume or start a new cursor (:meth:`_checkpoint_begin`).

    Raises:
        ValueError: a bad option, or a checkpoint that does not fit (nothing changes then).
        FileNotFoundError: ``resume_from_checkpoint`` does not exist.
        FileExistsError: ``checkpoint_dir`` holds checkpoints this run would overwrite.
    """
    check_checkpoint_options(checkpoint_interval, checkpoint_total_limit)
    if (
        resume_from_checkpoint is not None
        and not Path(resume_from_checkpoint).expanduser().exists()
    ):
        raise FileNotFoundError(
            f"resume_from_checkpoint={str(resume_from_checkpoint)!r} does not exist; pass a "
            "checkpoint-<n> folder that train(checkpoint_dir=...) wrote."
        )
    trainer._checkpoint_begin(
        resume_from_checkpoint, checkpoint_dir, checkpoint_interval, checkpoint_total_limit
    )


class MADPOCheckpoints(MADPOHookCheckpoints143):
    """MADPO's epoch loop with commits, and its part of a checkpoint (module docstring)."""

    args: Any
    env_step: int
    preference_pairs: list[Any]
    _run: Any
    _checkpoint_kind = "madpo"
    _madpo_order_rng: random.Random | None = None

    # --- the checkpoint's parts ---------------------------------------------------------
    def _checkpoint_write(self, path: Path, section: dict[str, Any]) -> Path:
        from comlrl.algos.recipes.preference.madpo.recipe import madpo_checkpoint

        return madpo_checkpoint(self._run, path, recipe_state={SECTION: section})

    def _checkpoint_restore(self, path: Path, saved: dict[str, Any]) -> None:
        from comlrl.algos.recipes.preference.madpo.recipe import madpo_resume

        madpo_resume(self._run, path, state=saved)

    def _checkpoint_extra(self) -> dict[str, Any]:
        order = self.__dict__.get("_madpo_order_rng")
        return {
            "last_train_log_step": int(self.__dict__.get("_last_train_log_step", -1)),
            "preference_pairs": [p.to_state() for p in self.__dict__.get("preference_pairs", [])],
            "order_rng": order.getstate() if order is not None else None,
        }

    def _checkpoint_load_extra(self, extra: Mapping[str, Any]) -> None:
        from comlrl.algos.recipes.preference.iterative.replay import IterPair
        from comlrl.algos.training.checkpoint import set_random_state

        self._last_train_log_step = int(extra.get("last_train_log_step", -1))
        self.preference_pairs = [IterPair.from_state(p) for p in extra["preference_pairs"]]
        self._madpo_order_rng = None
        if extra.get("order_rng") is not None:
            self._madpo_order_rng = random.Random()
            set_random_state(self._madpo_order_rng, extra["order_rng"])

    def _checkpoint_start_epoch(self, progress: Any) -> int:
        """The completed epochs of a MADPO cursor (``{}``: nothing trained yet).

        Raises:
            ValueError: another trainer's cursor, or a missing/invalid ``epoch``,
                ``updates_seen`` or ``complete``.
        """
        if not check_cursor(progress, "madpo", "madpo epoch cursor"):
            return 0
        epoch = check_count(progress, "epoch", int(self.args.num_train_epochs), "madpo")
        check_count(progress, "updates_seen", 2**62, "madpo")
        if type(progress.get("complete")) is not bool:
            raise ValueError(f"Incomplete madpo checkpoint cursor {dict(progress)!r}: 'complete'")
        return epoch

    def _checkpoint_check(self, section: Mapping[str, Any], where: str) -> None:
        super()._checkpoint_check(section, where)  # type: ignore[misc]
        extra = section.get("extra") or {}
        if section["progress"] and not isinstance(extra.get("preference_pairs"), list):
            raise ValueError(
                f"Incomplete MADPO checkpoint {where}: it holds an epoch cursor but no "
                "preference pairs; resume from a checkpoint train(checkpoint_dir=...) wrote."
            )

    # --- the loop -----------------------------------------------------------------------
    def _train_madpo_checkpointed(self) -> list[dict[str, float]]:
        """1.4.3's name of MADPO's loop from the current cursor (``_checkpoint_progress``),
        which is checked first.

        Raises:
            ValueError: a cursor that is not MADPO's or is malformed (nothing runs then).
        """
        self._checkpoint_start_epoch(self.__dict__.get("_checkpoint_progress") or {})
        return self._madpo_epochs()

    def _madpo_epochs(self) -> list[dict[str, float]]:
        """Build the pairs (unless resumed past that), then the remaining epochs over them
        (see :meth:`MADPOTrainer.train`)."""
        from comlrl.algos.recipes.preference.madpo.recipe import madpo_update
        from comlrl.trainers._iterative import joint_pairs

        if callable(getattr(self, "_build_preference_dataset", None)):
            return self._madpo_hook_epochs()
        a, run = self.args, self._run
        progress = dict(self.__dict__.get("_checkpoint_progress") or {})
        total = int(a.num_train_epochs)
        if not progress:
            self.preference_pairs = self._build_pairs()  # type: ignore[attr-defined]
            self._madpo_order_rng = random.Random(int(run.config.seed) + 3)
            progress = {"kind": "madpo", "epoch": 0, "updates_seen": int(run.step),
                        "complete": not self.preference_pairs}  # fmt: skip
            self._checkpoint_commit(progress, True)  # type: ignore[attr-defined]
        if progress["complete"]:
            if not self.preference_pairs:
                warnings.warn(
                    "MADPO: every candidate of every prompt tied; no preference pair to train on.",
                    stacklevel=3,
                )
            return []
        order_rng = self._madpo_order_rng
        assert order_rng is not None  # set with the pairs
        pad = [int(t.pad_token_id) for t in self.tokenizers]  # type: ignore[attr-defined]
        eval_rows = self.__dict__.get("_eval_rows")
        eval_every = int(a.eval_interval) if eval_rows and a.eval_num_samples > 0 else 0
        batch = int(a.train_batch_size)
        history: list[dict[str, float]] = []
        for epoch in range(int(progress["epoch"]), total):
            order = list(self.preference_pairs)
            order_rng.shuffle(order)
            self._checkpoint_save_blocked = True  # between boundaries from here
            for start in range(0, len(order), batch):
                part = order[start : start + batch]
                if eval_every > 0 and run.step % eval_every == 0:
                    self.evaluate()  # type: ignore[attr-defined]
                row: dict[str, float] = {"epoch": float(epoch + 1), "num_pairs": len(part)}
                row.update(madpo_update(run, joint_pairs(part, pad)))
                run.step += 1
                row["step"] = float(run.step)
                self.env_step += (
                    int(a.environment_steps_per_pair) * len(part) if a.use_environment_step else 1
                )
                history.append(row)
                self._wandb_log(row)  # type: ignore[attr-defined]
                self._last_train_log_step = self.env_step
            done = epoch + 1
            self._checkpoint_commit(  # type: ignore[attr-defined]
                {"kind": "madpo", "epoch": done, "updates_seen": int(run.step),
                 "complete": done == total},
                done == total,
            )  # fmt: skip
        return history

    def save_checkpoint(self, output_dir: str | Path) -> str:
        """As :meth:`TrainingCheckpointMixin.save_checkpoint`; a trainer on 1.4.3's hooks
        that trained without ``checkpoint_dir`` kept no pairs to save (as 1.4.3).

        Raises:
            RuntimeError: that case, or a ``train()`` stopped between boundaries.
        """
        if self.__dict__.get("_checkpoint_untracked_preference"):
            raise RuntimeError(
                "this trainer trained without checkpoint_dir, so its preference pairs were "
                "not kept; train(checkpoint_dir=...) to write resumable checkpoints."
            )
        saved: str = super().save_checkpoint(output_dir)  # type: ignore[misc]
        return saved


class MARLHFCheckpoints(MARLHFHookCheckpoints143):
    """MARLHF's stages with commits, and its part of a checkpoint (module docstring)."""

    args: Any
    rl_trainer: Any
    reward_model: Any
    reward_tokenizer: Any
    preference_pairs: list[Any]
    reward_model_history: list[dict[str, float]]
    _preference: Any
    _checkpoint_kind = "marlhf"

    # --- the checkpoint's parts ---------------------------------------------------------
    def _checkpoint_write(self, path: Path, section: dict[str, Any]) -> Path:
        path_out: Path = self.rl_trainer._checkpoint_write(path, section)
        return path_out

    def _checkpoint_restore(self, path: Path, saved: dict[str, Any]) -> None:
        self.rl_trainer._checkpoint_restore(path, saved)

    def _checkpoint_extra(self) -> dict[str, Any]:
        from comlrl.algos.training.checkpoint import cpu_state_dict

        rl = self.rl_trainer
        fitted = bool(self.__dict__.get("_reward_fitted", False))
        return {
            "rl": rl._checkpoint_extra(),
            "rl_env_step": int(rl.env_step),
            "reward_fitted": fitted,
            "reward_model": cpu_state_dict(self.reward_model) if fitted else None,
            "reward_model_history": [dict(r) for r in self.reward_model_history],
        }

    def _checkpoint_load_extra(self, extra: Mapping[str, Any]) -> None:
        rl = self.rl_trainer
        rl._checkpoint_load_extra(extra.get("rl") or {})
        rl.env_step = int(extra["rl_env_step"])
        self.reward_model_history = [dict(r) for r in extra.get("reward_model_history") or []]
        self._reward_fitted = bool(extra["reward_fitted"])
        if self._reward_fitted:
            self._ensure_preference_stage()
            self.reward_model.load_state_dict(dict(extra["reward_model"]), strict=True)
            self.reward_model.eval()
            rl.env.reward = self._preference.reward_function()
        progress = self.__dict__.get("_checkpoint_progress") or {}
        rl._checkpoint_progress = dict(progress.get("rl") or {})

    def _ensure_preference_stage(self) -> None:
        """Centralized MARLHF builds its reward model when training starts (1.4.3)."""
        if self._preference is None:
            self._init_reward_model()  # type: ignore[attr-defined]
            self._preference = self._build_preference_stage(  # type: ignore[attr-defined]
                self.reward_model, self.reward_tokenizer
            )

    def _checkpoint_start_epoch(self, progress: Any) -> int:
        """The RL stage's completed epochs of a MARLHF cursor (``{}``: nothing done).

        Raises:
            ValueError: another trainer's cursor, an unknown ``phase``, or an RL cursor
                that is not the RL trainer's (kind, ``epoch``).
        """
        if not check_cursor(progress, "marlhf", "marlhf cursor"):
            return 0
        if progress.get("phase") not in _PHASES:
            raise ValueError(
                f"Incomplete marlhf checkpoint cursor {dict(progress)!r}: phase must be one "
                f"of {_PHASES}"
            )
        rl = progress.get("rl")
        if not isinstance(rl, Mapping):
            raise ValueError(f"Incomplete marlhf checkpoint cursor {dict(progress)!r}: no 'rl'")
        if not rl:
            return 0
        kind = "actor_critic" if self.args.rl_algorithm in ("iac", "maac") else "magrpo"
        if rl.get("kind") != kind:
            raise ValueError(
                f"the checkpoint's RL cursor {dict(rl)!r} is not this trainer's {kind} stage "
                f"(rl_algorithm={self.args.rl_algorithm!r})"
            )
        return check_count(rl, "epoch", int(self.args.num_train_epochs), "marlhf rl")

    def _checkpoint_check(self, section: Mapping[str, Any], where: str) -> None:
        super()._checkpoint_check(section, where)  # type: ignore[misc]
        extra = section.get("extra") or {}
        progress = section["progress"]
        if progress and not isinstance(extra.get("rl_env_step"), int):
            raise ValueError(f"Incomplete MARLHF checkpoint {where}: no RL stage counters")
        needs_model = progress and (progress["rl"] or progress["phase"] == "online_rl")
        if needs_model and extra.get("reward_model") is None:
            raise ValueError(
                f"{where}: the cursor {dict(progress)!r} needs the fitted reward model, "
                "which the checkpoint does not hold"
            )

    def save_checkpoint(self, output_dir: str | Path) -> str:
        """As :meth:`TrainingCheckpointMixin.save_checkpoint`; refused while the RL stage
        stopped between its epoch boundaries."""
        rl = self.__dict__.get("rl_trainer")
        if rl is not None and rl.__dict__.get("_checkpoint_save_blocked"):
            self._checkpoint_save_blocked = True
        if self.__dict__.get("_checkpoint_untracked_preference"):
            raise RuntimeError(
                "this trainer trained without checkpoint_dir, so its stage data were not "
                "kept; train(checkpoint_dir=...) to write resumable checkpoints."
            )
        saved: str = super().save_checkpoint(output_dir)  # type: ignore[misc]
        return saved

    # --- the stages ---------------------------------------------------------------------
    def _train_marlhf_checkpointed(self) -> list[dict[str, float]]:
        """1.4.3's name of MARLHF's stages from the current cursor
        (``_checkpoint_progress``), which is checked first.

        Raises:
            ValueError: a cursor that is not MARLHF's or is malformed (nothing runs then).
        """
        self._checkpoint_start_epoch(self.__dict__.get("_checkpoint_progress") or {})
        return self._marlhf_stages()

    def _marlhf_stages(self) -> list[dict[str, float]]:
        """Pairs and reward model (unless resumed past them), then the RL stage's
        remaining epochs (see :meth:`MARLHFTrainer.train`)."""
        if "rl_trainer" not in self.__dict__ and callable(
            getattr(self, "_train_reward_model", None)
        ):
            return self._marlhf_hook_stages()
        rl = self.rl_trainer
        progress = dict(self.__dict__.get("_checkpoint_progress") or {})
        if not progress:
            self._ensure_preference_stage()
            self._reward_fitted = False
            self.preference_pairs = self._preference.collect_pairs()
            if not sum(len(p) for p in self.preference_pairs):
                warnings.warn(
                    "MARLHF: every sampled group tied under reward_func; no preference pairs, "
                    "so no reward model and no RL stage (raise preference_num_candidates or "
                    "the temperature).",
                    stacklevel=3,
                )
                self._checkpoint_commit({"kind": "marlhf", "phase": "complete", "rl": {}}, True)  # type: ignore[attr-defined]
                return []
            self.reward_model_history = self._preference.train_reward_model()
            self._reward_fitted = True
            rl._wandb_log(
                {f"reward_model/{k}": v for k, v in self.reward_model_history[-1].items()}
            )
            rl.env.reward = self._preference.reward_function()
            rl._checkpoint_progress = {}
            progress = {"kind": "marlhf", "phase": "online_rl", "rl": {}}
            self._checkpoint_commit(progress, True)  # type: ignore[attr-defined]
        if progress["phase"] == "complete":
            return []

        def commit(rl_progress: dict[str, Any], force: bool = False) -> None:
            type(rl)._checkpoint_commit(rl, rl_progress, force)  # the RL trainer's cursor
            phase = "complete" if force else "online_rl"
            self._checkpoint_commit(  # type: ignore[attr-defined]
                {"kind": "marlhf", "phase": phase, "rl": dict(rl_progress)}, force
            )

        rl._checkpoint_commit = commit
        try:
            history: list[dict[str, float]] = rl.train()
        finally:
            del rl._checkpoint_commit
        return history
