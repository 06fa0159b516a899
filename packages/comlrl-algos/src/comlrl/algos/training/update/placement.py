"""Where and how the agents train before their first step (:func:`place_agents`): LoRA
adapters, each agent's device, its sampling seed (:func:`agent_seed`) and its reference
model; and whether they sample and update side by side (:func:`agent_pools`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from comlrl.algos.models.devices import agent_placement
from comlrl.algos.models.lora import attach_lora, model_key, reference_model
from comlrl.algos.rollout.tree import derive_seed
from comlrl.algos.training.config.rl import ConfigError, RLConfig
from comlrl.algos.training.update.agents import AgentPool, resolve_device

__all__ = ["place_agents", "agent_seed", "agent_pools"]


def place_agents(
    agents: Sequence[Any], config: RLConfig, rank: int, world_size: int
) -> tuple[list[torch.device], list[Any] | None]:
    """Attach ``config.lora``'s adapters, move each agent's model to its device
    (``agent_devices``, else ``device``) in train mode, seed its own sampling stream
    (:func:`agent_seed`), and build the reference models (``kl_coef > 0``: a LoRA agent's is
    its base with the adapter disabled, no copy; any other agent's a frozen copy of its
    starting weights, on ``reference_devices`` when given). Every agent is checked before
    any moves.

    Returns:
        ``(devices, ref_models)``: agent ``i``'s device, and the reference models (None
        without ``kl_coef``).

    Raises:
        ConfigError: LoRA under data parallelism, an adapter that does not fit, a placement
            that does not fit the machine, or agents sharing one model placed on two
            devices.
    """
    if config.lora is not None:
        if world_size > 1:
            raise ConfigError(
                "lora is not supported under torchrun data parallelism yet; run one "
                "process (agent_devices for one GPU per agent) or remove the lora section."
            )
        try:
            attach_lora(agents, config.lora, seed=config.seed)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    try:
        devices = agent_placement(len(agents), config.agent_devices, resolve_device(config.device))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    placed: dict[int, torch.device] = {}
    for i, agent in enumerate(agents):  # check every agent before moving any
        key = model_key(agent.model)
        if placed.setdefault(key, devices[i]) != devices[i]:
            raise ConfigError(
                f"agent {i} shares its model with an agent placed on {placed[key]} but "
                f"agent_devices[{i}]={str(devices[i])!r}; agents that share weights need "
                "one device."
            )
    for i, agent in enumerate(agents):
        agent.model.to(devices[i])
        agent.model.train()
        if hasattr(agent, "seed"):
            agent.seed(agent_seed(config.seed, i, rank))
    ref_devices = (
        [torch.device(d) for d in config.reference_devices]
        if config.reference_devices is not None
        else devices
    )
    ref_models = (
        [reference_model(a.model, ref_devices[i]) for i, a in enumerate(agents)]
        if config.kl_coef > 0
        else None
    )
    return devices, ref_models


def agent_seed(seed: int, agent: int, rank: int, step: int = 0) -> int:
    """Seed of an agent's own sampling stream (``sampling_rng="agent"``); rank 0 at step 0
    keeps the single-process seed."""
    if rank == 0 and step == 0:
        return seed * 1_000_003 + agent
    return derive_seed(seed, agent, rank, step)


def agent_pools(
    agents: Sequence[Any], devices: Sequence[torch.device], *, parallel: bool, world_size: int
) -> tuple[AgentPool, AgentPool]:
    """The pools the agents sample and update in: concurrent where that can help (CPU with
    an intra-op thread per agent, or one device per agent, and ``parallel``), sampling only
    with per-agent random streams, updates only for agents on distinct bases (the same
    model object, or LoRA adapters of one shared base, update one after another) in one
    process.

    Returns:
        ``(sample_pool, update_pool)``.
    """
    n = len(agents)
    cpu = all(d.type == "cpu" for d in devices)
    concurrent = (
        parallel
        and n > 1
        and (torch.get_num_threads() >= n if cpu else len({str(d) for d in devices}) == n)
    )
    own_streams = all(getattr(a, "generator", None) is not None for a in agents)
    distinct = len({model_key(a.model) for a in agents}) == n
    return (
        AgentPool(n, concurrent and own_streams, cpu=cpu),
        AgentPool(n, concurrent and distinct and world_size == 1, cpu=cpu),
    )
