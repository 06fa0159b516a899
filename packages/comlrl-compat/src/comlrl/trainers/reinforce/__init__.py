"""CoMLRL 1.4.3's ``comlrl.trainers.reinforce``: MAGRPO and its estimator variants
(MAREINFORCE, MARLOO, MAReMax) and centralized MAGRPO, on the group-baseline recipe of
``comlrl.algos``."""

from __future__ import annotations

from comlrl.trainers.reinforce.centralized_magrpo import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
)
from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
from comlrl.trainers.reinforce.mareinforce import MAREINFORCEConfig, MAREINFORCETrainer
from comlrl.trainers.reinforce.maremax import MAReMaxConfig, MAReMaxTrainer
from comlrl.trainers.reinforce.marloo import MARLOOConfig, MARLOOTrainer

__all__ = [
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
]
