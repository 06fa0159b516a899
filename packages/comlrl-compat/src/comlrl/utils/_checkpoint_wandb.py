"""The W&B run identity of a checkpoint: recorded when a trainer's run starts, checked and
put into ``wandb_config`` on restore, so a resumed run logs into the run it continues.

A trainer that records its run (:func:`record_wandb_run`) *owns* it unless the run was
already open before (``previous_run``: a run the caller started). On restore, a
``wandb_config`` naming its own ``id`` or ``resume`` wins; otherwise an open run of the
trainer with another id is finished (an external one is refused, before anything changes)
and ``wandb_config`` gets the saved ``id``, ``resume="allow"`` and the saved
``project``/``entity`` where it has none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["check_identity", "check_wandb_resume", "record_wandb_run", "restore_wandb_identity"]

_KEYS = ("id", "project", "entity")


def check_identity(identity: Any, where: str = "checkpoint") -> None:
    """Raise ValueError unless ``identity`` is None or ``{"id": str, "project"?: str,
    "entity"?: str}`` with a non-empty id."""
    if identity is None:
        return
    if (
        not isinstance(identity, Mapping)
        or not isinstance(identity.get("id"), str)
        or not identity["id"]
        or any(k not in _KEYS for k in identity)
        or any(not isinstance(v, str) for v in identity.values())
    ):
        raise ValueError(f"{where}: invalid W&B run identity {identity!r} (id, project, entity)")


def check_run_id(run_id: Any, where: str = "checkpoint") -> None:
    """Raise ValueError unless ``run_id`` is None or 32 lowercase hex digits."""
    if run_id is not None and (
        not isinstance(run_id, str) or not re.fullmatch(r"[0-9a-f]{32}", run_id)
    ):
        raise ValueError(f"{where}: invalid run identity {run_id!r} (32 hex digits)")


def record_wandb_run(trainer: Any, run: Any, previous_run: Any = None) -> None:
    """Remember ``run`` (a W&B run object) as the trainer's, owned unless it is
    ``previous_run`` (a run that was open before the trainer started one)."""
    if run is None or not isinstance(getattr(run, "id", None), str):
        return
    trainer._checkpoint_wandb_run = run
    trainer._checkpoint_wandb_owned = run is not previous_run
    trainer._checkpoint_wandb_identity = {
        k: v for k in _KEYS if isinstance(v := getattr(run, k, None), str) and v
    }


def _open_run(trainer: Any) -> Any:
    run = getattr(trainer, "_checkpoint_wandb_run", None) or trainer.__dict__.get("_wandb_run")
    if run is None and getattr(trainer, "wandb_initialized", False):
        return True  # opened, but no handle
    return run


def _applies(trainer: Any, identity: Any) -> bool:
    config = getattr(trainer, "wandb_config", None)
    return (
        bool(identity)
        and isinstance(config, dict)
        and "id" not in config
        and "resume" not in config
    )


def check_wandb_resume(trainer: Any, identity: Any) -> None:
    """Raise ValueError when restoring ``identity`` would replace a W&B run the trainer
    does not own (changes nothing)."""
    if not _applies(trainer, identity) or _open_run(trainer) is None:
        return
    previous = getattr(trainer, "_checkpoint_wandb_identity", None)
    if previous and previous.get("id") == identity["id"]:
        return
    owned = getattr(trainer, "_checkpoint_wandb_owned", None)
    if owned is None:  # our trainers start their own run (comlrl.trainers._wandb)
        owned = trainer.__dict__.get("_wandb_run") is not None
    if not owned:
        raise ValueError(
            "cannot replace an external W&B run with the checkpoint's; finish it, or pass "
            "wandb_config={'id': ..., 'resume': ...} to choose the run explicitly."
        )


def restore_wandb_identity(trainer: Any, identity: Any) -> None:
    """Point ``wandb_config`` at the checkpoint's run (see the module docstring)."""
    if not _applies(trainer, identity):
        return
    previous = getattr(trainer, "_checkpoint_wandb_identity", None)
    run = _open_run(trainer)
    if run is not None:
        if previous and previous.get("id") == identity["id"]:
            return
        if run is True:
            raise ValueError("cannot resume W&B without the trainer's own run handle")
        run.finish()
        trainer.wandb_initialized = False
        if "_wandb_run" in trainer.__dict__:
            trainer._wandb_run = None
        trainer._checkpoint_wandb_run = None
    config = dict(trainer.wandb_config)
    config.update(id=identity["id"], resume="allow")
    for key in ("project", "entity"):
        if key in identity and not config.get(key):
            config[key] = identity[key]
    trainer.wandb_config = config
    trainer._checkpoint_wandb_identity = dict(identity)
