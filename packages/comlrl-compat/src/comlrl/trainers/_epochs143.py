"""CoMLRL 1.4.3's epoch loop over its per-example hooks, for trainers that define them.

Our trainers train through a ``comlrl.algos`` recipe (:mod:`comlrl.trainers._train143`).
A 1.4.3-style subclass that defines 1.4.3's per-example hook instead (MAGRPO:
``_train_step_returns(item, **kwargs)`` and ``_drain_ready_buffers(agents)``; IAC/MAAC:
``_run_batch(batch, epoch_metrics)`` and ``_flush_buffers(epoch_metrics)``) is trained by
1.4.3's loop: per epoch, ``get_train_dataloader()``, evaluation every ``eval_interval``
items, the hook per item, the buffers drained at the epoch's end, then an epoch cursor
committed. With checkpoint arguments the commits write checkpoints of the trainer's
attributes (:mod:`comlrl.utils._trainer_snapshot`); resuming starts at the saved epoch
after ``_on_checkpoint_train_start(start_epoch, total_epochs)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ActorCriticEpochs143", "EpochHooks143", "MAGRPOEpochs143"]

Commit = Callable[..., None]


class EpochHooks143:
    """The loop shared by :class:`MAGRPOEpochs143` and :class:`ActorCriticEpochs143`."""

    args: Any
    #: the hook whose presence on the trainer selects 1.4.3's loop
    _epoch_hook143: str = ""
    _checkpoint_kind: str
    _checkpoint_begin: Any
    _checkpoint_start_epoch: Any
    _checkpoint_commit: Any
    _checkpoint_save_blocked: bool
    _checkpoint_progress: dict[str, Any]

    def _uses_epoch_hooks143(self) -> bool:
        return bool(self._epoch_hook143) and callable(getattr(self, self._epoch_hook143, None))

    def get_train_dataloader(self) -> Any:
        """1.4.3's training loader: ``train_dataset`` in order, one item per batch.

        Raises:
            ValueError: no ``train_dataset``.
        """
        from torch.utils.data import DataLoader

        data = getattr(self, "train_dataset", None)
        if data is None:
            raise ValueError("training requires a train_dataset")
        return DataLoader(data, batch_size=1, shuffle=False, collate_fn=list)

    def _checkpoint_validate_progress(self, state: dict[str, Any]) -> int:
        """The completed epochs of a saved state's cursor.

        Raises:
            ValueError: a cursor of another loop, an impossible epoch, or a saved cursor
                with rollouts still buffered ("empty rollout buffers").
        """
        start = int(self._checkpoint_start_epoch(state["progress"]))
        if state["progress"] and any(state["runtime"].get("rollout_buffers", [])):
            raise ValueError(
                f"a {self._checkpoint_kind} resume needs an epoch boundary with empty rollout "
                "buffers; this checkpoint has buffered rollouts."
            )
        return start

    def _on_checkpoint_train_start(self, start_epoch: int, total_epochs: int) -> None:
        """Called once before a checkpointed loop builds its first loader (also when
        every epoch is done); ``start_epoch``: the epochs completed. Subclasses align
        their own state here."""

    def _checkpoint_init_wandb(self) -> None:
        """Start the W&B run of a checkpointed loop without moving a random stream."""
        if getattr(self, "wandb_config", None) is None or getattr(self, "wandb_initialized", False):
            return
        from comlrl.utils._trainer_snapshot import global_rng, set_global_rng

        saved = global_rng()
        try:
            self._init_wandb()  # type: ignore[attr-defined]
        finally:
            set_global_rng(saved)

    def _train_checkpoint_epochs(
        self, progress: dict[str, Any], commit: Commit, **kwargs: Any
    ) -> None:
        """Run the epochs after ``progress`` (a cursor), calling ``commit(cursor,
        force=last)`` after each; a parent trainer may pass its own ``commit``."""
        total = int(self.args.num_train_epochs)
        start = self._checkpoint_validate_progress(
            {"progress": progress, "runtime": {"rollout_buffers": self.rollout_buffers}}  # type: ignore[attr-defined]
        )
        self._on_checkpoint_train_start(start, total)
        self._checkpoint_init_wandb()
        self._run_epochs143(start, total, commit, **kwargs)

    def _run_epochs143(self, start: int, total: int, commit: Commit | None, **kwargs: Any) -> None:
        raise NotImplementedError

    def _train_hooks143(
        self,
        resume_from_checkpoint: str | Path | None,
        checkpoint_dir: str | Path | None,
        interval: int,
        total_limit: int | None,
        checkpointed: bool,
        **kwargs: Any,
    ) -> None:
        """``train()`` of a trainer that defines 1.4.3's hooks (see the module docstring)."""
        if checkpointed:
            if getattr(self, "_checkpoint_context_active", False):
                raise RuntimeError("a nested train() cannot open its own checkpoints")
            self._checkpoint_begin(resume_from_checkpoint, checkpoint_dir, interval, total_limit)
            self._checkpoint_context_active = True
            try:
                self._train_checkpoint_epochs(
                    self._checkpoint_progress, self._checkpoint_commit, **kwargs
                )  # type: ignore[attr-defined]
            except BaseException:
                self._checkpoint_save_blocked = True
                raise
            finally:
                self._checkpoint_context_active = False
            self._checkpoint_save_blocked = False
            return
        nested = bool(getattr(self, "_checkpoint_context_active", False))
        if not nested:
            self._checkpoint_save_blocked = True
        self._before_default_epochs143()
        self._run_epochs143(0, int(self.args.num_train_epochs), None, **kwargs)
        if not nested:  # a parent trainer's cursor stays as it is
            self._checkpoint_progress = {
                "kind": self._checkpoint_kind,
                "epoch": int(self.args.num_train_epochs),
            }
            self._checkpoint_save_blocked = False

    def _before_default_epochs143(self) -> None:
        """Before an unchecked loop (MAGRPO starts W&B here, as 1.4.3)."""


class MAGRPOEpochs143(EpochHooks143):
    """1.4.3's MAGRPO epoch loop: ``_train_step_returns`` per item, ``_drain_ready_buffers``
    per epoch."""

    _epoch_hook143 = "_train_step_returns"

    def _should_log_train(self, step: int) -> bool:
        """1.4.3's ``logging_steps``: log at ``step`` when at least that many environment
        steps passed since the last logged one (always with ``logging_steps <= 1``)."""
        every = int(getattr(self.args, "logging_steps", 1) or 1)
        last = int(getattr(self, "_last_train_log_step", -1))
        if every <= 1 or last < 0 or step - last >= every:
            self._last_train_log_step = step
            return True
        return False

    def _before_default_epochs143(self) -> None:
        if getattr(self, "wandb_config", None) is not None and not getattr(
            self, "wandb_initialized", False
        ):
            self._init_wandb()  # type: ignore[attr-defined]

    def _run_epochs143(self, start: int, total: int, commit: Commit | None, **kwargs: Any) -> None:
        devices = getattr(self, "agent_devices", None) or []
        for i, agent in enumerate(self.agents):  # type: ignore[attr-defined]
            if i < len(devices):
                agent.to(devices[i])
            agent.train()
        every = int(self.args.eval_interval)
        for epoch in range(start, total):
            self._checkpoint_save_blocked = True
            for index, batch in enumerate(self.get_train_dataloader()):
                if every > 0 and index % every == 0:
                    self.evaluate(num_eval_samples=int(self.args.eval_num_samples))  # type: ignore[attr-defined]
                self._train_step_returns(batch[0], **kwargs)  # type: ignore[attr-defined]
            buffers = self.rollout_buffers  # type: ignore[attr-defined]
            self._drain_ready_buffers([i for i, b in enumerate(buffers) if b])  # type: ignore[attr-defined]
            if commit is not None:
                commit({"kind": "magrpo", "epoch": epoch + 1}, force=epoch + 1 == total)


class ActorCriticEpochs143(EpochHooks143):
    """1.4.3's IAC/MAAC epoch loop: ``_run_batch`` per batch, ``_flush_buffers`` and
    ``_on_epoch_end`` per epoch."""

    _epoch_hook143 = "_run_batch"

    def _flush_buffers(self, epoch_metrics: dict[str, list[float]]) -> None:
        """Update every agent whose buffer holds rollouts (1.4.3's end of an epoch)."""
        buffers = self.rollout_buffers  # type: ignore[attr-defined]
        self._drain_ready_agent_buffers([i for i, b in enumerate(buffers) if b], epoch_metrics)  # type: ignore[attr-defined]

    def _on_epoch_end(
        self, epoch: int, total_epochs: int, epoch_metrics: dict[str, list[float]]
    ) -> None:
        """Called after each epoch's buffers are flushed (a subclass may log here)."""

    def _run_epochs143(self, start: int, total: int, commit: Commit | None, **kwargs: Any) -> None:
        every = int(self.args.eval_interval)
        for epoch in range(start, total):
            self._checkpoint_save_blocked = True
            metrics: dict[str, list[float]] = defaultdict(list)
            for index, batch in enumerate(self.get_train_dataloader()):
                if (
                    getattr(self, "eval_dataset", None) is not None
                    and every > 0
                    and index % every == 0
                ):
                    self.evaluate()  # type: ignore[attr-defined]
                self._run_batch(batch, metrics)  # type: ignore[attr-defined]
            self._flush_buffers(metrics)
            self._on_epoch_end(epoch, total, metrics)
            if commit is not None:
                commit({"kind": "actor_critic", "epoch": epoch + 1}, force=epoch + 1 == total)
