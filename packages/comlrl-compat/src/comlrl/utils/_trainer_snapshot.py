"""In-memory snapshots of a trainer's attributes, for trainers without a recipe run.

``comlrl.trainers``' trainers keep their state in a ``comlrl.algos`` recipe run and
checkpoint it in that format (:mod:`comlrl.utils.checkpoint`). A CoMLRL 1.4.3-style
trainer assembled by hand (1.4.3's loop hooks overridden in a subclass, models and
optimizers set as attributes) has no run; :func:`capture_trainer_state` then snapshots what
such a trainer holds, by attribute name:

- models (:data:`MODEL_FIELDS`), optimizers (:data:`OPTIMIZER_FIELDS`), schedulers
  (:data:`SCHEDULER_FIELDS`): per name ``{"many", "classes", "states"}`` (a list attribute
  or a single object; ``state_dict()`` of each);
- ``runtime``: the counters and buffers of :data:`RUNTIME_FIELDS`;
- ``callbacks``: ``state_dict()`` of stateful callbacks; ``progress`` (the epoch cursor),
  ``sequence``, ``run_id``, ``wandb``; ``config``; ``rng``: Python's, NumPy's and torch's
  global streams (and CUDA's once initialised).

:func:`encode` turns a snapshot into values ``torch.load(weights_only=True)`` reads (NumPy
arrays as bytes, the trainers' record dataclasses as tagged dicts); :func:`decode`
reverses it. :func:`restore_trainer_state` checks the whole snapshot against the trainer
first and changes nothing when it does not fit.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from comlrl.utils._checkpoint_parts import (
    PORTABLE_FIELDS,
    config_fields,
    dataset_info,
    model_info,
    stateful_callbacks,
    tokenizer_info,
)
from comlrl.utils._checkpoint_wandb import (
    check_identity,
    check_run_id,
    check_wandb_resume,
    restore_wandb_identity,
)

__all__ = [
    "MODEL_FIELDS",
    "OPTIMIZER_FIELDS",
    "RUNTIME_FIELDS",
    "SCHEDULER_FIELDS",
    "capture_trainer_state",
    "decode",
    "encode",
    "global_rng",
    "restore_trainer_state",
    "set_global_rng",
]

SNAPSHOT_VERSION = 1
MODEL_FIELDS = ("agents", "critics", "reference_models", "reward_model")
OPTIMIZER_FIELDS = ("optimizers", "agent_optimizers", "critic_optimizers", "critic_optimizer",
                    "reward_optimizer")  # fmt: skip
SCHEDULER_FIELDS = ("lr_scheduler", "lr_schedulers", "scheduler", "schedulers")
RUNTIME_FIELDS = ("env_step", "_last_train_log_step", "rollout_buffers", "_comparator_rng_states")
#: the record dataclasses a snapshot may hold (their buffers), by qualified name
RECORDS = frozenset(
    {"comlrl.trainers.reinforce._records143.NodeSample",
     "comlrl.trainers.actor_critic._hooks143.RolloutSample",
     "comlrl.trainers.preference._records143.PreferencePair",
     "comlrl.trainers.preference._records143.AgentPreferenceTensors"}
)  # fmt: skip
_RECORD, _ARRAY = "__comlrl_record__", "__comlrl_ndarray__"
_REQUIRED = ("version", "trainer_class", "config", "models", "optimizers", "schedulers",
             "runtime", "callbacks", "progress", "sequence", "rng")  # fmt: skip


def _name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def encode(value: Any) -> Any:
    """A copy of ``value`` that ``torch.load(weights_only=True)`` reads back: tensors on
    the CPU (copied), NumPy arrays and scalars as plain values, the record dataclasses of
    :data:`RECORDS` as tagged dicts, devices/dtypes/paths as text.

    Raises:
        TypeError: a value of another type (named), e.g. an arbitrary object.
    """
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("a NumPy object array cannot go into a checkpoint")
        return {_ARRAY: value.dtype.str, "shape": list(value.shape), "data": value.tobytes()}
    if isinstance(value, (torch.device, torch.dtype, Path)):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if _name(value) not in RECORDS:
            raise TypeError(f"{_name(value)} records cannot go into a checkpoint")
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {_RECORD: _name(value), "fields": fields}
    if isinstance(value, Mapping):
        return {encode(k): encode(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(encode(v) for v in value)
    if isinstance(value, list):
        return [encode(v) for v in value]
    raise TypeError(f"a {_name(value)} cannot go into a checkpoint (plain values, tensors only)")


def decode(value: Any) -> Any:
    """The inverse of :func:`encode` (records are rebuilt only from :data:`RECORDS`).

    Raises:
        ValueError: a tagged record of another class, or a NumPy object dtype.
    """
    if isinstance(value, Mapping):
        if _RECORD in value:
            name = str(value[_RECORD])
            if name not in RECORDS:
                raise ValueError(f"checkpoint record {name!r} is not one of {sorted(RECORDS)}")
            module, _, cls = name.rpartition(".")
            record = getattr(importlib.import_module(module), cls)
            return record(**{k: decode(v) for k, v in value["fields"].items()})
        if _ARRAY in value:
            dtype = np.dtype(value[_ARRAY])
            if dtype.hasobject:
                raise ValueError("a NumPy object array is not a valid checkpoint value")
            return np.frombuffer(value["data"], dtype=dtype).reshape(value["shape"]).copy()
        return {decode(k): decode(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(decode(v) for v in value)
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def _components(trainer: Any, names: tuple[str, ...]) -> dict[str, tuple[bool, list[Any]]]:
    found = {}
    for name in names:
        value = getattr(trainer, name, None)
        if value is None:
            continue
        many = isinstance(value, (list, tuple))
        items = list(value) if many else [value]
        if items and all(callable(getattr(i, "state_dict", None)) for i in items):
            found[name] = (many, items)
    return found


def _component_states(trainer: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {
        name: {
            "many": many,
            "classes": [_name(i) for i in items],
            "states": [i.state_dict() for i in items],
            "metadata": [model_info(i) for i in items],
        }
        for name, (many, items) in _components(trainer, names).items()
    }


def global_rng() -> dict[str, Any]:
    """Python's, NumPy's and torch's global random states (CUDA's once initialised)."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}  # fmt: skip
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_rng(state: Mapping[str, Any]) -> None:
    """Put back what :func:`global_rng` returned (also after :func:`decode`)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))  # type: ignore[arg-type]
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def capture_trainer_state(trainer: Any) -> dict[str, Any]:
    """A detached snapshot of ``trainer``'s attributes (see the module docstring); no
    random stream moves. The snapshot shares no tensor with the trainer."""
    callbacks = {}
    for name, obj in stateful_callbacks(trainer).items():
        if not callable(getattr(obj, "load_state_dict", None)):
            raise ValueError(f"{name} has state_dict() but no load_state_dict(); add one")
        callbacks[name] = {"class": _name(obj), "state": obj.state_dict()}
    state = {
        "version": SNAPSHOT_VERSION,
        "trainer_class": _name(trainer),
        "config": config_fields(getattr(trainer, "args", None)),
        "models": _component_states(trainer, MODEL_FIELDS),
        "optimizers": _component_states(trainer, OPTIMIZER_FIELDS),
        "schedulers": _component_states(trainer, SCHEDULER_FIELDS),
        "runtime": {n: getattr(trainer, n) for n in RUNTIME_FIELDS if hasattr(trainer, n)},
        "callbacks": callbacks,
        "progress": getattr(trainer, "_checkpoint_progress", None) or {},
        "sequence": int(getattr(trainer, "_checkpoint_sequence", 0)),
        "run_id": getattr(trainer, "_checkpoint_run_id", None),
        "wandb": getattr(trainer, "_checkpoint_wandb_identity", None),
        "rng": global_rng(),
        "dataset": dataset_info(trainer),
        "tokenizers": tokenizer_info(trainer),
    }
    return decode(encode(state))  # type: ignore[no-any-return]


def _check_components(trainer: Any, saved: Any, names: tuple[str, ...], models: bool) -> None:
    if not isinstance(saved, Mapping):
        raise ValueError(f"checkpoint components must be a dict, got {type(saved).__name__}")
    live = _components(trainer, names)
    if set(saved) != set(live):
        raise ValueError(
            f"checkpoint components {sorted(saved)} do not match the trainer's {sorted(live)}"
        )
    for name, record in saved.items():
        many, items = live[name]
        if not isinstance(record, Mapping) or not {"many", "classes", "states"} <= set(record):
            raise ValueError(f"checkpoint {name} lacks many/classes/states")
        if (
            record["many"] != many
            or len(record["classes"]) != len(items)
            or len(record["states"]) != len(items)
        ):
            raise ValueError(f"checkpoint {name}: {len(record['states'])} saved, {len(items)} now")
        metadata = record.get("metadata") or [None] * len(items)
        for obj, cls, state, info in zip(
            items, record["classes"], record["states"], metadata, strict=True
        ):
            if cls != _name(obj) or not isinstance(state, Mapping):
                raise ValueError(f"checkpoint {name} holds a {cls}; the trainer has a {_name(obj)}")
            if models:
                if info is not None and info != model_info(obj):
                    raise ValueError(
                        f"checkpoint {name}: the model configuration, generation configuration "
                        "or trainable parameters differ from the trainer's model"
                    )
                now = obj.state_dict()
                if set(now) != set(state):
                    raise ValueError(f"checkpoint {name} parameter names do not match")
                for key, tensor in now.items():
                    other = state[key]
                    if isinstance(tensor, torch.Tensor) and (
                        not isinstance(other, torch.Tensor)
                        or (other.shape, other.dtype) != (tensor.shape, tensor.dtype)
                    ):
                        raise ValueError(f"checkpoint {name}.{key}: shape or dtype differs")
            elif isinstance(obj, torch.optim.Optimizer):
                _check_optimizer(name, obj, state)


def _check_optimizer(name: str, opt: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    if not {"state", "param_groups"} <= set(state):
        raise ValueError(f"checkpoint {name}: optimizer state lacks state/param_groups")
    groups = state["param_groups"]
    if len(groups) != len(opt.param_groups) or any(
        len(g["params"]) != len(s["params"]) for g, s in zip(opt.param_groups, groups)
    ):
        raise ValueError(f"checkpoint {name}: parameter groups do not match")
    for live, saved in zip(opt.param_groups, groups):
        for param, pid in zip(live["params"], saved["params"]):
            for key, value in state["state"].get(pid, {}).items():
                if isinstance(value, torch.Tensor) and key != "step" and value.shape != param.shape:
                    raise ValueError(f"checkpoint {name}: optimizer tensor {key} has another shape")


def _check_rng(state: Any) -> None:
    if not isinstance(state, Mapping) or not {"python", "numpy", "torch"} <= set(state):
        raise ValueError("checkpoint RNG state lacks python/numpy/torch")
    try:
        version, internal, gauss = state["python"]
        random.Random().setstate((version, tuple(internal), gauss))
        np.random.RandomState().set_state(tuple(state["numpy"]))
        torch.Generator().set_state(state["torch"].cpu())
    except (TypeError, ValueError, RuntimeError, AttributeError, KeyError) as exc:
        raise ValueError(f"invalid checkpoint RNG state: {exc}") from None


def check_trainer_state(trainer: Any, state: Any) -> None:
    """Raise ValueError (naming what) when ``state`` does not fit ``trainer``; changes nothing."""
    if not isinstance(state, Mapping) or not set(_REQUIRED) <= set(state):
        raise ValueError(f"checkpoint state lacks {sorted(set(_REQUIRED) - set(state or {}))}")
    if state["version"] != SNAPSHOT_VERSION:
        raise ValueError(f"checkpoint version {state['version']!r}; this version reads 1")
    if state["trainer_class"] != _name(trainer):
        raise ValueError(
            f"checkpoint of a {state['trainer_class']}; this trainer is a {_name(trainer)}"
        )
    saved = {k: v for k, v in state["config"].items() if k not in PORTABLE_FIELDS}
    now = {
        k: v
        for k, v in config_fields(getattr(trainer, "args", None)).items()
        if k not in PORTABLE_FIELDS
    }
    if saved != now:
        changed = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        raise ValueError(f"checkpoint configuration differs in {', '.join(changed)}")
    if type(state["sequence"]) is not int or state["sequence"] < 0:
        raise ValueError(f"checkpoint sequence {state['sequence']!r} must be an int >= 0")
    check_run_id(state.get("run_id"))
    check_identity(state.get("wandb"))
    check_wandb_resume(trainer, state.get("wandb"))
    if not isinstance(state["runtime"], Mapping) or set(state["runtime"]) - set(RUNTIME_FIELDS):
        raise ValueError(
            f"unknown checkpoint runtime fields {sorted(set(state['runtime']) - set(RUNTIME_FIELDS))}"
        )
    _check_rng(state["rng"])
    if state.get("dataset", dataset_info(trainer)) != dataset_info(trainer):
        raise ValueError(
            "checkpoint training dataset differs (length or content) from train_dataset"
        )
    if state.get("tokenizers", tokenizer_info(trainer)) != tokenizer_info(trainer):
        raise ValueError(
            "checkpoint tokenizers differ (vocabulary, special tokens or chat template)"
        )
    validate = getattr(trainer, "_checkpoint_validate_progress", None)
    if callable(validate):
        validate(state)
    _check_components(trainer, state["models"], MODEL_FIELDS, models=True)
    _check_components(trainer, state["optimizers"], OPTIMIZER_FIELDS, models=False)
    _check_components(trainer, state["schedulers"], SCHEDULER_FIELDS, models=False)
    live = stateful_callbacks(trainer)
    if not isinstance(state["callbacks"], Mapping) or set(state["callbacks"]) != set(live):
        raise ValueError("checkpoint stateful callbacks do not match the trainer's")
    for name, record in state["callbacks"].items():
        if not isinstance(record, Mapping) or not {"class", "state"} <= set(record):
            raise ValueError(f"checkpoint callback {name} lacks class/state")
        if record["class"] != _name(live[name]) or not callable(
            getattr(live[name], "load_state_dict", None)
        ):
            raise ValueError(
                f"checkpoint callback {name} is a {record['class']}; now {_name(live[name])}"
            )


def restore_trainer_state(
    trainer: Any, state: Mapping[str, Any], checkpoint_dir: Any = None, restore_rng: bool = True
) -> None:
    """Put a :func:`capture_trainer_state` snapshot back into ``trainer`` (models,
    optimizer moments, schedulers, counters and buffers, callback states, cursor, random
    streams unless ``restore_rng=False``). ``state`` is not changed or aliased.

    Raises:
        ValueError: the snapshot does not fit the trainer (checked before anything changes).
    """
    check_trainer_state(trainer, state)
    for names, key in ((MODEL_FIELDS, "models"), (OPTIMIZER_FIELDS, "optimizers"),
                       (SCHEDULER_FIELDS, "schedulers")):  # fmt: skip
        live = _components(trainer, names)
        for name, record in state[key].items():
            for obj, saved in zip(live[name][1], record["states"], strict=True):
                obj.load_state_dict(decode(encode(saved)))
    for name, value in state["runtime"].items():
        setattr(trainer, name, decode(encode(value)))
    live_callbacks = stateful_callbacks(trainer)
    for name, record in state["callbacks"].items():
        live_callbacks[name].load_state_dict(decode(encode(record["state"])))
    trainer._checkpoint_progress = decode(encode(state["progress"]))
    trainer._checkpoint_sequence = int(state["sequence"])
    trainer._checkpoint_run_id = state.get("run_id")
    restore_wandb_identity(trainer, state.get("wandb"))
    if restore_rng:
        set_global_rng(state["rng"])
    trainer._checkpoint_save_blocked = False
