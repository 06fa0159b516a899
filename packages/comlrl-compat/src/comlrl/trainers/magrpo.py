"""CoMLRL's pre-1.4.3 module path ``comlrl.trainers.magrpo`` (deprecated).

CoMLRL's README and "Quick Demo" import ``from comlrl.trainers.magrpo import MAGRPOConfig,
MAGRPOTrainer``; 1.4.3 moved them to ``comlrl.trainers.reinforce``. Importing this module
warns (``DeprecationWarning``). Its :class:`MAGRPOConfig` defaults to ``num_turns=1`` (the
pre-1.4.3 default) and takes the pre-1.4.3 field names of :data:`LEGACY_FIELDS`; its
:class:`MAGRPOTrainer` takes ``model=`` for ``agent_model=``; each old name warns, naming
its 1.4.3 name. Same algorithm as :class:`comlrl.trainers.reinforce.MAGRPOTrainer`.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any

from comlrl.trainers.config_fields import UnsupportedFieldError
from comlrl.trainers.reinforce import magrpo

__all__ = ["LEGACY_FIELDS", "MAGRPOConfig", "MAGRPOTrainer"]

#: pre-1.4.3 ``MAGRPOConfig`` fields -> their 1.4.3 fields (``per_device_train_batch_size``
#: was the number of examples per optimizer step: 1.4.3's ``rollout_buffer_size``)
LEGACY_FIELDS = {
    "learning_rate": "agent_learning_rate",
    "per_device_train_batch_size": "rollout_buffer_size",
    "termination_threshold": "early_termination_threshold",
}


def _importer_stacklevel() -> int:
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


def _renamed(owner: str, old: str, new: str) -> None:
    warnings.warn(
        f"{owner}({old}=...) is CoMLRL's pre-1.4.3 name; use {new}=.",
        DeprecationWarning,
        stacklevel=3,
    )


@dataclass(init=False)
class MAGRPOConfig(magrpo.MAGRPOConfig):
    """:class:`comlrl.trainers.reinforce.magrpo.MAGRPOConfig` with ``num_turns=1`` and the
    pre-1.4.3 field names.

    Raises:
        TypeError: an old name and its 1.4.3 name both given.
        UnsupportedFieldError: ``output_dir`` (no 1.4.3 counterpart).
    """

    num_turns: int = 1

    def __init__(self, **kwargs: Any) -> None:
        if "output_dir" in kwargs:
            raise UnsupportedFieldError(
                "MAGRPOConfig(output_dir=...) is a pre-1.4.3 field with no 1.4.3 counterpart; "
                "pass the folder to trainer.save_model(output_dir) after train()."
            )
        for old, new in LEGACY_FIELDS.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"MAGRPOConfig got {old}= and {new}=; pass {new}= only.")
                _renamed("MAGRPOConfig", old, new)
                kwargs[new] = kwargs.pop(old)
        kwargs.setdefault("num_turns", 1)
        magrpo.MAGRPOConfig.__init__(self, **kwargs)


class MAGRPOTrainer(magrpo.MAGRPOTrainer):
    """:class:`comlrl.trainers.reinforce.magrpo.MAGRPOTrainer` that also takes the
    pre-1.4.3 ``model=`` (for ``agent_model=``).

    Raises:
        TypeError: ``model=`` and ``agent_model=`` both given.
    """

    def __init__(self, *args: Any, model: Any = None, **kwargs: Any) -> None:
        if model is not None:
            if kwargs.get("agent_model") is not None:
                raise TypeError("MAGRPOTrainer got model= and agent_model=; pass agent_model=.")
            _renamed("MAGRPOTrainer", "model", "agent_model")
            kwargs["agent_model"] = model
        super().__init__(*args, **kwargs)
