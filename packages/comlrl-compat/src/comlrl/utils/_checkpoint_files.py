"""Reading and writing the files of :mod:`comlrl.utils.checkpoint`: the trainer's part of
a checkpoint (:data:`SECTION` inside ``comlrl.algos``' recipe state, or a whole attribute
snapshot), ``read_checkpoint_metadata`` and the checks of the ``train()`` options."""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comlrl.utils._checkpoint_143 import decode_143, is_143, section_143
from comlrl.utils._checkpoint_wandb import check_identity, check_run_id
from comlrl.utils._trainer_snapshot import (
    capture_trainer_state,
    decode,
    encode,
    global_rng,
    set_global_rng,
)

__all__ = [
    "CHECKPOINT_NAME",
    "CHECKPOINT_VERSION",
    "SECTION",
    "STATE_FILENAME",
    "check_checkpoint_options",
    "check_section",
    "load_state",
    "read_checkpoint_metadata",
    "state_file",
    "write_snapshot",
]

#: the version of :data:`SECTION`'s layout
CHECKPOINT_VERSION = 1
#: the file holding the training state (1.4.3's name, and ``comlrl.algos``')
STATE_FILENAME = "training_state.pt"
#: the key of the trainer's part inside the format's recipe state
SECTION = "comlrl_trainers"
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def state_file(checkpoint: str | Path) -> Path:
    path = Path(checkpoint).expanduser()
    return path / STATE_FILENAME if path.is_dir() or path.suffix != ".pt" else path


def load_state(checkpoint: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``training_state.pt`` of a checkpoint folder (or the file itself), read on the CPU
    with ``weights_only=True``, and the trainer's part of it: :data:`SECTION` of a recipe
    run's checkpoint, the whole decoded snapshot of a trainer without one
    (:func:`capture_trainer_state`), or, for a folder CoMLRL 1.4.3 wrote, its decoded
    snapshot and its identity (:func:`comlrl.utils._checkpoint_143.section_143`).

    Raises:
        FileNotFoundError: there is no such file.
        ValueError: the file is no checkpoint of either (e.g. a ``comlrl train`` run's).
    """
    import torch
    from comlrl.algos.training.checkpoint import RECIPE_STATE

    path = state_file(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"no training state at {str(path)!r}: not a checkpoint folder")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and {"trainer_class", "models", "progress"} <= set(state):
        snapshot = decode(state)
        return snapshot, snapshot
    if is_143(state):  # a folder CoMLRL 1.4.3 wrote
        decoded = decode_143(state)
        return decoded, section_143(decoded)
    section = state.get(RECIPE_STATE, {}).get(SECTION) if isinstance(state, dict) else None
    if not isinstance(section, dict):
        raise ValueError(
            f"{str(path)!r} is not a checkpoint comlrl.trainers (or CoMLRL 1.4.3) wrote; resume "
            "with one that train(checkpoint_dir=...) or save_checkpoint() wrote."
        )
    return dict(state), section


def check_section(section: Mapping[str, Any], where: str) -> None:
    """Raise ValueError (naming the field) unless ``section`` holds a valid run identity:
    version, trainer class, sequence, run id and W&B identity."""
    missing = [k for k in ("version", "trainer_class", "sequence") if k not in section]
    if missing:
        raise ValueError(f"Incomplete checkpoint metadata in {where}: no {', '.join(missing)}")
    if type(section["version"]) is not int or section["version"] != CHECKPOINT_VERSION:
        raise ValueError(f"{where}: checkpoint version {section['version']!r}; this one reads 1")
    if not isinstance(section["trainer_class"], str) or not section["trainer_class"]:
        raise ValueError(f"{where}: invalid trainer class {section['trainer_class']!r}")
    seq = section["sequence"]
    if type(seq) is not int or seq < 0:
        raise ValueError(f"{where}: invalid sequence {seq!r} (a count >= 0)")
    check_run_id(section.get("run_id"), where)
    check_identity(section.get("wandb"), where)


def _read_raw(path: Path) -> Any:
    """``torch.load`` on the CPU, weights only, memory-mapped where torch supports it."""
    import inspect

    import torch

    options: dict[str, Any] = {"map_location": "cpu", "weights_only": True}
    if "mmap" in inspect.signature(torch.load).parameters:
        options["mmap"] = True
    return torch.load(path, **options)


def read_checkpoint_metadata(checkpoint: str | Path) -> dict[str, Any]:
    """What a checkpoint says about its run, read before any trainer is built; nothing is
    restored and no training record is decoded.

    Args:
        checkpoint: a checkpoint folder or its ``training_state.pt`` (ours, or one CoMLRL
            1.4.3 wrote).

    Returns:
        ``{"version", "trainer_class", "sequence", "run_id", "wandb"}`` (1.4.3's keys):
        ``wandb`` is ``None`` or ``{"id", "project"?, "entity"?}``, which a script can pass
        on as ``wandb_config={..., "id": ..., "resume": "allow"}``.

    Raises:
        FileNotFoundError, ValueError: no checkpoint there, or a malformed one.
    """
    from comlrl.algos.training.checkpoint import RECIPE_STATE

    path = state_file(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"no training state at {str(path)!r}: not a checkpoint folder")
    raw = _read_raw(path)
    keys = ("version", "trainer_class", "sequence", "run_id", "wandb")
    if is_143(raw):
        fields = {k: v for k, v in raw["items"] if isinstance(k, str) and k in keys}
        section = {k: decode_143(v) for k, v in fields.items()}
    elif isinstance(raw, dict) and "trainer_class" in raw and "models" in raw:
        section = {k: raw[k] for k in keys if k in raw}  # a snapshot: these are plain
    elif isinstance(raw, dict) and isinstance(raw.get(RECIPE_STATE, {}).get(SECTION), dict):
        section = raw[RECIPE_STATE][SECTION]
    else:
        raise ValueError(
            f"{str(path)!r} is not a checkpoint comlrl.trainers (or CoMLRL 1.4.3) wrote"
        )
    check_section(section, str(checkpoint))
    return {k: section.get(k) for k in keys}


def check_checkpoint_options(interval: Any, total_limit: Any) -> None:
    """1.4.3's checks of ``checkpoint_interval`` (an int >= 1) and
    ``checkpoint_total_limit`` (None or an int >= 1); ``True``/``1.0``/``"1"`` are refused.

    Raises:
        ValueError: naming the option and the value.
    """
    if isinstance(interval, bool) or not isinstance(interval, numbers.Integral) or interval < 1:
        raise ValueError(f"checkpoint_interval must be a positive integer, got {interval!r}")
    if total_limit is not None and (
        isinstance(total_limit, bool)
        or not isinstance(total_limit, numbers.Integral)
        or total_limit < 1
    ):
        raise ValueError(
            f"checkpoint_total_limit must be a positive integer or None, got {total_limit!r}"
        )


def write_snapshot(target: Path, trainer: Any) -> Path:
    """Write ``training_state.pt`` holding :func:`capture_trainer_state` of ``trainer`` (the
    global random states as they were before the call) into a folder built beside
    ``target`` and renamed into place."""
    import torch
    from comlrl.algos.training.saving import atomic_folder

    streams = global_rng()
    try:
        with atomic_folder(target) as tmp:
            torch.save(encode(capture_trainer_state(trainer)), tmp / STATE_FILENAME)
    finally:
        set_global_rng(streams)
    return target
