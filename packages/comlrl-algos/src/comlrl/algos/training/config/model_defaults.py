"""Defaults by model: which set of defaults a :class:`~comlrl.algos.training.config.rl.TrainConfig`
gets, and why.

The field defaults of ``TrainConfig`` suit the built-in models (``builtin:*``: the 260K
stories260k, the 0.4M tiny-qwen2), which learn at a high learning rate in seconds on a CPU.
A run on any other model (a Hugging Face Hub id, a local folder, a ``.gguf`` file) is a
pretrained LLM, and the fields of :data:`PRETRAINED_DEFAULTS` that the config does not set
take these values instead:

==================  ======================  ==========================================
field               built-in models         pretrained LLMs (any other model)
==================  ======================  ==========================================
``optimizer``       ``radam``               ``adamw`` (RAdam's first steps are plain SGD
                                            steps: nothing at 1e-6)
``learning_rate``   ``1e-3``                ``1e-6`` (TRL's GRPO default)
``loss_reduction``  ``seq_mean_token_mean`` ``token_mean`` (TRL's and verl's default;
                                            DAPO, Yu et al. 2025); with
                                            ``importance_level=sequence``:
                                            ``seq_mean_token_mean`` (GSPO's
                                            mean over completions)
``num_generations`` ``4``                   ``8`` (a group with one success is likelier)
``max_new_tokens``  ``48``                  the task's own budget (its ``max_new_tokens``
                                            attribute, e.g. ``coop_story``: 48) when the
                                            config names a task (a mixture: the largest
                                            of its tasks'), else ``256``
==================  ======================  ==========================================

An explicit value always wins: a ``key=value`` override, a YAML key or a keyword of
``TrainConfig(...)``. One non-built-in model among the agents makes the run a pretrained
one. A local folder with a built-in model's architecture (its ``config.json``: a copy of
stories260k, or a run's ``final/agent_0`` trained from stories260k or tiny-qwen2) counts
as built in.

A learning rate of :data:`HIGH_LEARNING_RATE` or more on a pretrained model warns
(:class:`~comlrl.algos.training.run.diagnostics.TrainingWarning`, at setup, judged by the models
the agents really hold; ``--print-config`` notes it too). ``docs/real-models.md`` holds the
same table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

__all__ = [
    "BUILTIN_PREFIX",
    "GSPO_REDUCTION",
    "PRETRAINED_DEFAULTS",
    "FALLBACK_NEW_TOKENS",
    "HIGH_LEARNING_RATE",
    "ModelDefaults",
    "builtin_architecture",
    "is_builtin",
    "task_new_tokens",
    "choose_defaults",
    "learning_rate_warning",
]

#: Model names that start with this are the built-in models (keep the field defaults).
BUILTIN_PREFIX = "builtin:"

#: The defaults of a run on a pretrained LLM (any model that is not ``builtin:*``), besides
#: ``max_new_tokens`` (the task's budget or :data:`FALLBACK_NEW_TOKENS`).
PRETRAINED_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "optimizer": "adamw",
        "learning_rate": 1e-6,
        "loss_reduction": "token_mean",
        "num_generations": 8,
    }
)

#: The ``loss_reduction`` a pretrained run with ``importance_level=sequence`` (GSPO) gets
#: instead of ``token_mean``: GSPO's objective is the mean over completions of one clipped
#: term each (Zheng et al. 2025, eq. 5); the token mean weighs each completion by its length.
GSPO_REDUCTION = "seq_mean_token_mean"

#: ``max_new_tokens`` of a pretrained run whose task declares no budget (or names no task).
FALLBACK_NEW_TOKENS = 256

#: A learning rate at or above this on a pretrained model warns (about 100x TRL's 1e-6).
HIGH_LEARNING_RATE = 1e-4

_TASK_GROUP = "comlrl.tasks"


@dataclass(frozen=True)
class ModelDefaults:
    """Which set of defaults a config got and why.

    Attributes:
        kind: ``"built-in"`` (the field defaults) or ``"pretrained"``
            (:data:`PRETRAINED_DEFAULTS`).
        reason: why, in words (the first model that is not built in, or that all are).
        filled: the fields this set gave a value because the config left them unset
            (empty for ``built-in``: the field defaults are the built-in set).
    """

    kind: Literal["built-in", "pretrained"]
    reason: str
    filled: Mapping[str, Any] = field(default_factory=dict)

    def header(self) -> str:
        """One line for the run's header and ``--print-config``: the set, why, and the
        values it filled in."""
        if self.kind == "built-in":
            return f"defaults for the built-in models ({self.reason})"
        given = ", ".join(f"{k}={v}" for k, v in self.filled.items())
        return (
            f"defaults for pretrained LLMs ({self.reason}): "
            f"{given or 'none filled in: the config sets them all'} "
            "(an explicit value wins; docs/real-models.md#defaults-by-model)"
        )


#: The ``config.json`` keys that say a local folder holds a built-in model's architecture.
_ARCHITECTURE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")


def builtin_architecture(name: str) -> str | None:
    """The built-in model whose architecture the local folder ``name`` holds (a copy of
    ``builtin:stories260k``, or a run's ``final/agent_0`` trained from ``builtin:stories260k``
    or ``builtin:tiny-qwen2``), judged by its ``config.json`` (model type, hidden size,
    layers, vocabulary); ``None`` for anything else. Reads one small file; never downloads."""
    from comlrl.algos.models.loading import (
        STORIES260K,
        TINY_QWEN2,
        builtin_model_path,
        tiny_qwen2_config,
    )

    config = Path(str(name)) / "config.json"
    if str(name).startswith(BUILTIN_PREFIX) or not config.is_file():
        return None
    try:
        mine = json.loads(config.read_text())
        stories = json.loads((builtin_model_path(STORIES260K) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(mine, dict):
        return None
    builtins = {STORIES260K: stories, TINY_QWEN2: tiny_qwen2_config().to_dict()}
    for builtin, theirs in builtins.items():
        if all(mine.get(k) == theirs.get(k) for k in _ARCHITECTURE_KEYS):
            return builtin
    return None


def is_builtin(name: str) -> bool:
    """``name`` is a built-in model (``builtin:...``) or a local folder holding one's
    architecture (:func:`builtin_architecture`)."""
    return str(name).startswith(BUILTIN_PREFIX) or builtin_architecture(name) is not None


def task_new_tokens(task_name: str) -> int | None:
    """The new-token budget a registered task declares (its factory's ``max_new_tokens``
    attribute), or ``None``: the task declares none, or no task of that name is
    registered (the task's own check reports that later)."""
    for ep in metadata.entry_points(group=_TASK_GROUP):
        if ep.name == task_name:
            try:
                budget = getattr(ep.load(), "max_new_tokens", None)
            except Exception:  # a suite that fails to import is reported by the task check
                return None
            return budget if isinstance(budget, int) and budget > 0 else None
    return None


def _task_names(task: Any) -> list[str]:
    """The registered tasks a config's ``task`` (a mapping or a ``TaskConfig``; ``None``:
    not given) trains on: each entry of its ``mixture``, else its ``name`` (default
    ``coop_story``)."""
    if task is None:
        return []
    get = (
        task.get if isinstance(task, Mapping) else lambda key, default: getattr(task, key, default)
    )
    mixture = get("mixture", None) or []
    if mixture:
        entries = [
            e.get("name") if isinstance(e, Mapping) else getattr(e, "name", None) for e in mixture
        ]
        return [str(e) for e in entries if e is not None]
    return [str(get("name", "coop_story"))]


def choose_defaults(
    data: Mapping[str, Any], default_models: Sequence[str]
) -> tuple[dict[str, Any], ModelDefaults]:
    """The config mapping ``data`` with the defaults of its models filled in, and which set
    that was.

    Args:
        data: the mapping the config is validated from (the keys it has are the explicit
            values; they are never changed).
        default_models: the models when ``data`` has no ``models`` key.

    Returns:
        ``(data with the unset fields of the chosen set added, ModelDefaults)``; for
        built-in models ``data`` comes back as given.
    """
    models = data.get("models", default_models)
    names = [str(m) for m in models] if isinstance(models, list | tuple) else [str(models)]
    other = next((m for m in names if not is_builtin(m)), None)
    if other is None:
        copies = {m: builtin_architecture(m) for m in names}
        held = ", ".join(f"{m}: {b}" for m, b in sorted(copies.items()) if b is not None)
        reason = "every agent's model is builtin:*" + (
            f" or holds a built-in model's architecture ({held})" if held else ""
        )
        return dict(data), ModelDefaults("built-in", reason)
    values = dict(PRETRAINED_DEFAULTS)
    if data.get("importance_level") == "sequence":
        # GSPO's objective is a mean over completions of one term each; the token mean
        # would weigh each completion by its length
        values["loss_reduction"] = GSPO_REDUCTION
    names = _task_names(data.get("task"))
    budgets = [b for b in (task_new_tokens(n) for n in names) if b is not None]
    values["max_new_tokens"] = max(budgets, default=FALLBACK_NEW_TOKENS)
    filled = {k: v for k, v in values.items() if k not in data}
    reason = f"{other} is not a built-in model"
    return {**data, **filled}, ModelDefaults("pretrained", reason, filled)


def learning_rate_warning(models: Sequence[str], learning_rate: float) -> str | None:
    """The warning for a learning rate of :data:`HIGH_LEARNING_RATE` or more on a pretrained
    model, or ``None``."""
    other = next((m for m in models if not is_builtin(m)), None)
    if other is None or learning_rate < HIGH_LEARNING_RATE:
        return None
    return (
        f"learning_rate={learning_rate:g} on the pretrained model {other}: about "
        f"{learning_rate / PRETRAINED_DEFAULTS['learning_rate']:.0f}x the pretrained default "
        f"{PRETRAINED_DEFAULTS['learning_rate']:g}; rates of 1e-4 and more suit the built-in "
        "models and usually wreck a pretrained LLM in a few steps (try 1e-6 to 2e-5)."
    )
