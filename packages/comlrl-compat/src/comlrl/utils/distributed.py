"""CoMLRL 1.4.3's ``comlrl.utils.distributed``: the single-process context its trainers
use. Multi-process training here is ``comlrl.algos`` under ``torchrun``
(``data_parallel``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DistributedContext", "local_context", "unwrap_model"]


@dataclass(frozen=True)
class DistributedContext:
    """Whether this process is the main one, and its device."""

    is_main: bool
    device: torch.device


def local_context(device: torch.device | str | None = None) -> DistributedContext:
    """The context of a single process on ``device`` (default: CUDA when available, else
    the CPU)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return DistributedContext(is_main=True, device=torch.device(device))


def unwrap_model(model: Any) -> Any:
    """The model inside a ``DistributedDataParallel``-style wrapper (its ``module``), or
    ``model`` itself."""
    return getattr(model, "module", model)
