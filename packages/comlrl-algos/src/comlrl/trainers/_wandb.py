"""Weights & Biases for the CoMLRL 1.4.3 trainers: whether the environment turns it off, and
its import with a message that says what to do when it is missing."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["log_row", "wandb_disabled"]


def wandb_disabled() -> bool:
    """Whether the environment turns Weights & Biases off (``WANDB_MODE=disabled`` or
    ``WANDB_DISABLED=true``): a ``wandb_config`` is then ignored, as wandb itself would."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    flag = os.environ.get("WANDB_DISABLED", "").strip().lower()
    return mode == "disabled" or flag in ("1", "true", "yes")


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


def log_row(run: Any, cfg: Mapping[str, Any], trainer: Any, row: Mapping[str, Any]) -> Any:
    """Log ``row``'s numbers at ``trainer.env_step`` to the W&B ``run``, which is started
    from ``cfg`` (``project``, ``entity``, ``name``/``run_name``, ``dir``, ``tags``, ``id``,
    ``resume``; ``config_sections`` join the run config beside ``trainer.args``' fields)
    when ``run`` is None. Returns the run."""
    if run is None:
        wandb = _import_wandb()
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
        run = wandb.init(**init)
    numbers = {k: v for k, v in row.items() if isinstance(v, (int, float))}
    run.log(numbers, step=trainer.env_step)
    return run
