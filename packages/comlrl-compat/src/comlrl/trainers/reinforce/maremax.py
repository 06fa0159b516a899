"""CoMLRL 1.4.3's module path ``comlrl.trainers.reinforce.maremax`` (group-max baseline)."""

from __future__ import annotations

from comlrl.trainers.reinforce import (
    MAReMaxConfig,
    MAReMaxTrainer,
)

__all__ = ["MAReMaxConfig", "MAReMaxTrainer"]
