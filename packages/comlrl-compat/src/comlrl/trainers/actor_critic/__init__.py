"""CoMLRL 1.4.3's ``comlrl.trainers.actor_critic``: IAC and MAAC on the actor-critic
recipes of ``comlrl.algos``."""

from __future__ import annotations

from comlrl.trainers.actor_critic.ac_base import ActorCriticTrainerBase
from comlrl.trainers.actor_critic.iac import IACConfig, IACTrainer
from comlrl.trainers.actor_critic.maac import MAACConfig, MAACTrainer

__all__ = [
    "ActorCriticTrainerBase",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
]
