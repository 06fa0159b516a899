"""Reading CoMLRL 1.4.3's own ``training_state.pt`` (so a 1.4.3 output folder can be
resumed, :mod:`comlrl.trainers._resume143`).

1.4.3 stores its snapshot as nested tagged dicts that ``torch.load(weights_only=True)``
reads: ``{"__kind__": "dict", "items": [[key, value], ...]}``, ``"list"``/``"tuple"``
(``"items"``), ``"text"`` (``"value"``: devices, dtypes, paths), ``"numpy"`` (``dtype``,
``shape``, ``data`` bytes) and ``"record"`` (a dataclass: ``class``, ``fields``). This
module decodes that layout into plain values; records become this package's classes of the
same name (``NodeSample``, ``RolloutSample``, ``PreferencePair``,
``AgentPreferenceTensors``), any other record is refused.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["decode_143", "is_143", "section_143"]

#: 1.4.3 record classes (by name) -> where this package defines them
_RECORDS = {
    "NodeSample": "comlrl.trainers.reinforce._records143",
    "RolloutSample": "comlrl.trainers.actor_critic._hooks143",
    "PreferencePair": "comlrl.trainers.preference._records143",
    "AgentPreferenceTensors": "comlrl.trainers.preference._records143",
}


def is_143(state: Any) -> bool:
    """True for the top of a CoMLRL 1.4.3 ``training_state.pt`` (a tagged dict)."""
    return isinstance(state, Mapping) and state.get("__kind__") == "dict" and "items" in state


def decode_143(value: Any) -> Any:
    """Plain values from 1.4.3's tagged encoding (see the module docstring).

    Raises:
        ValueError: an unknown tag, a record class this package does not define, or a
            NumPy object dtype.
    """
    if not isinstance(value, Mapping) or "__kind__" not in value:
        return value
    kind = value["__kind__"]
    if kind == "dict":
        return {decode_143(k): decode_143(v) for k, v in value["items"]}
    if kind in ("list", "tuple"):
        items = [decode_143(v) for v in value["items"]]
        return tuple(items) if kind == "tuple" else items
    if kind == "text":
        return str(value["value"])
    if kind == "numpy":
        import numpy as np

        dtype = np.dtype(value["dtype"])
        if dtype.hasobject:
            raise ValueError("a NumPy object array is not a valid checkpoint value")
        return np.frombuffer(value["data"], dtype=dtype).reshape(value["shape"]).copy()
    if kind == "record":
        name = str(value["class"]).rpartition(".")[2]
        if name not in _RECORDS:
            raise ValueError(f"the 1.4.3 checkpoint holds a {value['class']} record, not read here")
        cls = getattr(importlib.import_module(_RECORDS[name]), name)
        return cls(**{k: decode_143(v) for k, v in value["fields"].items()})
    raise ValueError(f"unknown 1.4.3 checkpoint value tag {kind!r}")


def section_143(state: Mapping[str, Any]) -> dict[str, Any]:
    """The run identity of a decoded 1.4.3 snapshot in :data:`SECTION`'s keys (with
    ``comlrl143: True``), for ``read_checkpoint_metadata`` and resuming."""
    return {
        "comlrl143": True,
        "version": state.get("version"),
        "trainer_class": state.get("trainer_class"),
        "sequence": state.get("sequence"),
        "run_id": state.get("run_id"),
        "wandb": state.get("wandb"),
    }
