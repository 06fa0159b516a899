"""The trainer mixin of :mod:`comlrl.utils.checkpoint`: ``save_checkpoint``,
``load_checkpoint`` and the epoch commits of ``train(checkpoint_dir=...)``."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comlrl.utils._checkpoint_files import (
    CHECKPOINT_NAME,
    CHECKPOINT_VERSION,
    STATE_FILENAME,
    check_section,
    load_state,
    read_checkpoint_metadata,
    state_file,
    write_snapshot,
)
from comlrl.utils._checkpoint_parts import (
    PORTABLE_FIELDS,
    config_fields,
    dataset_info,
    numpy_state,
    set_numpy_state,
    stateful_callbacks,
    tokenizer_info,
)
from comlrl.utils._checkpoint_wandb import (
    check_wandb_resume,
    record_wandb_run,
    restore_wandb_identity,
)
from comlrl.utils._trainer_snapshot import restore_trainer_state

__all__ = ["TrainingCheckpointMixin"]


class TrainingCheckpointMixin:
    """``save_checkpoint``/``load_checkpoint`` and the commit bookkeeping of
    ``train(checkpoint_dir=..., resume_from_checkpoint=...)`` (see the module docstring).

    The trainer supplies ``_checkpoint_kind`` (its cursor's name: ``"magrpo"``,
    ``"actor_critic"``), ``_checkpoint_write(path, section) -> Path`` (write the run and
    ``section`` atomically at ``path`` in ``comlrl.algos``' format) and
    ``_checkpoint_restore(path, state)`` (put the run back from that folder).
    """

    args: Any
    env_step: int
    _checkpoint_kind: str = ""
    #: the epoch cursor of the last commit: {} (nothing trained) or {"kind", "epoch"}
    _checkpoint_progress: dict[str, Any]
    _checkpoint_sequence: int = 0
    _checkpoint_run_id: str | None = None
    _checkpoint_wandb_identity: dict[str, str] | None = None
    #: a train() stopped between commits: the live state fits no cursor
    _checkpoint_save_blocked: bool = False

    def _checkpoint_has_run(self) -> bool:
        """True when the trainer's state is a ``comlrl.algos`` recipe run (else its
        attributes are snapshot, :func:`capture_trainer_state`)."""
        return False

    def _checkpoint_write(self, path: Path, section: dict[str, Any]) -> Path:
        raise NotImplementedError(f"{type(self).__name__} writes no checkpoints")

    def _checkpoint_restore(self, path: Path, state: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} reads no checkpoints")

    def _checkpoint_section(self) -> dict[str, Any]:
        """The trainer's part of ``training_state.pt`` (plain values only)."""
        callbacks: dict[str, Any] = {}
        for name, obj in stateful_callbacks(self).items():
            if not callable(getattr(obj, "load_state_dict", None)):
                raise ValueError(f"{name} has state_dict() but no load_state_dict(); add one")
            callbacks[name] = {"class": type(obj).__qualname__, "state": obj.state_dict()}
        return {
            "version": CHECKPOINT_VERSION,
            "trainer_class": f"{type(self).__module__}.{type(self).__qualname__}",
            "config": config_fields(getattr(self, "args", None)),
            "progress": dict(self.__dict__.get("_checkpoint_progress") or {}),
            "sequence": int(self._checkpoint_sequence),
            "run_id": self._checkpoint_run_id,
            "wandb": self._checkpoint_wandb(),
            "env_step": int(getattr(self, "env_step", 0)),
            "numpy_rng": numpy_state(),
            "callbacks": callbacks,
            "extra": self._checkpoint_extra(),
            "dataset": dataset_info(self),
            "tokenizers": tokenizer_info(self),
        }

    def _checkpoint_extra(self) -> dict[str, Any]:
        """A trainer's own plain values and CPU tensors for its checkpoints (default none)."""
        return {}

    def _checkpoint_load_extra(self, extra: Mapping[str, Any]) -> None:
        """Put back what :meth:`_checkpoint_extra` saved (after the run is restored)."""

    def _checkpoint_wandb(self) -> dict[str, str] | None:
        """The W&B run's identity (``id``, ``project``, ``entity``) once a run is started."""
        run = getattr(self, "_wandb_run", None)
        if run is not None and isinstance(getattr(run, "id", None), str):
            self._checkpoint_wandb_identity = {
                k: v
                for k in ("id", "project", "entity")
                if isinstance(v := getattr(run, k, None), str) and v
            }
        return self._checkpoint_wandb_identity

    def _checkpoint_record_wandb_run(self, run: Any, previous_run: Any = None) -> None:
        """Remember the W&B run this trainer logs to (owned unless it is ``previous_run``,
        a run opened before); its identity goes into the checkpoints."""
        record_wandb_run(self, run, previous_run)

    def _checkpoint_resume_wandb(self, identity: Mapping[str, str] | None) -> None:
        """Log a resumed run into the checkpoint's W&B run (see
        :func:`comlrl.utils._checkpoint_wandb.restore_wandb_identity`)."""
        check_wandb_resume(self, identity)
        restore_wandb_identity(self, identity)

    def save_checkpoint(self, output_dir: str | Path) -> str:
        """Write a resumable checkpoint of the trainer at ``output_dir`` (atomically: an
        existing checkpoint there is replaced only once the new one is complete); no
        random stream moves. Returns the folder's absolute path.

        Raises:
            RuntimeError: the last ``train()`` stopped between epoch boundaries (the weights
                fit no saved cursor); resume the last checkpoint, or train again first.
            FileExistsError: ``output_dir`` exists and is not a checkpoint folder.
        """
        if self._checkpoint_save_blocked:
            raise RuntimeError(
                "the last train() stopped before an epoch boundary, so this state fits no "
                "checkpoint cursor; resume the last saved checkpoint or run train() again."
            )
        target = Path(output_dir).expanduser().absolute()
        if target.is_symlink() or (target.exists() and not (target / STATE_FILENAME).is_file()):
            raise FileExistsError(f"refusing to replace {str(target)!r}: not a checkpoint folder")
        if self._checkpoint_has_run():
            return str(self._checkpoint_write(target, self._checkpoint_section()))
        return str(write_snapshot(target, self))

    def load_checkpoint(self, checkpoint: str | Path) -> dict[str, Any]:
        """Put the trainer back at ``checkpoint`` (weights, optimizer moments, data cursor,
        random streams, ``env_step``, callback states); returns its epoch cursor.

        Raises:
            ValueError: the checkpoint is of another trainer class, config (fields other
                than :data:`PORTABLE_FIELDS`), cursor, or not a ``comlrl.trainers`` one;
                nothing is changed then.
        """
        state, section = load_state(checkpoint)
        if section.get("comlrl143"):  # a folder CoMLRL 1.4.3 wrote
            resume = getattr(self, "_resume_143", None)
            if not callable(resume):
                raise ValueError(
                    f"{checkpoint} was written by CoMLRL 1.4.3; {type(self).__name__} cannot "
                    "resume it (the MAGRPO family can); build the trainer from the models 1.4.3's "
                    "save_model wrote instead."
                )
            return dict(resume(state, str(checkpoint)))
        if state is section:  # a snapshot of a trainer without a recipe run
            restore_trainer_state(self, state, state_file(checkpoint).parent)
            self._checkpoint_resume_wandb(state.get("wandb"))
            return dict(self._checkpoint_progress)
        self._checkpoint_check(section, str(checkpoint))
        self._checkpoint_restore(state_file(checkpoint).parent, state)
        self._checkpoint_load_extra(section.get("extra") or {})
        set_numpy_state(section["numpy_rng"])
        self.env_step = int(section["env_step"])
        live = stateful_callbacks(self)
        for name, record in section["callbacks"].items():
            live[name].load_state_dict(record["state"])
        self._checkpoint_progress = dict(section["progress"])
        self._checkpoint_sequence = int(section["sequence"])
        self._checkpoint_run_id = section.get("run_id") or uuid.uuid4().hex
        self._checkpoint_resume_wandb(section.get("wandb"))
        self._checkpoint_save_blocked = False
        return dict(self._checkpoint_progress)

    def _checkpoint_check(self, section: Mapping[str, Any], where: str) -> None:
        """Refuse a checkpoint that does not fit this trainer, before anything changes."""
        check_section(section, where)
        mine = f"{type(self).__module__}.{type(self).__qualname__}"
        if section["trainer_class"] != mine:
            raise ValueError(
                f"{where} was written by {section['trainer_class']}; this trainer is {mine}"
            )
        saved = {k: v for k, v in section["config"].items() if k not in PORTABLE_FIELDS}
        now = {
            k: v
            for k, v in config_fields(getattr(self, "args", None)).items()
            if k not in PORTABLE_FIELDS
        }
        if saved != now:
            changed = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
            raise ValueError(
                f"{where}: the checkpoint's configuration differs in {', '.join(changed)}; "
                "resume with the config the run was started with (only "
                f"{', '.join(sorted(PORTABLE_FIELDS))} may change)."
            )
        if section.get("dataset", dataset_info(self)) != dataset_info(self):
            raise ValueError(
                f"{where}: the checkpoint's train_dataset differs (length or content) from this "
                "trainer's; resume with the data the run was started with."
            )
        if section.get("tokenizers", tokenizer_info(self)) != tokenizer_info(self):
            raise ValueError(
                f"{where}: the checkpoint's tokenizers differ (vocabulary, special tokens or "
                "chat template) from this trainer's."
            )
        self._checkpoint_start_epoch(section["progress"])
        names = set(section["callbacks"])
        live = set(stateful_callbacks(self))
        if names != live:
            raise ValueError(
                f"{where}: the checkpoint holds the state of callbacks {sorted(names)} but this "
                f"trainer has stateful callbacks {sorted(live)}; pass the same callbacks."
            )

    def _checkpoint_start_epoch(self, progress: Any) -> int:
        """The completed epochs of a cursor (``{}``: 0).

        Raises:
            ValueError: a cursor of another loop ("epoch cursor"), or an epoch that is not an
                int between 0 and ``num_train_epochs`` ("checkpoint epoch").
        """
        if not isinstance(progress, Mapping):
            raise ValueError(f"checkpoint progress must be a dict, got {progress!r}")
        if progress and (progress.get("kind") != self._checkpoint_kind or "epoch" not in progress):
            raise ValueError(
                f"the checkpoint holds no {self._checkpoint_kind} epoch cursor: {dict(progress)!r}"
            )
        epoch, total = progress.get("epoch", 0), int(self.args.num_train_epochs)
        if type(epoch) is not int or not 0 <= epoch <= total:
            raise ValueError(
                f"checkpoint epoch {epoch!r} must be an int between 0 and num_train_epochs={total}"
            )
        return epoch

    def _checkpoint_begin(
        self,
        resume_from_checkpoint: str | Path | None,
        checkpoint_dir: str | Path | None,
        interval: int,
        total_limit: int | None,
    ) -> None:
        """Start a checkpointed ``train()``: check ``checkpoint_dir``, resume when asked."""
        self._checkpoint_dir = (
            Path(checkpoint_dir).expanduser().absolute() if checkpoint_dir is not None else None
        )
        resumed_seq = (
            read_checkpoint_metadata(resume_from_checkpoint)["sequence"]
            if resume_from_checkpoint is not None
            else None
        )
        root = self._checkpoint_dir
        if root is not None and root.exists():
            if not root.is_dir():
                raise NotADirectoryError(f"checkpoint_dir {str(root)!r} is not a folder")
            for child in sorted(root.iterdir()):
                m = CHECKPOINT_NAME.match(child.name)
                if m and (resumed_seq is None or int(m.group(1)) > resumed_seq):
                    raise FileExistsError(
                        f"checkpoint_dir already holds {child.name}, which this run would "
                        "overwrite; choose an empty checkpoint_dir, or resume from its "
                        "newest checkpoint."
                    )
        if resume_from_checkpoint is not None:
            self.load_checkpoint(resume_from_checkpoint)
        else:
            self._checkpoint_progress = {}
            self._checkpoint_sequence = 0
            self._checkpoint_run_id = uuid.uuid4().hex
        self._checkpoint_interval = int(interval)
        self._checkpoint_total_limit = total_limit

    def _checkpoint_commit(self, progress: dict[str, Any], force: bool = False) -> None:
        """Record an epoch boundary; write ``checkpoint-<sequence>`` when it is due."""
        self._checkpoint_save_blocked = False  # the state is at this boundary
        self._checkpoint_progress = dict(progress)
        self._checkpoint_sequence += 1
        root: Path | None = getattr(self, "_checkpoint_dir", None)
        if root is None:
            return
        if force or self._checkpoint_sequence % getattr(self, "_checkpoint_interval", 1) == 0:
            latest = Path(self.save_checkpoint(root / f"checkpoint-{self._checkpoint_sequence}"))
            self._checkpoint_prune(latest)

    def _checkpoint_prune(self, latest: Path) -> None:
        """Keep the newest ``checkpoint_total_limit`` checkpoints of this run in the folder
        (``latest`` always); other runs' folders are left alone."""
        limit = getattr(self, "_checkpoint_total_limit", None)
        if limit is None:
            return
        mine = []
        for child in latest.parent.iterdir():
            m = CHECKPOINT_NAME.match(child.name)
            if not m or child == latest or child.is_symlink() or not child.is_dir():
                continue
            try:
                if read_checkpoint_metadata(child)["run_id"] == self._checkpoint_run_id:
                    mine.append((int(m.group(1)), child))
            except (OSError, ValueError):
                continue
        for _, path in sorted(mine, reverse=True)[max(0, int(limit) - 1) :]:
            shutil.rmtree(path)
