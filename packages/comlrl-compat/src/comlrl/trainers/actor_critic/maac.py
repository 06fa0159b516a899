"""CoMLRL 1.4.3's module path ``comlrl.trainers.actor_critic.maac`` (one centralised critic)."""

from __future__ import annotations

from comlrl.trainers.actor_critic import (
    MAACConfig,
    MAACTrainer,
)

__all__ = ["MAACConfig", "MAACTrainer"]
