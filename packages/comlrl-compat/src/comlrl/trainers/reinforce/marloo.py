"""CoMLRL 1.4.3's module path ``comlrl.trainers.reinforce.marloo`` (leave-one-out baseline)."""

from __future__ import annotations

from comlrl.trainers.reinforce import (
    MARLOOConfig,
    MARLOOTrainer,
)

__all__ = ["MARLOOConfig", "MARLOOTrainer"]
