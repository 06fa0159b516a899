"""The trainer-side pieces of :mod:`comlrl.utils.checkpoint`: the config as plain values,
NumPy's global random state as plain values (``torch.load(weights_only=True)`` reads it)
and the stateful callbacks whose ``state_dict()`` a checkpoint keeps."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

#: config fields a resumed run may change (they do not change what a step computes)
PORTABLE_FIELDS = frozenset(
    {"num_train_epochs", "logging_steps", "agent_devices", "critic_devices",
     "reference_devices", "parallel_training", "eval_batch_size", "comparator_devices",
     "reward_model_device", "reference_device", "verbose"}
)  # fmt: skip

__all__ = [
    "PORTABLE_FIELDS",
    "dataset_info",
    "model_info",
    "tokenizer_info",
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


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


#: config keys that name where or when a model was saved, not what it computes
_TRANSIENT = ("_name_or_path", "transformers_version", "_commit_hash", "_from_model_config")


def model_info(model: Any) -> dict[str, Any]:
    """What must match, beyond shapes, for a model's saved weights to mean the same:
    which parameters train (``requires_grad``) and digests of its ``config`` and
    ``generation_config`` (``to_dict()``, paths and versions left out)."""
    import torch

    info: dict[str, Any] = {}
    if isinstance(model, torch.nn.Module):
        info["requires_grad"] = {n: bool(p.requires_grad) for n, p in model.named_parameters()}
    for name in ("config", "generation_config"):
        to_dict = getattr(getattr(model, name, None), "to_dict", None)
        if callable(to_dict):
            values = {k: v for k, v in to_dict().items() if k not in _TRANSIENT}
            info[name] = _digest(values)
    return info


def tokenizer_info(trainer: Any) -> list[dict[str, Any]]:
    """Per tokenizer of ``trainer.tokenizers``: its class and digests of its vocabulary,
    special tokens, chat template and padding/truncation sides."""
    out = []
    for tok in getattr(trainer, "tokenizers", None) or []:
        info: dict[str, Any] = {"class": type(tok).__qualname__}
        if callable(getattr(tok, "get_vocab", None)):
            info["vocab"] = _digest(tok.get_vocab())
        for name in ("special_tokens_map", "chat_template", "padding_side", "truncation_side"):
            if hasattr(tok, name):
                info[name] = _digest(getattr(tok, name))
        out.append(info)
    return out


def dataset_info(trainer: Any) -> dict[str, Any] | None:
    """``train_dataset``'s class, length and content digest (a ``datasets.Dataset``'s own
    fingerprint, else a digest of its rows), or None without one."""
    data = getattr(trainer, "train_dataset", None)
    if data is None:
        return None
    try:
        length: int | None = len(data)
    except TypeError:
        length = None
    fingerprint = getattr(data, "_fingerprint", None)
    if fingerprint is None and isinstance(data, (list, tuple)):
        fingerprint = _digest(list(data))
    return {"class": type(data).__qualname__, "length": length, "fingerprint": fingerprint}
