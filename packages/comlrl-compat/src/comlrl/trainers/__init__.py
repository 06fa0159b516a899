"""comlrl.trainers: CoMLRL 1.4.3's trainer API on comlrl.algos' recipes.

Scripts written for CoMLRL 1.4.3 (``from comlrl.trainers import MAGRPOConfig,
MAGRPOTrainer`` and friends) run against this package: the config dataclasses have the
same fields and defaults, the trainers the same constructor arguments, ``train()``,
``evaluate()`` and ``save_model(dir)``. Settings we do not implement raise
:class:`UnsupportedFieldError`; what we do differently on purpose is listed in
``docs/compat.md``. It is the ``comlrl-compat`` distribution (with ``datasets``).

Names load lazily (PEP 562): importing this package does not import ``transformers``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "MAGRPOConfig": "reinforce",
    "MAGRPOTrainer": "reinforce",
    "MAREINFORCEConfig": "reinforce",
    "MAREINFORCETrainer": "reinforce",
    "MARLOOConfig": "reinforce",
    "MARLOOTrainer": "reinforce",
    "MAReMaxConfig": "reinforce",
    "MAReMaxTrainer": "reinforce",
    "ActorCriticTrainerBase": "actor_critic",
    "IACConfig": "actor_critic",
    "IACTrainer": "actor_critic",
    "MAACConfig": "actor_critic",
    "MAACTrainer": "actor_critic",
    "MADPOConfig": "preference",
    "MADPOTrainer": "preference",
    "MARLHFConfig": "preference",
    "MARLHFTrainer": "preference",
    "JointRewardModel": "preference",
    "CentralizedMAGRPOConfig": "reinforce",
    "CentralizedMAGRPOTrainer": "reinforce",
    "MADPOIterConfig": "preference",
    "MADPOIterTrainer": "preference",
    "MARLHFIterConfig": "preference",
    "MARLHFIterTrainer": "preference",
    "CentralizedComparatorAdapter": "preference",
    "CentralizedComparatorParseError": "preference",
    "TaggedCentralizedComparatorAdapter": "preference",
    "UnsupportedFieldError": "config_fields",
    "UnsupportedTrainerError": "config_fields",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'comlrl.trainers' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"comlrl.trainers.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
