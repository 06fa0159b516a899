"""CoMLRL 1.4.3's module path ``comlrl.trainers.preference.marlhf``."""

from __future__ import annotations

from comlrl.trainers.preference import (
    JointRewardModel,
    MARLHFConfig,
    MARLHFTrainer,
)

__all__ = ["JointRewardModel", "MARLHFConfig", "MARLHFTrainer"]
