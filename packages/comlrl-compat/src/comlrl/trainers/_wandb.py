"""Weights & Biases for the CoMLRL 1.4.3 trainers: whether the environment turns it off, and
its import with a message that says what to do when it is missing."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["log_row", "optional_wandb", "start_run", "wandb_disabled", "wandb_installed"]


def wandb_disabled() -> bool:
    """Whether the environment turns Weights & Biases off (``WANDB_MODE=disabled`` or
    ``WANDB_DISABLED=true``): a ``wandb_config`` is then ignored, as wandb itself would."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    flag = os.environ.get("WANDB_DISABLED", "").strip().lower()
    return mode == "disabled" or flag in ("1", "true", "yes")


def wandb_installed() -> bool:
    """Whether ``import wandb`` would find the package (without importing it; a module
    already in ``sys.modules``, such as a test's stand-in, counts)."""
    import importlib.util
    import sys

    if sys.modules.get("wandb") is not None:
        return True
    try:
        return importlib.util.find_spec("wandb") is not None
    except ValueError:  # an entry without __spec__
        return False


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "wandb_config was given but wandb is not installed; pip install "
            "'comlrl-algos[wandb]' (WANDB_MODE=offline logs without a network or login), set "
            "WANDB_MODE=disabled to ignore wandb_config, or pass wandb_config=None."
        ) from None
    return wandb


def start_run(cfg: Mapping[str, Any], trainer: Any) -> Any:
    """Start a W&B run from ``cfg`` (``project``, ``entity``, ``name``/``run_name``, ``dir``,
    ``tags``, ``id``, ``resume``); its config is ``trainer._wandb_run_config()`` when the
    trainer has one (else ``algorithm`` and ``trainer.args``' fields), with ``cfg``'s
    ``config_sections`` joined. Returns the run."""
    wandb = _import_wandb()
    if hasattr(trainer, "_wandb_run_config"):
        run_config = dict(trainer._wandb_run_config())
    else:
        run_config = {"algorithm": trainer.algorithm_name, **dataclasses.asdict(trainer.args)}
    if isinstance(cfg.get("config_sections"), dict):
        run_config.update(cfg["config_sections"])
    init = {
        "project": cfg.get("project"),
        "entity": cfg.get("entity"),
        "name": cfg.get("name") or cfg.get("run_name"),
        "config": run_config,
    }
    for key in ("dir", "tags", "id", "resume"):
        if key in cfg:
            init[key] = cfg[key]
    return wandb.init(**init)


def log_row(run: Any, cfg: Mapping[str, Any], trainer: Any, row: Mapping[str, Any]) -> Any:
    """Log ``row``'s numbers (and wandb media objects) at ``trainer.env_step`` to the W&B
    ``run``, which is started from ``cfg`` (:func:`start_run`) when ``run`` is None.
    Returns the run."""
    if run is None:
        run = start_run(cfg, trainer)
    # numbers, and W&B's own media objects (1.4.3's reward charts are wandb.Html)
    values = {k: v for k, v in row.items() if isinstance(v, (int, float)) or _is_media(v)}
    run.log(values, step=trainer.env_step)
    return run


def _is_media(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "wandb"


def optional_wandb(name: str, module: str) -> Any:
    """A module ``__getattr__`` body for 1.4.3's module attribute ``wandb``: the wandb
    module (imported on first use, not when the module loads), or None when it is not
    installed, as 1.4.3's optional import; any other ``name`` raises AttributeError."""
    if name != "wandb":
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    try:
        import wandb
    except ImportError:
        return None
    return wandb
