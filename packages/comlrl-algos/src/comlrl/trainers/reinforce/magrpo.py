"""CoMLRL 1.4.3's module path ``comlrl.trainers.reinforce.magrpo``: MAGRPO's config and trainer
(defined in :mod:`comlrl.trainers.reinforce`)."""

from __future__ import annotations

from comlrl.trainers.reinforce import (
    MAGRPOConfig,
    MAGRPOTrainer,
)

__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]
