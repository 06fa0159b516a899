"""A group-baseline run's state (:class:`GroupBaselineRun`) and how it is built
(:func:`setup`: agents, environment and config checked; LoRA, devices, reference models,
data parallel wrapping, optimizers and agent pools). The actor-critic recipes build their
run here too."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from comlrl.algos.models.devices import agent_placement
from comlrl.algos.models.gradient_sync import GradientSync, wrap_model
from comlrl.algos.models.lora import attach_lora, model_key, reference_model
from comlrl.algos.models.ranks import rank_and_world, shard_bounds
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.rollout.tree import TreeSettings, derive_seed
from comlrl.algos.training.agents import AgentPool, build_optimizer, resolve_device
from comlrl.algos.training.config import ConfigError, RLConfig, TrainConfig
from comlrl.algos.training.data import DataStream
from comlrl.algos.training.data_mixture import example_stream
from comlrl.algos.training.diagnostics import warn_if_cannot_learn
from comlrl.algos.training.update import UpdateSettings
from comlrl.core import SamplingParams

__all__ = [
    "GroupBaselineRun",
    "agent_seed",
    "setup",
]


@dataclass
class GroupBaselineRun:
    """What a group-baseline run holds between steps (built by :func:`setup`)."""

    config: RLConfig
    agents: list[Any]
    env: Environment
    data: DataStream
    optimizers: list[torch.optim.Optimizer]
    ref_models: list[Any] | None
    sampling: SamplingParams
    tree: TreeSettings
    update: UpdateSettings
    sample_pool: AgentPool
    update_pool: AgentPool
    rng: random.Random
    output_dir: Path
    step: int = 0
    eval_data: Sequence[Mapping[str, Any]] | None = field(default=None, repr=False)
    #: the environment whose reward scores :func:`evaluate` (None: ``env``; MARLHF trains
    #: on a learned reward and evaluates on the task's own).
    eval_env: Environment | None = field(default=None, repr=False)
    #: data parallel (:mod:`comlrl.algos.models.gradient_sync`): this process's rank, the number of
    #: ranks, and per agent the gradient averaging (None in a single process).
    rank: int = 0
    world_size: int = 1
    syncs: list[GradientSync] | None = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        """True on the rank that writes logs, samples and checkpoints (rank 0)."""
        return self.rank == 0

    def close(self) -> None:
        """Stop worker threads (safe to call twice)."""
        self.sample_pool.close()
        self.update_pool.close()


def setup(
    agents: Sequence[Any],
    config: RLConfig,
    env: Environment,
    dataset: Sequence[Mapping[str, Any]],
    eval_dataset: Sequence[Mapping[str, Any]] | None = None,
    eval_env: Environment | None = None,
    *,
    group_baseline: bool = True,
) -> GroupBaselineRun:
    """Check that agents, environment and config agree, then build optimizers and pools.

    ``group_baseline=False``: the caller's baseline is not ``config.estimator`` (the
    actor-critic recipes build their run here and add critics), so no warning about it.

    ``eval_dataset`` (cut to ``config.eval_limit``) is what :func:`evaluate` runs on; it is
    needed when ``config.eval_every > 0``. ``eval_env`` (default ``env``) is the
    environment evaluation plays and scores in: the same prompts and turns with another
    reward, e.g. the task's true reward while training on a learned one.

    Under an initialised ``torch.distributed`` process group of ``K > 1`` ranks (every
    rank calls this with the same arguments) each agent's gradient is averaged by a
    :class:`~comlrl.algos.models.gradient_sync.GradientSync` of ``config.data_parallel``, each rank
    rolls out ``batch_size / K`` prompts of every step, agents are updated one after
    another (concurrent updates would interleave their collectives differently on
    different ranks), and with ``sampling_rng="agent"`` each rank's sampling streams are
    seeded from ``seed``, the agent and the rank.

    Raises:
        ConfigError: agent count, turn count or dataset do not fit, evaluation is on
            without an evaluation set, ``eval_env`` for another number of agents, or
            ``batch_size`` is not a multiple of the number of ranks (before any training).
    """
    n = len(agents)
    if eval_env is not None and eval_env.num_agents != n:
        raise ConfigError(
            f"eval_env is for {eval_env.num_agents} agents but {n} agents were given; "
            "evaluate in an environment of the same task."
        )
    if n != config.num_agents:
        raise ConfigError(
            f"{n} agents were given but config.num_agents={config.num_agents}; make them agree."
        )
    if env.num_agents != n:
        raise ConfigError(f"the task is for {env.num_agents} agents but {n} agents were given.")
    if env.max_turns is not None and config.num_turns > env.max_turns:
        raise ConfigError(
            f"num_turns={config.num_turns} but the task supports at most {env.max_turns} turn(s); "
            "lower num_turns, use a multi-turn task, or pass a transition callback."
        )
    try:
        # task.mixture: each prompt's task drawn by weight
        data = example_stream(dataset, seed=config.seed, shuffle=config.shuffle, task=config.task)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if eval_dataset is not None:
        eval_dataset = list(eval_dataset)[: config.eval_limit]
        if not eval_dataset:
            raise ConfigError(
                f"the evaluation set is empty (eval_split={config.eval_split!r}); give problems."
            )
    elif config.eval_every:
        raise ConfigError(
            f"eval_every={config.eval_every} but no evaluation set was given: pass eval_dataset= "
            "(or a task with an eval_split), or set eval_every=0."
        )
    rank, world = rank_and_world()
    if world > 1:
        try:
            shard_bounds(config.batch_size, rank, world)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if isinstance(config, TrainConfig) and config.update_chunk_nodes is not None:
            raise ConfigError(
                f"update_chunk_nodes={config.update_chunk_nodes} is not supported under torchrun "
                "data parallelism (each rank's share of the trees would cut into different "
                "chunks); run one process or leave it unset."
            )
    warn_if_cannot_learn(config, agents, env, dataset, group_baseline=group_baseline)
    if config.lora is not None:
        if world > 1:
            raise ConfigError(
                "lora is not supported under torchrun data parallelism yet; run one process "
                "(agent_devices for one GPU per agent) or remove the lora section."
            )
        try:
            attach_lora(agents, config.lora, seed=config.seed)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    try:
        devices = agent_placement(n, config.agent_devices, resolve_device(config.device))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    placed: dict[int, torch.device] = {}
    for i, agent in enumerate(agents):  # check every agent before moving any
        key = model_key(agent.model)
        if placed.setdefault(key, devices[i]) != devices[i]:
            raise ConfigError(
                f"agent {i} shares its model with an agent placed on {placed[key]} but "
                f"agent_devices[{i}]={str(devices[i])!r}; agents that share weights need one device."
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
    # a LoRA agent's reference is its base with the adapter disabled (no copy); any other
    # agent's is a frozen copy of its starting weights
    ref_models = (
        [reference_model(a.model, ref_devices[i]) for i, a in enumerate(agents)]
        if config.kl_coef > 0
        else None
    )
    # the reference copies are taken from the whole models, before any sharding; the
    # optimizers are built after it (fsdp2 replaces the parameters by sharded ones)
    syncs = None
    if world > 1:
        by_model: dict[int, GradientSync] = {}  # one wrapper per model object
        syncs = [
            by_model.setdefault(id(a.model), wrap_model(a.model, config.data_parallel))
            for a in agents
        ]
    optimizers = [
        build_optimizer(
            [p for p in a.model.parameters() if p.requires_grad],
            config.optimizer,
            lr=config.learning_rate,
            weight_decay=config.weight_decay,
        )
        for a in agents
    ]
    # Agents run concurrently when that can help: CPU with an intra-op thread per agent, or
    # one device per agent. Concurrent sampling needs per-agent random streams; agents that
    # share one model object are never updated concurrently.
    cpu = all(d.type == "cpu" for d in devices)
    concurrent = (
        config.parallel_agents
        and n > 1
        and (torch.get_num_threads() >= n if cpu else len({str(d) for d in devices}) == n)
    )
    own_streams = all(getattr(a, "generator", None) is not None for a in agents)
    # agents on one base (same model object, or LoRA adapters of one shared base) are
    # updated one after another
    distinct = len({model_key(a.model) for a in agents}) == n
    return GroupBaselineRun(
        config=config,
        agents=list(agents),
        env=env,
        data=data,
        optimizers=optimizers,
        ref_models=ref_models,
        sampling=SamplingParams.from_config(config, config.num_generations),
        tree=TreeSettings(
            num_turns=config.num_turns,
            gamma=config.gamma,
            joint_mode=config.joint_mode,
            early_termination_threshold=config.early_termination_threshold,
            termination_scope=config.termination_scope,
            max_branches=config.max_branches,
            branch_select=config.branch_select,
        ),
        update=UpdateSettings(
            temperature=config.temperature,
            loss_reduction=config.loss_reduction,
            max_completion_length=config.max_new_tokens,
            clip_ratio=config.clip_ratio,
            kl_coef=config.kl_coef,
            kl_estimator=config.kl_estimator,
            num_iterations=config.num_iterations,
            max_grad_norm=config.max_grad_norm,
            micro_batch_size=config.micro_batch_size,
            shared_prefix=config.shared_prefix,
            fused_logprobs=config.fused_logprobs,
            tis_level=tis_level(config.tis, agents),
            tis_cap=config.tis_cap,
            importance_level=config.importance_level,
        ),
        sample_pool=AgentPool(n, concurrent and own_streams, cpu=cpu),
        update_pool=AgentPool(n, concurrent and distinct and world == 1, cpu=cpu),
        rng=random.Random(config.seed),
        output_dir=Path(config.output_dir),
        eval_data=eval_dataset,
        eval_env=eval_env,
        rank=rank,
        world_size=world,
        syncs=syncs,
    )


def tis_level(setting: str, agents: Sequence[Any]) -> Literal["token", "sequence"] | None:
    """The truncated importance-sampling level of ``config.tis`` for these agents.

    ``"auto"`` turns token-level TIS on when some agent's behaviour log-probs are not the
    trainer's own numbers: a generation backend other than the native sampler that does
    not recompute them (a vLLM engine's log-probs), or a model in a 16-bit dtype (the
    sampler's KV-cached decode step and the training forward round differently). The
    native sampler in float32 gives the trainer's log-probs up to float32 round-off (the
    first update's ratio is 1 within 1e-5): off there.
    """
    if setting == "off":
        return None
    if setting in ("token", "sequence"):
        return setting  # type: ignore[return-value]
    for agent in agents:
        backend = getattr(agent, "generation_backend", None)
        engine = (
            backend is not None
            and backend.name not in ("native", "hf")
            and not backend.recompute_logprobs
        )
        model = getattr(agent, "model", None)
        params = model.parameters() if isinstance(model, torch.nn.Module) else iter(())
        dtype = next(params, torch.zeros(())).dtype
        if engine or dtype in (torch.bfloat16, torch.float16):
            return "token"
    return None


def agent_seed(seed: int, agent: int, rank: int, step: int = 0) -> int:
    """Seed of an agent's own sampling stream (``sampling_rng="agent"``); rank 0 at step 0
    keeps the single-process seed."""
    if rank == 0 and step == 0:
        return seed * 1_000_003 + agent
    return derive_seed(seed, agent, rank, step)
