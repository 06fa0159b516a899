"""``train()`` of the CoMLRL 1.4.3 trainers, with 1.4.3's checkpoint arguments.

:class:`TrainLoop143` runs the recipe's steps (evaluation every ``eval_interval``
examples, ``env_step`` counting the joint actions scored, W&B rows) and commits an epoch
cursor at every completed pass over ``train_dataset``; with ``checkpoint_dir`` those
commits write resumable checkpoints in ``comlrl.algos``' step-checkpoint format
(:mod:`comlrl.utils.checkpoint` describes the folder and what it restores). The trainer
sets ``_checkpoint_kind`` to take part (``"magrpo"``, ``"actor_critic"``; the preference
trainers run their own loops with the same arguments,
:mod:`comlrl.trainers.preference._checkpoints`); one without refuses them. A subclass that defines 1.4.3's per-example hooks is
trained by 1.4.3's loop instead (:mod:`comlrl.trainers._epochs143`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comlrl.trainers._fields import UnsupportedFieldError
from comlrl.utils.checkpoint import SECTION, TrainingCheckpointMixin, check_checkpoint_options

__all__ = ["TrainLoop143", "epochs_done"]


def epochs_done(data: Any) -> int:
    """Completed passes of a :class:`comlrl.algos.training.data.DataStream`: its
    ``epoch`` counts passes begun, and one is complete when no index is left in it."""
    return int(data.epoch) - (1 if data.order else 0)


class TrainLoop143(TrainingCheckpointMixin):
    """``train(resume_from_checkpoint=, checkpoint_dir=, checkpoint_interval=,
    checkpoint_total_limit=)`` over a ``CompatTrainer``'s recipe run."""

    # provided by CompatTrainer
    config: Any
    algorithm_name: str
    _base_run: Any
    _train_step: Any
    evaluate: Any
    _verbose: Any
    _wandb_log: Any

    def _checkpoint_has_run(self) -> bool:
        return any(self.__dict__.get(k) is not None for k in ("_build_run", "_run_state"))

    def _checkpoint_write(self, path: Path, section: dict[str, Any]) -> Path:
        """The group-baseline run and ``section`` at ``path`` (atomically)."""
        from comlrl.algos.recipes.group_baseline import state

        return state.checkpoint(self._base_run(), path, recipe_state={SECTION: section})

    def _checkpoint_extra(self) -> dict[str, Any]:
        """The environment step of the last logged row and the frozen KL reference
        models' weights (with ``reference_kl_enabled``: a resumed trainer built from other
        initial weights gets the run's reference back)."""
        from comlrl.algos.training.checkpoint import cpu_state_dict

        refs = getattr(self._base_run(), "ref_models", None) or []
        return {
            "last_train_log_step": int(self.__dict__.get("_last_train_log_step", -1)),
            "reference_models": [cpu_state_dict(m) for m in refs],
        }

    def _checkpoint_load_extra(self, extra: Mapping[str, Any]) -> None:
        self._last_train_log_step = int(extra.get("last_train_log_step", -1))
        refs = getattr(self._base_run(), "ref_models", None) or []
        saved = extra.get("reference_models") or []
        if len(saved) != len(refs):
            raise ValueError(
                f"the checkpoint holds {len(saved)} reference models but this run has "
                f"{len(refs)}; resume with the reference_kl_enabled the run was started with."
            )
        for model, state in zip(refs, saved, strict=True):
            model.load_state_dict(state)

    def _checkpoint_restore(self, path: Path, saved: dict[str, Any]) -> None:
        from comlrl.algos.recipes.group_baseline import state

        state.resume(self._base_run(), path, state=saved)

    def _takes_step_kwargs143(self) -> bool:
        """A 1.4.3-style MAGRPO subclass receives ``train()``'s other keyword arguments in
        its ``_train_step_returns`` (as 1.4.3 does)."""
        uses = getattr(self, "_uses_epoch_hooks143", None)
        return callable(uses) and bool(uses()) and self._checkpoint_kind == "magrpo"

    def train(
        self,
        resume_from_checkpoint: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs: Any,
    ) -> list[dict[str, float]]:
        """Train for ``num_train_epochs`` passes over ``train_dataset``.

        One training step per ``train_batch_size`` examples (each with its whole rollout
        tree): one optimizer step per agent, except multi-turn MAGRPO-family runs, which
        take 1.4.3's one per turn of each ``rollout_buffer_size`` tree nodes; evaluation
        (when ``eval_dataset`` is given) before the first step and every ``eval_interval``
        examples. Returns the per-step metric rows of this call (also
        logged to W&B with ``wandb_config``). A trainer that has trained continues from
        where it stopped (a finished one takes no step).

        Args:
            resume_from_checkpoint: a checkpoint folder this trainer class wrote (built
                with the same config, data and callbacks): training continues from it
                exactly (docs/compat.md, "Checkpoints").
            checkpoint_dir: write ``checkpoint-<n>`` here after every ``checkpoint_interval``
                completed epochs and after the last step; it must not hold checkpoints
                this run would overwrite.
            checkpoint_interval: epochs between checkpoints (an int >= 1).
            checkpoint_total_limit: keep only the newest this many of this run's
                checkpoints in ``checkpoint_dir`` (None: all).

        Raises:
            ValueError: a bad ``checkpoint_interval``/``checkpoint_total_limit``, or a
                checkpoint that does not fit this trainer (nothing changes then).
            FileExistsError: ``checkpoint_dir`` holds checkpoints this run would overwrite.
            UnsupportedFieldError: other keyword arguments (a subclass that defines 1.4.3's
                ``_train_step_returns`` receives them there), or checkpoint arguments for a
                trainer without checkpoints.
        """
        hook_kwargs = dict(kwargs)  # 1.4.3 passes them to its _train_step_returns hook
        if kwargs and not self._takes_step_kwargs143():
            raise UnsupportedFieldError(
                f"train({', '.join(f'{k}=...' for k in kwargs)}) is not an argument of "
                "comlrl.trainers' train(); it takes resume_from_checkpoint, checkpoint_dir, "
                "checkpoint_interval and checkpoint_total_limit."
            )
        check_checkpoint_options(checkpoint_interval, checkpoint_total_limit)
        checkpointed = (
            resume_from_checkpoint is not None
            or checkpoint_dir is not None
            or checkpoint_interval != 1
            or checkpoint_total_limit is not None
        )
        if checkpointed and not self._checkpoint_kind:
            raise UnsupportedFieldError(
                f"{type(self).__name__}.train() takes no checkpoint arguments (resumable "
                "this trainer class defines no checkpoint cursor, _checkpoint_kind); call train() "
                "and then save_model(dir)."
            )
        uses_hooks = getattr(self, "_uses_epoch_hooks143", None)
        if callable(uses_hooks) and uses_hooks():  # a 1.4.3-style subclass (_epochs143)
            self._train_hooks143(  # type: ignore[attr-defined]
                resume_from_checkpoint, checkpoint_dir, checkpoint_interval,
                checkpoint_total_limit, checkpointed, **hook_kwargs,
            )  # fmt: skip
            return []
        from tqdm.auto import tqdm

        cfg = self.config
        run = self._base_run()
        if checkpointed:
            self._checkpoint_begin(
                resume_from_checkpoint, checkpoint_dir, checkpoint_interval, checkpoint_total_limit
            )
        else:
            self._checkpoint_dir = None
        total = int(self.args.num_train_epochs)
        eval_every = int(getattr(self, "_eval_every", getattr(cfg, "eval_every", 0)))
        history: list[dict[str, float]] = []
        show = bool(getattr(cfg, "progress", self._verbose()))
        bar = tqdm(
            total=cfg.num_steps, initial=run.step, disable=not show, desc=self.algorithm_name
        )
        try:
            for _ in range(run.step, cfg.num_steps):
                if eval_every and run.step % eval_every == 0:
                    self.evaluate()
                self._checkpoint_save_blocked = True  # between epoch boundaries from here
                row = self._train_step()
                # 1.4.3's environment steps: the joint actions scored (the W&B step)
                self.env_step += int(row.get("num_joint_actions", cfg.batch_size))
                history.append(row)
                self._wandb_log(row)
                self._last_train_log_step = self.env_step  # every row is logged
                bar.update(1)
                bar.set_postfix(reward=f"{row.get('reward_mean', float('nan')):.3f}")
                last = run.step >= cfg.num_steps
                done = total if last else min(epochs_done(run.data), total)
                progress = self.__dict__.get("_checkpoint_progress") or {}
                if last or done > int(progress.get("epoch", 0)):
                    self._checkpoint_save_blocked = False
                    self._checkpoint_commit({"kind": self._checkpoint_kind, "epoch": done}, last)
        finally:
            bar.close()
        return history
