"""Agents that are LoRA adapters of one base sample in one batch.

With ``lora.shared_base`` every agent is an adapter of one frozen base
(:mod:`comlrl.algos.models.lora`). Sampled one after another, each agent runs the whole
base per token for its own rows. :func:`sample_together` instead stacks every agent's
prompts into one batch (agent-major: agent ``i``'s rows are block ``i``) and decodes it with
one :class:`~comlrl.algos.rollout.sampling.native.NativeSampler` over an
:class:`~comlrl.algos.models.lora_policy.AdapterBatch` of their adapters: one prefill and
one decode step per token for all agents, each row through its own agent's adapter (the
fast decode step's per-block LoRA, or peft's mixed-adapter batches), the step replayed as
a CUDA graph on CUDA devices.

Each agent's rows draw from the agent's own streams exactly as its own call would
(:class:`~comlrl.algos.rollout.sampling.draw.StreamBlocks`), its completions are cut to the
steps its own rows took, and its streams are left where its own call would leave them, so
the samples are those of sampling the agents one by one (to float rounding of the logits
from the batch's padding; tested). :func:`sampling_units` decides which agents of a
rollout sample together (:func:`comlrl.algos.rollout.tree.rollout` calls both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from comlrl.algos.records import AgentSamples
from comlrl.algos.rollout.sampling.backends import NativeBackend
from comlrl.algos.rollout.sampling.draw import StreamBlocks
from comlrl.algos.rollout.sampling.native import NativeSampler, decode_threads
from comlrl.core import SamplingParams
from comlrl.core.prompts import Prompt

__all__ = ["batch_reason", "sample_together", "sampling_units"]


def batch_reason(agents: Sequence[Any], *, keyed: bool = False) -> str | None:
    """Why ``agents`` cannot sample in one batch (``None`` when they can): they must be
    :class:`~comlrl.algos.rollout.agent.HFAgent` s on the native backend whose models are
    distinct adapters of one shared base that allows it (``lora.batch_agents``), on one
    device, with the same EOS and pad ids, and each with its own random stream (or
    prompt-keyed sampling, ``keyed``)."""
    if len(agents) < 2:
        return "fewer than two agents"
    models = [getattr(a, "model", None) for a in agents]
    if not all(getattr(type(m), "is_lora_policy", False) for m in models):
        return "not every agent is a LoRA adapter"
    shared = models[0].shared  # type: ignore[union-attr]
    if any(m.shared is not shared for m in models):  # type: ignore[union-attr]
        return "the agents are adapters of different bases"
    if not getattr(shared, "batched", False):
        return "lora.batch_agents is off"
    if len({m.adapter_name for m in models}) != len(models):  # type: ignore[union-attr]
        return "two agents share one adapter"
    backends = [getattr(a, "generation_backend", None) for a in agents]
    if not all(isinstance(b, NativeBackend) and b.name == "native" for b in backends):
        return "not every agent samples with the native backend"
    if len({(tuple(a.eos_token_ids), int(a.tokenizer.pad_token_id)) for a in agents}) != 1:
        return "the agents' EOS or pad ids differ"
    if not keyed and any(getattr(a, "generator", None) is None for a in agents):
        return "an agent draws from torch's global stream (seed every agent)"
    return None


def sampling_units(
    agents: Sequence[Any], toolboxes: Sequence[Any | None] = (), *, keyed: bool = False
) -> list[list[int]]:
    """The agents' indices grouped into sampling calls: the agents without tools that
    :func:`batch_reason` lets sample together form one unit per base (in index order),
    every other agent a unit of its own. Units are ordered by their first agent."""
    loose: list[list[int]] = []
    by_base: dict[int, list[int]] = {}
    for i, agent in enumerate(agents):
        tools = toolboxes[i] if i < len(toolboxes) else None
        model = getattr(agent, "model", None)
        if tools is None and getattr(type(model), "is_lora_policy", False):
            by_base.setdefault(id(model.shared), []).append(i)  # type: ignore[union-attr]
        else:
            loose.append([i])
    units = list(loose)
    for members in by_base.values():
        if batch_reason([agents[i] for i in members], keyed=keyed) is None:
            units.append(members)
        else:
            units.extend([i] for i in members)
    return sorted(units, key=lambda u: u[0])


def sample_together(
    agents: Sequence[Any],
    prompts: Sequence[Sequence[Prompt]],
    params: SamplingParams,
    keys: Sequence[Sequence[int] | None] | None = None,
) -> list[AgentSamples]:
    """Each agent's ``G`` completions of its ``N`` prompts, all agents in one batch.

    Args:
        agents: agents that may sample together (:func:`batch_reason`).
        prompts: per agent its ``N`` prompts (the same ``N`` for every agent).
        params: the sampling settings, shared.
        keys: per agent ``N`` seeds for prompt-keyed sampling, or ``None``.

    Returns:
        Per agent its samples, as its own ``sample`` would return them.

    Raises:
        ValueError: agents that cannot sample together, or different prompt counts.
    """
    reason = batch_reason(agents, keyed=keys is not None)
    if reason is not None:
        raise ValueError(f"these agents cannot sample in one batch: {reason}")
    counts = {len(p) for p in prompts}
    if len(counts) != 1 or len(prompts) != len(agents):
        raise ValueError(
            f"sample_together: prompt counts {[len(p) for p in prompts]} for {len(agents)} "
            "agents; every agent needs the same number of prompts"
        )
    streams = StreamBlocks(
        tuple(
            a.streams(len(p), keys[i] if keys is not None else None)
            for i, (a, p) in enumerate(zip(agents, prompts, strict=True))
        )
    )
    encoded = [a.encode(p) for a, p in zip(agents, prompts, strict=True)]
    pad = int(agents[0].tokenizer.pad_token_id)
    width = max(ids.shape[1] for _, ids, _ in encoded)
    input_ids = torch.cat(
        [
            torch.nn.functional.pad(ids, (width - ids.shape[1], 0), value=pad)
            for _, ids, _ in encoded
        ]
    )
    mask = torch.cat(
        [torch.nn.functional.pad(m, (width - m.shape[1], 0), value=0) for _, _, m in encoded]
    )
    sampler = _sampler(agents)
    view = sampler.model
    was_training = view.training
    view.eval()
    try:
        with decode_threads(view, input_ids.device):
            outs = sampler.sample_blocks(input_ids, mask, params, streams)
    finally:
        view.train(was_training)
    return [
        agent.collect(texts, ids, m, out_ids, out_logp, params)
        for agent, (texts, ids, m), (out_ids, out_logp) in zip(agents, encoded, outs, strict=True)
    ]


def _sampler(agents: Sequence[Any]) -> NativeSampler:
    """The batched sampler of these agents, kept on their base between calls (its fast
    decode step is checked once against the model's forward)."""
    from comlrl.algos.models.lora_policy import AdapterBatch

    models = [a.model for a in agents]
    shared = models[0].shared
    key = ("batched_sampler", tuple(m.adapter_name for m in models))
    sampler = shared.cache.get(key)
    if sampler is None:
        first = agents[0].generation_backend.sampler
        sampler = NativeSampler(
            AdapterBatch.of(models),
            pad_token_id=first.pad_token_id,
            eos_token_ids=first.eos_token_ids,
            fast_decode=first.fast_decode,
            cuda_graphs=first.cuda_graphs,
            decode_loop=first.decode_loop,
            check_every=first.check_every,
            name="+".join(a.name for a in agents),
        )
        shared.cache[key] = sampler
    return sampler  # type: ignore[no-any-return]
