"""CoMLRL 1.4.3's module path ``comlrl.trainers.preference.madpo``."""

from __future__ import annotations

from comlrl.trainers.preference import (
    MADPOConfig,
    MADPOTrainer,
)

__all__ = ["MADPOConfig", "MADPOTrainer"]
