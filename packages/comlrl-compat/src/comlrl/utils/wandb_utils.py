"""CoMLRL 1.4.3's ``comlrl.utils.wandb_utils``: a ``wandb_config`` dict as ``wandb.init``
arguments."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["verbose_from_wandb_config", "wandb_init_kwargs"]


def wandb_init_kwargs(
    wandb_config: Mapping[str, Any], run_config: dict[str, Any]
) -> dict[str, Any]:
    """``wandb.init`` keyword arguments from a CoMLRL ``wandb_config``.

    Every entry of ``wandb_config["config_sections"]`` is merged into ``run_config`` (in
    place; ``dataset.name`` / ``dataset.type`` also as ``dataset_name`` / ``dataset_type``),
    and ``run_config`` itself becomes ``config``. ``project``, ``entity`` and ``name`` (or
    ``run_name``) are always present (None when unset); ``dir`` (created), ``tags`` (a
    list), ``id`` and ``resume`` only when given.
    """
    sections = wandb_config.get("config_sections")
    if isinstance(sections, Mapping):
        run_config.update(sections)
        dataset = sections.get("dataset")
        if isinstance(dataset, Mapping):
            for key in ("name", "type"):
                if dataset.get(key):
                    run_config[f"dataset_{key}"] = dataset[key]
    kwargs: dict[str, Any] = {
        "project": wandb_config.get("project"),
        "entity": wandb_config.get("entity"),
        "name": wandb_config.get("name") or wandb_config.get("run_name"),
        "config": run_config,
    }
    folder = wandb_config.get("dir")
    if folder is not None:
        os.makedirs(folder, exist_ok=True)
        kwargs["dir"] = folder
    if isinstance(wandb_config.get("tags"), list):
        kwargs["tags"] = wandb_config["tags"]
    for key in ("id", "resume"):
        if key in wandb_config:
            kwargs[key] = wandb_config[key]
    return kwargs


def verbose_from_wandb_config(wandb_config: Any) -> bool:
    """``wandb_config["config_sections"]["output"]["verbose"]`` as a bool (default True)."""
    if not isinstance(wandb_config, Mapping):
        return True
    sections = wandb_config.get("config_sections")
    output = sections.get("output") if isinstance(sections, Mapping) else None
    if isinstance(output, Mapping) and "verbose" in output:
        return bool(output["verbose"])
    return True
