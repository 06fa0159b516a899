"""CoMLRL 1.4.3's module path ``comlrl.trainers.preference.iterative`` (rounds of comparisons)."""

from __future__ import annotations

from comlrl.trainers.preference import (
    MADPOIterConfig,
    MADPOIterTrainer,
    MARLHFIterConfig,
    MARLHFIterTrainer,
)

__all__ = ["MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]
