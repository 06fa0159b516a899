"""CoMLRL 1.4.3's preference trainers (``comlrl.trainers.preference``), run by
``comlrl.algos``' preference recipes: :class:`MADPOTrainer` (the MADPO recipe with pairs
built once from the initial policy), :class:`MARLHFTrainer` (``comlrl.algos``' MARLHF
pairs and reward model, then a ``comlrl.trainers`` RL trainer on it),
:class:`MADPOIterTrainer` (the MADPO-Iter recipe); the centralized names are
``comlrl.algos``' role formats under 1.4.3's names."""

from __future__ import annotations

from comlrl.trainers.preference.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl.trainers.preference.iterative import (
    MADPOIterConfig,
    MADPOIterTrainer,
    MARLHFIterConfig,
    MARLHFIterTrainer,
)
from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer
from comlrl.trainers.preference.marlhf import MARLHFConfig, MARLHFTrainer

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "JointRewardModel",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "TaggedCentralizedComparatorAdapter",
]


def __getattr__(name: str) -> object:
    if name == "JointRewardModel":  # comlrl.algos' joint reward model (loads torch)
        from comlrl.algos import JointRewardModel

        return JointRewardModel
    raise AttributeError(f"module 'comlrl.trainers.preference' has no attribute {name!r}")
