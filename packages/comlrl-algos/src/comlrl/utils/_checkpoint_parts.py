"""The trainer-side pieces of :mod:`comlrl.utils.checkpoint`: the config as plain values,
NumPy's global random state as plain values (``torch.load(weights_only=True)`` reads it)
and the stateful callbacks whose ``state_dict()`` a checkpoint keeps."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: config fields a resumed run may change (they do not change what a step computes)
PORTABLE_FIELDS = frozenset(
    {"num_train_epochs", "logging_steps", "agent_devices", "critic_devices",
     "reference_devices", "parallel_training", "eval_batch_size"}
)  # fmt: skip

__all__ = [
    "PORTABLE_FIELDS",
    "config_fields",
    "numpy_state",
    "plain",
    "set_numpy_state",
    "stateful_callbacks",
]


def plain(value: Any) -> Any:
    """``value`` as ints, floats, strings, lists and dicts (config fields, for comparing)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


def config_fields(args: Any) -> dict[str, Any]:
    """The fields of a config dataclass (or object) as plain values, private ones left out."""
    if args is None:
        return {}
    values = (
        {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
        if dataclasses.is_dataclass(args)
        else dict(vars(args))
    )
    return {k: plain(v) for k, v in values.items() if not k.startswith("_")}


def numpy_state() -> list[Any]:
    """NumPy's global random state as plain values (MT19937 keys as ints)."""
    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state()  # type: ignore[misc]
    return [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]


def set_numpy_state(state: list[Any]) -> None:
    """Put back what :func:`numpy_state` returned."""
    import numpy as np

    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def stateful_callbacks(trainer: Any) -> dict[str, Any]:
    """The callbacks with ``state_dict``/``load_state_dict`` (1.4.3 saves their state)."""
    found = {n: getattr(trainer, n, None) for n in
             ("reward_func", "reward_processor", "external_transition", "eval_logger",
              "eval_aggregator", "train_dataset", "eval_dataset")}  # fmt: skip
    for i, fmt in enumerate(getattr(trainer, "formatters", None) or []):
        found[f"formatters.{i}"] = getattr(fmt, "__wrapped__", fmt)
    return {n: c for n, c in found.items() if callable(getattr(c, "state_dict", None))}
