"""CoMLRL 1.4.3's ``RewardProcessors``: factories for a trainer's ``reward_processor=``."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["RewardProcessors"]


class RewardProcessors:
    """Reward processors: ``float -> float`` maps the trainers apply to every reward the
    ``reward_func`` returns (after the call, before advantages)."""

    @staticmethod
    def scale(factor: float = 1.0) -> Callable[[float], float]:
        """``r -> factor * r`` (reward units times ``factor``)."""
        return lambda reward: reward * factor

    @staticmethod
    def shift(value: float = 0.0) -> Callable[[float], float]:
        """``r -> r + value`` (``value`` in reward units)."""
        return lambda reward: reward + value
