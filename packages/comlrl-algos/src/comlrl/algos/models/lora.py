"""Agents as LoRA adapters on a frozen base model (extra ``comlrl-algos[lora]``: ``peft``).

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", Eq. 3): a
targeted weight ``W [out, in]`` acts as ``W + (alpha / r) * B A`` with ``A [r, in]`` and
``B [out, r]`` trained and ``W`` frozen; ``B`` starts at zero, so an agent starts as its
base model. :func:`attach_lora` turns the agents of a run into adapters:

- ``shared_base=True``: ONE frozen base for all agents, with one named peft adapter per
  agent (``agent_0``, ``agent_1``, ...; ``PeftModel.add_adapter``). Memory is about one
  base plus ``A`` adapters.
- ``shared_base=False``: each agent's own base gets its own adapter.

Each agent's ``model`` becomes a :class:`LoraPolicy`: a view of one adapter. Why a view
and how agents interleave on a shared base: peft's active adapter is state of the
injected layers, shared by every agent on the base. Every call of a view (forward,
``generate``, the adapter-disabled reference) therefore switches the layers to its own
adapter and runs under the base's lock, so concurrent sampling threads never see another
agent's adapter. Backward passes need no switch (the autograd graph recorded which
``A``/``B`` each forward used); the optimizer of an agent holds only its own adapter's
parameters (:meth:`LoraPolicy.parameters`), so one agent's step never touches another's
adapter or the base. Updates of agents on one base still run one after another
(:func:`model_key` tells the recipe which agents share a base): peft's adapter switch
flips ``requires_grad`` flags that a concurrent backward would read.

The KL reference of a LoRA agent is its base with the adapters disabled
(:class:`LoraReference`, ``PeftModel.disable_adapter``): no copy of the base.

Checkpoints (:meth:`LoraPolicy.save_pretrained`) hold the adapter in peft's format
(``adapter_config.json`` + ``adapter_model.safetensors``; load with
``PeftModel.from_pretrained(base, path)``) and, with ``merge=True``, the merged weights
``W + (alpha / r) B A`` in ``path/merged`` (load with
``AutoModelForCausalLM.from_pretrained(path / "merged")``, no peft needed).

The fast decode step (:class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder`)
applies vanilla LoRA adapters itself (a low-rank delta per block of rows:
:mod:`comlrl.algos.rollout.sampling.fast_decode.lora`), checked once per sampler against
peft's forward; ``benchmarks/bench_lora_decode.py`` measures LoRA decoding against the base.

The settings (:class:`LoraSettings`, the ``lora:`` config key) are defined here, beside the
code that applies them. The views themselves (:class:`~comlrl.algos.models.lora_policy.LoraPolicy`,
:class:`~comlrl.algos.models.lora_policy.SharedBase`,
:class:`~comlrl.algos.models.lora_policy.LoraReference`) live in
:mod:`~comlrl.algos.models.lora_policy`; this module builds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from comlrl.algos.models.lora_policy import (
    LoraPolicy,
    LoraReference,
    SharedBase,
    require_peft,
)
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "LoraSettings",
    "attach_lora",
    "is_lora_policy",
    "model_key",
    "reference_model",
    "unique_parameter_bytes",
]


class LoraSettings(BaseModel):
    """Agents as LoRA adapters on a frozen base model (``lora:`` section; extra
    ``comlrl-algos[lora]``, which installs ``peft``).

    LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", Eq. 3):
    each targeted weight ``W [out, in]`` becomes ``W + (alpha / r) * B A`` with
    ``A [r, in]``, ``B [out, r]`` trained and ``W`` frozen; ``B`` starts at zero, so every
    agent starts as its base model.

    Attributes:
        r: rank of each adapter.
        alpha: scale numerator; the update is scaled by ``alpha / r``.
        dropout: dropout on the adapter's input, in ``[0, 1)``. The policy-gradient and
            DPO updates run in eval mode (the mode completions are sampled in), where it
            is off; it acts in SFT and reward-model training.
        target_modules: names (suffixes) of the linear layers that get adapters, or
            ``"all-linear"`` (every linear layer but the LM head).
        shared_base: ``true``: one frozen base in memory for all agents, one named adapter
            per agent on it (memory about one base + ``A`` adapters); needs one model for
            all agents and all agents on one device. ``false``: each agent gets its own
            base (``A`` bases; agents may then differ in model and device).
        merge_adapters: checkpoints also hold each agent's merged weights
            (``W + (alpha / r) B A``) in ``agent_<i>/merged/``, loadable without peft.
        batch_agents: with ``shared_base``, the agents sample in one batch (one forward
            per token for all of them, each row through its own adapter) and the
            group-baseline recipes update them in one forward and backward per
            micro-batch; the same samples and updates as one agent after another, to
            float rounding. ``false``: one agent after another.
    """

    model_config = ConfigDict(extra="forbid")

    r: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    shared_base: bool = True
    merge_adapters: bool = False
    batch_agents: bool = True

    @field_validator("target_modules")
    @classmethod
    def _targets_not_empty(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list) and (not v or any(not isinstance(m, str) or not m for m in v)):
            raise ValueError(
                f"target_modules must name at least one module (e.g. [q_proj, v_proj]) or be "
                f"'all-linear', got {v!r}"
            )
        return v


def is_lora_policy(model: Any) -> bool:
    """Whether ``model`` is a :class:`LoraPolicy`."""
    return bool(getattr(type(model), "is_lora_policy", False))


def model_key(model: Any) -> int:
    """Identity of the weights behind ``model``: agents with equal keys share a base and
    must not be updated concurrently."""
    if is_lora_policy(model):
        return id(model.shared)
    return id(model)


def reference_model(model: Any, device: torch.device | None = None) -> Any:
    """The frozen KL reference of a policy.

    A :class:`LoraPolicy` gets a :class:`LoraReference` (its base, adapters disabled, no
    copy); any other model a deep copy in eval mode without gradients, on ``device``
    (default: the model's).
    """
    import copy

    if is_lora_policy(model):
        return LoraReference(model)
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    return ref.to(device) if device is not None else ref


def _lora_config(settings: LoraSettings) -> Any:
    peft = require_peft()
    target = settings.target_modules
    return peft.LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=target if isinstance(target, str) else list(target),
        bias="none",
        task_type="CAUSAL_LM",
    )


def _same_architecture(a: Any, b: Any) -> bool:
    ca, cb = getattr(a, "config", None), getattr(b, "config", None)
    if ca is None or cb is None:
        return a is b
    keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
    return all(getattr(ca, k, None) == getattr(cb, k, None) for k in keys)


def attach_lora(agents: Sequence[Any], settings: LoraSettings, *, seed: int = 0) -> None:
    """Turn each agent's model into a :class:`LoraPolicy` (in place: ``agent.replace_model``).

    With ``settings.shared_base`` agent 0's model becomes the one frozen base and the
    other agents' models are dropped (they must be the same architecture; pass the same
    weights). Adapters are named ``agent_<i>``; their ``A`` matrices are drawn from a
    stream seeded by ``seed`` (torch's global stream is left as it was). Agents whose
    model is already a :class:`LoraPolicy` are left alone.

    Raises:
        ImportError: peft is missing.
        ValueError: with ``shared_base``, agents whose models differ in architecture; a
            ``target_modules`` name that matches no layer (peft's message).
    """
    peft = require_peft()
    todo = [(i, a) for i, a in enumerate(agents) if not is_lora_policy(a.model)]
    if not todo:
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if settings.shared_base:
            base = todo[0][1].model
            for i, agent in todo[1:]:
                if not _same_architecture(base, agent.model):
                    raise ValueError(
                        f"lora.shared_base=true: agent {i}'s model differs from agent "
                        f"{todo[0][0]}'s; give every agent the same base model or set "
                        "lora.shared_base=false."
                    )
            names = [f"agent_{i}" for i, _ in todo]
            pm = peft.get_peft_model(base, _lora_config(settings), adapter_name=names[0])
            for name in names[1:]:
                pm.add_adapter(name, _lora_config(settings))
            shared = SharedBase(pm, batched=settings.batch_agents)
            source = getattr(base, "comlrl_source", None)
            for (_, agent), name in zip(todo, names, strict=True):
                agent.replace_model(
                    LoraPolicy(
                        shared, name, merge_on_save=settings.merge_adapters, base_source=source
                    )
                )
        else:
            for i, agent in todo:
                name = f"agent_{i}"
                source = getattr(agent.model, "comlrl_source", None)
                pm = peft.get_peft_model(agent.model, _lora_config(settings), adapter_name=name)
                agent.replace_model(
                    LoraPolicy(
                        SharedBase(pm),
                        name,
                        merge_on_save=settings.merge_adapters,
                        base_source=source,
                    )
                )


def unique_parameter_bytes(models: Sequence[Any]) -> int:
    """Bytes of all distinct parameter and buffer tensors behind ``models`` (each tensor
    counted once, however many models reach it); a :class:`LoraPolicy` counts its whole
    base. Units: bytes (``numel * element_size``)."""
    seen: set[int] = set()
    total = 0
    for model in models:
        module = model.shared.hf_model if is_lora_policy(model) else model
        for t in [*module.parameters(), *module.buffers()]:
            key = t.data_ptr()
            if key in seen:
                continue
            seen.add(key)
            total += t.numel() * t.element_size()
    return total
