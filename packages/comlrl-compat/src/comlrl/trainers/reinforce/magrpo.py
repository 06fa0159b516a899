"""CoMLRL 1.4.3's module path ``comlrl.trainers.reinforce.magrpo``: MAGRPO's config and trainer
(defined in :mod:`comlrl.trainers.reinforce`), its rollout record ``NodeSample``, and
1.4.3's module attribute ``wandb`` (the wandb module, imported on first use, or None when
it is not installed)."""

from __future__ import annotations

from typing import Any

from comlrl.trainers.reinforce import (
    MAGRPOConfig,
    MAGRPOTrainer,
)
from comlrl.trainers.reinforce._records143 import NodeSample

__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "NodeSample"]


def __getattr__(name: str) -> Any:
    from comlrl.trainers._wandb import optional_wandb

    return optional_wandb(name, __name__)
