"""CoMLRL 1.4.3's module path ``comlrl.trainers.reinforce.centralized_magrpo`` (one joint policy)."""

from __future__ import annotations

from comlrl.trainers.reinforce import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
)

__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"]
