"""CoMLRL 1.4.3's ``MARLOOConfig`` / ``MARLOOTrainer``: MAGRPO with
``advantage_mode="rloo"``, the leave-one-out baseline, the mean of the other G-1 returns (Kool et al. 2019; Ahmadian et al. 2024)."""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

__all__ = ["MARLOOConfig", "MARLOOTrainer"]


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """:class:`MAGRPOConfig` with ``advantage_mode="rloo"``."""

    advantage_mode: str = "rloo"


class MARLOOTrainer(MAGRPOTrainer):
    """:class:`MAGRPOTrainer` whose default config is :class:`MARLOOConfig`."""

    config_cls = MARLOOConfig
    algorithm_name = "MARLOO"
