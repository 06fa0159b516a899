"""CoMLRL 1.4.3's ``MAReMaxConfig`` / ``MAReMaxTrainer``: MAGRPO with
``advantage_mode="max"``, the group's best return as the baseline (after Li et al. 2023, ReMax)."""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

__all__ = ["MAReMaxConfig", "MAReMaxTrainer"]


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """:class:`MAGRPOConfig` with ``advantage_mode="max"``."""

    advantage_mode: str = "max"


class MAReMaxTrainer(MAGRPOTrainer):
    """:class:`MAGRPOTrainer` whose default config is :class:`MAReMaxConfig`."""

    config_cls = MAReMaxConfig
    algorithm_name = "MAReMax"
