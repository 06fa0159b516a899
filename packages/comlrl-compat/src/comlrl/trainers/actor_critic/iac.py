"""CoMLRL 1.4.3's module path ``comlrl.trainers.actor_critic.iac`` (independent actor-critic)."""

from __future__ import annotations

from comlrl.trainers.actor_critic import (
    IACConfig,
    IACTrainer,
)

__all__ = ["IACConfig", "IACTrainer"]
