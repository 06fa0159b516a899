"""CoMLRL 1.4.3's module path ``comlrl.trainers.reinforce.mareinforce`` (no baseline)."""

from __future__ import annotations

from comlrl.trainers.reinforce import (
    MAREINFORCEConfig,
    MAREINFORCETrainer,
)

__all__ = ["MAREINFORCEConfig", "MAREINFORCETrainer"]
