"""CoMLRL's pre-1.4.3 module path ``comlrl.trainers.magrpo`` (deprecated).

CoMLRL's README and "Quick Demo" import ``from comlrl.trainers.magrpo import
MAGRPOConfig, MAGRPOTrainer``; CoMLRL 1.4.3 moved these to ``comlrl.trainers.reinforce``.
Importing this module warns (``DeprecationWarning``) and gives the 1.4.3 trainer and a
config whose only difference is the pre-1.4.3 default ``num_turns=1`` (CoMLRL 1.2's
default; 1.4.3's is 2, which needs an ``external_transition``). Both accept the pre-1.4.3
field names (:data:`comlrl.trainers.reinforce.LEGACY_CONFIG_FIELDS`) and
``MAGRPOTrainer(model=...)``, each with a ``DeprecationWarning``.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

from comlrl.trainers import reinforce
from comlrl.trainers.reinforce import MAGRPOTrainer, accepts_legacy_fields

__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]


def _importer_stacklevel() -> int:
    """The stacklevel of the first frame outside importlib (the ``import`` statement)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and "importlib" in frame.f_code.co_filename:
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    return level + 1


warnings.warn(
    "comlrl.trainers.magrpo is CoMLRL's pre-1.4.3 module; import MAGRPOConfig and "
    "MAGRPOTrainer from comlrl.trainers.reinforce (or comlrl.trainers).",
    DeprecationWarning,
    stacklevel=_importer_stacklevel(),
)


@accepts_legacy_fields
@dataclass
class MAGRPOConfig(reinforce.MAGRPOConfig):
    """:class:`comlrl.trainers.reinforce.MAGRPOConfig` with the pre-1.4.3 default
    ``num_turns=1``."""

    num_turns: int = 1
