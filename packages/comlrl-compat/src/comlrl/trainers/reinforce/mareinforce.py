"""CoMLRL 1.4.3's ``MAREINFORCEConfig`` / ``MAREINFORCETrainer``: MAGRPO with
``advantage_mode="raw"``, no baseline: the advantage is the return (Williams 1992)."""

from __future__ import annotations

from dataclasses import dataclass

from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

__all__ = ["MAREINFORCEConfig", "MAREINFORCETrainer"]


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """:class:`MAGRPOConfig` with ``advantage_mode="raw"``."""

    advantage_mode: str = "raw"


class MAREINFORCETrainer(MAGRPOTrainer):
    """:class:`MAGRPOTrainer` whose default config is :class:`MAREINFORCEConfig`."""

    config_cls = MAREINFORCEConfig
    algorithm_name = "MAREINFORCE"
