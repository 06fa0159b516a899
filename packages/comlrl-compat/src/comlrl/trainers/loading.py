"""CoMLRL 1.4.3's data and model arguments: datasets as lists of dicts, and the agents and
tokenizers from ``agent_model`` / ``agents`` / ``tokenizer`` / ``model_config``."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["as_examples", "load_agents", "load_models", "model_kwargs"]


def as_examples(data: Any, name: str) -> list[dict[str, Any]]:
    """A ``datasets.Dataset`` / ``IterableDataset`` or a sequence of mappings as a list of
    dicts (one per example).

    Raises:
        TypeError: ``data`` is not iterable or holds something other than mappings.
        ValueError: ``data`` is empty.
    """
    if isinstance(data, (str, bytes, Mapping)) or not hasattr(data, "__iter__"):
        raise TypeError(
            f"{name} must be a datasets.Dataset or a list of dicts (one per example), got "
            f"{type(data).__name__}"
        )
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise TypeError(f"{name}[{i}] is a {type(row).__name__}, not a dict of fields: {row!r}")
        rows.append(dict(row))
    if not rows:
        raise ValueError(f"{name} is empty; give at least one example")
    return rows


def model_kwargs(model_config: Mapping[str, Any], section: str = "model_kwargs") -> dict[str, Any]:
    """``from_pretrained`` keywords from a 1.4.3 ``model_config``: ``torch_dtype``/``dtype``
    and ``attn_implementation``, top level or in its ``section`` (e.g. ``model_kwargs``)."""
    nested = model_config.get(section) or {}
    dtype = nested.get("torch_dtype") or nested.get("dtype")
    dtype = dtype or model_config.get("torch_dtype") or model_config.get("dtype")
    kwargs: dict[str, Any] = {}
    if dtype is not None and dtype != "auto":
        import torch

        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    elif dtype == "auto":
        kwargs["dtype"] = "auto"
    attn = nested.get("attn_implementation", model_config.get("attn_implementation"))
    if attn is not None:
        kwargs["attn_implementation"] = attn
    return kwargs


def load_agents(
    agent_model: Any,
    agents: Sequence[Any] | None,
    num_agents: int,
    tokenizer: Any,
    model_config: Mapping[str, Any],
    *,
    section: str = "model_kwargs",
    label: str = "agent_model",
) -> tuple[list[Any], list[Any], list[str | None]]:
    """Load or take ``A`` causal LMs and their tokenizers, as CoMLRL 1.4.3 accepts them.

    ``agent_model`` (a name/path: ``A`` independent copies are loaded; a model object only
    for one agent) or ``agents`` (``A`` names/paths or model objects). ``tokenizer``: one
    for all, a list of ``A``, or None (loaded from each name/path). ``model_config``:
    ``torch_dtype``/``dtype``, ``attn_implementation``, ``special_tokens``, and a nested
    ``model_kwargs`` section.

    Both ``agent_model`` and ``agents`` are taken when every entry of ``agents`` is that
    name, or a model loaded from it (its ``config._name_or_path``; the form of CoMLRL
    1.4.0-1.4.2 scripts, with a ``DeprecationWarning``).

    Returns:
        ``(models, tokenizers, names)``; ``names[i]`` is agent ``i``'s name/path or None.

    Raises:
        ValueError: neither of ``agent_model`` and ``agents``, or both naming different
            models (the message names them, never a model's repr); a model object for
            several agents; model objects without a tokenizer; a tokenizer list of the
            wrong length.
    """
    from transformers import AutoTokenizer

    if agent_model is None and agents is None:
        raise ValueError(
            f"Either {label} or agents must be provided: pass {label}= (a model name or "
            "path) or agents= (a list of models)."
        )
    if agent_model is not None and agents is not None:
        # CoMLRL 1.4.3 accepts both when agents repeats the agent_model name A times; the
        # scripts of 1.4.0-1.4.2 also pass the models they loaded from that name
        given = [_source_name(a) for a in agents]
        if not isinstance(agent_model, str) or any(n != agent_model for n in given):
            raise ValueError(
                f"{label}={_source_name(agent_model)!r} and agents={given!r} conflict; pass "
                f"{label}= alone, or agents= with one entry per agent."
            )
        if len(agents) != num_agents:
            raise ValueError(
                f"agents length ({len(agents)}) must equal num_agents={num_agents} when "
                f"{label}= is given too."
            )
        if not all(isinstance(a, str) for a in agents):
            warnings.warn(
                f"{label}={agent_model!r} with agents= (models loaded from it) is the form of "
                "CoMLRL 1.4.0-1.4.2 scripts, which 1.4.3 refuses; pass agents= alone.",
                DeprecationWarning,
                stacklevel=4,
            )
        agent_model = None
    if agents is not None:
        sources = list(agents)
    elif isinstance(agent_model, str):
        sources = [agent_model] * num_agents
    elif num_agents == 1:
        sources = [agent_model]
    else:
        raise ValueError(
            f"{label} must be a model name or path to build {num_agents} agents (each gets its "
            "own copy); for model objects pass agents=[model_1, ..., model_A]."
        )
    models = load_models(sources, model_config, section)
    names = [
        s if isinstance(s, str) else getattr(getattr(s, "config", None), "_name_or_path", None)
        for s in sources
    ]
    if tokenizer is None:
        missing = [i for i, s in enumerate(sources) if not isinstance(s, str)]
        if missing:
            raise ValueError(
                f"agents {missing} are model objects; pass tokenizer= (one, or a list with one "
                "per agent)."
            )
        tokenizers = [AutoTokenizer.from_pretrained(s) for s in sources]
    elif isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != len(models):
            raise ValueError(
                f"tokenizers length ({len(tokenizer)}) must equal the number of agents "
                f"({len(models)}); give one tokenizer per agent, or one for all."
            )
        tokenizers = list(tokenizer)
    else:
        tokenizers = [tokenizer] * len(models)
    special = model_config.get("special_tokens") or {}
    for tok in {id(t): t for t in tokenizers}.values():
        if special:
            tok.add_special_tokens(special)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
    return models, tokenizers, names


def _source_name(source: Any) -> str:
    """A model source as its name: a name/path as it is, a model object as its config's
    ``_name_or_path`` (or its class name): never the model's whole repr."""
    if isinstance(source, str):
        return source
    name = getattr(getattr(source, "config", None), "_name_or_path", None)
    return str(name) if name else f"<{type(source).__name__}>"


def load_models(
    sources: Sequence[Any], model_config: Mapping[str, Any], section: str = "model_kwargs"
) -> list[Any]:
    """Each name/path of ``sources`` loaded as a causal LM (``model_config`` as in
    :func:`model_kwargs`); model objects are kept as they are."""
    from transformers import AutoModelForCausalLM

    kwargs = model_kwargs(model_config, section)
    return [
        AutoModelForCausalLM.from_pretrained(s, **kwargs) if isinstance(s, str) else s
        for s in sources
    ]
