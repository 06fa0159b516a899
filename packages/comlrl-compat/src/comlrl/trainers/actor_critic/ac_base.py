"""CoMLRL 1.4.3's module path ``comlrl.trainers.actor_critic.ac_base``: the actor-critic trainers'
base class."""

from __future__ import annotations

from comlrl.trainers.actor_critic import (
    ActorCriticTrainerBase,
)

__all__ = ["ActorCriticTrainerBase"]
