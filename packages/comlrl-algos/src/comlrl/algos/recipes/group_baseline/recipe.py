"""A group-baseline run's state (:class:`GroupBaselineRun`) and how it is built
(:func:`setup`: agents, environment and config checked; LoRA, devices, reference models,
data parallel wrapping, optimizers and agent pools). The actor-critic recipes build their
run here too.

Saving a group-baseline run: ``final/`` (:func:`save`), step checkpoints in the one
format (:func:`checkpoint`) and continuing from one (:func:`resume`); under data
parallelism every rank calls them and rank 0 writes.

The group-baseline recipe: MAGRPO, MARLOO, MAReMax and MAREINFORCE.

One step, read top to bottom in :func:`train_step` (``DESIGN.md`` §3):

1. the next ``batch_size`` examples;
2. :func:`~comlrl.algos.rollout.tree.rollout`: every agent samples ``G`` completions per node,
   joint actions are scored, and (multi-turn) the environment's feedback opens the next
   turn's nodes; returns are discounted down the tree;
3. :func:`group_advantages`: per turn and agent, each completion is credited with the
   mean return of the joint actions it took part in (less ``kl_coef`` times its
   :func:`reward_kl` with ``kl_mode="reward"``) and compared with its ``G`` siblings
   by the estimator (``mean``: MAGRPO, leave-one-out: MARLOO, ``max``: MAReMax, none:
   MAREINFORCE);
4. :func:`~comlrl.algos.training.update.shared_models.update_sharers` per agent (concurrently where
   it helps; agents on one model object take one step on the sum of their losses):
   one optimizer step on the whole rollout, or with ``update_chunk_nodes`` one per chunk of
   tree nodes in CoMLRL 1.4.3's order (:mod:`comlrl.algos.training.update.node_chunks`);
5. metrics (with ``grad_norm_ratio``, the largest agent's pre-clip gradient norm over the
   median agent's).

The four methods differ only in ``config.estimator``; ``advantage_stats`` and
``advantage_group`` pick whose returns and which completions each baseline is taken over.
:func:`setup` builds the run state once; :func:`train` loops, logs, evaluates
(:func:`evaluate`) and checkpoints (:func:`checkpoint`); :func:`resume` puts a run back at
a step checkpoint.

This module builds the run, steps, evaluates, saves and restores it.

Trainer objects: a thin front over :mod:`comlrl.algos.recipes.group_baseline.recipe`.

``MultiAgentTrainer(agents, config, task=...)`` (or ``dataset=``, ``formatters=``,
``reward_func=`` in CoMLRL's form) checks everything, builds the run state, and
:meth:`~MultiAgentTrainer.train` runs the recipe's loop. The maths and the loop live in
the recipe; this class only wires arguments to it. :class:`MAGRPOTrainer`,
:class:`MARLOOTrainer`, :class:`MAReMaxTrainer` and :class:`MAREINFORCETrainer` fix the
estimator.

The end-to-end run of the group-baseline recipes (``algo=magrpo`` / ``mareinforce`` /
``marloo`` / ``maremax``): task -> agents -> trainer -> train -> final checkpoint, the run
``comlrl train`` makes, also from Python (``run_group_baseline(TrainConfig(...))``).

:func:`run_policy_gradient` is that run for any trainer built as
``trainer_cls(agents, config, task=, dataset=)`` (the actor-critic and centralized recipes
use it too). Every run writes one row per step to ``output_dir/metrics.jsonl`` and the final
weights to ``output_dir/final/`` (Hugging Face format, loadable by ``comlrl eval`` and
``from_pretrained``).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from comlrl.algos.models.devices import agent_placement
from comlrl.algos.models.gradient_sync import GradientSync, full_weights, wrap_model
from comlrl.algos.models.lora import attach_lora, model_key, reference_model
from comlrl.algos.models.ranks import (
    all_reduce_flag,
    barrier,
    gather_objects,
    rank_and_world,
    shard_bounds,
)
from comlrl.algos.recipes.launch import (
    RunOutputs,
    RunResult,
    announce,
    load_agents,
    preflight,
    quiet_transformers,
    resuming_line,
    setup_errors,
)
from comlrl.algos.records import Rollout
from comlrl.algos.rollout import evaluate as evaluation
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.environment import (
    CallbackEnvironment,
    Environment,
    TaskEnvironment,
    Transition,
)
from comlrl.algos.rollout.metrics import merge_summaries, rollout_summary, summary_metrics
from comlrl.algos.rollout.tree import TreeSettings, derive_seed, rollout
from comlrl.algos.training.config.rl import ConfigError, RLConfig, TrainConfig
from comlrl.algos.training.loop import (
    Collective,
    LoopSettings,
    RecipeLoop,
    StepResult,
    rewind_outputs,
    run_loop,
)
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.run import lifecycle
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.data_mixture import example_stream
from comlrl.algos.training.run.diagnostics import warn_if_cannot_learn
from comlrl.algos.training.run.reporting import build_reporters
from comlrl.algos.training.run.saving import save_agent_checkpoint
from comlrl.algos.training.update.agents import AgentPool, build_optimizer, resolve_device
from comlrl.algos.training.update.grad_norms import grad_norm_ratio
from comlrl.algos.training.update.node_chunks import update_in_node_chunks
from comlrl.algos.training.update.policy import UpdateSettings, split_terms, trainer_logprobs
from comlrl.algos.training.update.shared_models import (
    adapter_groups,
    sharing_groups,
    update_adapter_group,
    update_sharers,
)
from comlrl.core import SamplingParams, Task
from comlrl.estimators.advantages import std_from_moments
from comlrl.estimators.agentwise import Stats, agent_return_moments, agentwise_advantages
from comlrl.estimators.joint import credit_completions
from comlrl.estimators.kl_reward import sequence_kl
from comlrl.estimators.registry import resolve_estimator

__all__ = [
    "GroupBaselineRun",
    "agent_seed",
    "setup",
    "save",
    "checkpoint",
    "resume",
    "group_advantages",
    "reward_kl",
    "step",
    "train_step",
    "loop_settings",
    "train",
    "evaluate",
    "evaluate_rollouts",
    "MultiAgentTrainer",
    "MAGRPOTrainer",
    "MARLOOTrainer",
    "MAReMaxTrainer",
    "MAREINFORCETrainer",
    "run_group_baseline",
    "run_policy_gradient",
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
        if config.kl_mode == "reward" and config.kl_coef > 0 and config.data_parallel == "fsdp2":
            raise ConfigError(
                "kl_mode='reward' is not supported with data_parallel=fsdp2 (its KL pass "
                "runs each rank's own forward); use data_parallel=ddp or kl_mode=loss."
            )
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
            hold_terminal_reward=config.hold_terminal_reward,
        ),
        update=UpdateSettings(
            temperature=(
                config.temperature
                if config.update_temperature is None
                else config.update_temperature
            ),
            sampling_temperature=config.temperature,
            loss_reduction=config.loss_reduction,
            max_completion_length=config.max_new_tokens,
            clip_ratio=config.clip_ratio,
            kl_coef=config.kl_coef if config.kl_mode == "loss" else 0.0,  # else in the reward
            kl_estimator=config.kl_estimator,
            num_iterations=config.num_iterations,
            max_grad_norm=config.max_grad_norm,
            micro_batch_size=config.micro_batch_size,
            shared_prefix=config.shared_prefix,
            fused_logprobs=config.fused_logprobs,
            tis_level=None if config.retempered_update else tis_level(config.tis, agents),
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


def save(run: GroupBaselineRun, tag: str) -> list[Path]:
    """Checkpoint every agent under ``output_dir/<tag>/agent_<i>`` (atomically).

    Data parallel: every rank calls this (``fsdp2`` gathers the weights to rank 0);
    rank 0 writes, the others return ``[]``.
    """
    states = _full_model_states(run)
    if not run.is_main:
        return []
    return [
        save_agent_checkpoint(agent, run.output_dir / tag / f"agent_{i}", state_dict=states[i])
        for i, agent in enumerate(run.agents)
    ]


def _full_model_states(run: GroupBaselineRun) -> list[dict[str, torch.Tensor] | None]:
    """Per agent the gathered full state dict (``fsdp2``; a collective), else ``None``:
    the model's own ``state_dict()`` is whole."""
    if run.syncs is None:
        return [None] * len(run.agents)
    gathered: dict[int, dict[str, torch.Tensor] | None] = {}
    for sync in run.syncs:  # the same order on every rank; a shared model is gathered once
        if id(sync) not in gathered:
            gathered[id(sync)] = sync.model_state_dict()
    return [gathered[id(sync)] for sync in run.syncs]


def checkpoint(
    run: GroupBaselineRun,
    path: str | Path | None = None,
    *,
    recipe_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write the step checkpoint ``path`` (default ``output_dir/checkpoints/step-N``):
    agents + training state, atomically; returns the folder. (The loop driver prunes to
    ``keep_last``.) ``recipe_state``: a recipe's own state, saved under
    :data:`~comlrl.algos.training.run.checkpoint.RECIPE_STATE` (MARLHF-Iter's rounds).

    Data parallel: every rank calls this (``fsdp2`` gathers weights and optimizer state
    to rank 0); rank 0 writes and every rank gets the folder's path back.
    """
    path = Path(path) if path is not None else ckpt.step_checkpoint_path(run.output_dir, run.step)
    models = _full_model_states(run)
    optimizer_states = (
        [
            sync.optimizer_state_dict(opt)
            for sync, opt in zip(run.syncs, run.optimizers, strict=True)
        ]
        if run.syncs is not None
        else None
    )
    if not run.is_main:
        return path
    state = ckpt.capture_state(
        step=run.step,
        optimizers=run.optimizers,
        data=run.data,
        rng=run.rng,
        generators=[getattr(a, "generator", None) for a in run.agents],
        optimizer_states=optimizer_states,
    )
    if recipe_state is not None:
        state[ckpt.RECIPE_STATE] = dict(recipe_state)
    return ckpt.write_checkpoint(path, run.agents, state, state_dicts=models)


def resume(
    run: GroupBaselineRun, path: str | Path, *, state: Mapping[str, Any] | None = None
) -> int:
    """Put ``run`` back at the step checkpoint ``path`` (weights, optimizers, data stream,
    random streams), cut the logs in ``output_dir`` back to its step, and return the step:
    :func:`train` then continues as if never stopped. ``state``: the checkpoint's
    ``training_state.pt`` when the caller has read it already. Raises CheckpointError when
    the checkpoint is incomplete or does not fit the run."""
    if state is None:
        state = ckpt.load_training_state(path)
    for i, agent in enumerate(run.agents):
        sync = run.syncs[i] if run.syncs is not None else None
        ckpt.load_agent_weights(
            agent.model,
            Path(path) / f"agent_{i}",
            load_state_dict=sync.load_model_state_dict if sync is not None else None,
        )
    run.step = ckpt.restore_state(
        state,
        optimizers=run.optimizers,
        data=run.data,
        rng=run.rng,
        generators=[getattr(a, "generator", None) for a in run.agents],
        load_optimizer=(
            [sync.load_optimizer_state_dict for sync in run.syncs]
            if run.syncs is not None
            else None
        ),
    )
    if run.world_size > 1:
        # The checkpoint holds rank 0's streams; other ranks need their own. (With
        # sampling_rng="prompt" the streams are unused and the run continues exactly on
        # any number of ranks.)
        for i, agent in enumerate(run.agents):
            if run.rank > 0 and hasattr(agent, "seed"):
                agent.seed(agent_seed(run.config.seed, i, run.rank, run.step))
    if run.is_main:
        rewind_outputs(run.output_dir, run.step)
    barrier()
    return run.step


def group_advantages(
    ro: Rollout,
    *,
    estimator: str,
    scale: str = "auto",
    eps: float = 1e-6,
    penalties: list[list[torch.Tensor]] | None = None,
    stats: Stats = "agent",
    group: Literal["node", "turn"] = "node",
) -> list[list[torch.Tensor]]:
    """Advantages of every completion: per turn ``t``, per agent, ``[N_t * G]`` float32.

    Each completion's return is the mean return of the joint actions it took part in
    (:func:`~comlrl.estimators.joint.credit_completions`); ``penalties[t][a]``
    (``[N_t * G]``, e.g. ``kl_coef`` times :func:`reward_kl`) is subtracted from each
    completion's credited return first. The advantages of a turn are
    :func:`~comlrl.estimators.agentwise.agentwise_advantages` of its ``A * N_t * G`` credited
    returns:

    - ``group="node"``: a completion's group is the ``G`` completions its agent sampled at
      its tree node (the same prompt and history); ``group="turn"``: its agent's
      completions at that turn of the same example, over every node its tree has there
      (AT-GRPO's agent x turn groups; the same as ``node`` with one node per example a turn).
    - ``stats="agent"``: an agent's baseline and std come from its own completions only
      (Dr. MAS's agent-wise normalization); ``stats="global"``: from every agent's
      completions of the group (the batch) pooled.

    ``scale="batch"`` divides each (turn, agent)'s advantages by the std of that turn's
    credited returns of the agent (``stats="global"``: of every agent) over the *global*
    batch: under data parallelism each rank holds a shard of the prompts, so the shards'
    :func:`~comlrl.estimators.agentwise.agent_return_moments` are summed over the ranks
    (:func:`~comlrl.algos.models.ranks.gather_objects`; a rank may have no nodes at a
    later turn) and every rank divides by the same std as one process would.
    Every rank must call this together.
    """
    credited = []
    for t, turn in enumerate(ro.turns):
        g = turn.agents[0].batch.group_size
        per_turn = credit_completions(turn.returns, turn.joint_index, g)  # [A, N_t, G]
        if penalties is not None:
            shape = per_turn.shape[1:]
            per_turn = per_turn - torch.stack([p.to(per_turn).reshape(shape) for p in penalties[t]])
        credited.append(per_turn)
    resolved = resolve_estimator(estimator).scale if scale == "auto" else scale
    batch_stds = _global_batch_stds(credited, stats) if resolved == "batch" else None
    out = []
    for t, (turn, per_turn) in enumerate(zip(ro.turns, credited, strict=True)):
        num_agents, num_nodes, g = per_turn.shape
        node_group = turn.example_index if group == "turn" else torch.arange(num_nodes)
        adv = agentwise_advantages(
            per_turn.reshape(-1),
            torch.arange(num_agents).repeat_interleave(num_nodes * g),
            node_group.to(torch.int64).repeat_interleave(g).repeat(num_agents),
            num_agents=num_agents,
            estimator=estimator,
            scale=scale,  # type: ignore[arg-type]
            stats=stats,
            eps=eps,
            batch_std=batch_stds[t] if batch_stds is not None else None,
        )
        out.append(list(adv.reshape(num_agents, num_nodes * g).unbind(0)))
    return out


def _global_batch_stds(credited: list[torch.Tensor], stats: Stats) -> list[torch.Tensor]:
    """Per turn, ``[A]``: the std of the credited returns of every rank's nodes of each
    agent (``stats="global"``: of every agent)."""
    local = {
        t: agent_return_moments(
            per_turn.reshape(-1),
            torch.arange(per_turn.shape[0]).repeat_interleave(per_turn[0].numel()),
            per_turn.shape[0],
            stats=stats,
        ).cpu()
        for t, per_turn in enumerate(credited)
    }
    total: dict[int, torch.Tensor] = {}
    for shard in gather_objects(local):
        for key, moments in shard.items():
            total[key] = total[key] + moments if key in total else moments
    return [
        torch.tensor([std_from_moments(row) for row in total[t]], dtype=torch.float64)
        for t in range(len(credited))
    ]


def reward_kl(run: GroupBaselineRun, ro: Rollout) -> list[list[torch.Tensor]]:
    """Per turn ``t``, per agent, ``[N_t * G]`` float32: each completion's summed
    per-token KL estimate to its agent's reference model
    (:func:`comlrl.estimators.kl_reward.sequence_kl`, ``config.kl_estimator``), from the
    trainer's log-probs before the update at the update's temperature; ``kl_mode="reward"``
    subtracts ``kl_coef`` times it from the return.

    Raises:
        ValueError: the run has no reference models (``kl_coef = 0``).
    """
    if run.ref_models is None:
        raise ValueError("reward_kl needs reference models: set kl_coef > 0")
    out = []
    for turn in ro.turns:
        per_agent = []
        for a, samples in enumerate(turn.agents):
            logp = trainer_logprobs(run.agents[a].model, samples.batch, run.update)
            ref = trainer_logprobs(run.ref_models[a], samples.batch, run.update)
            mask = samples.batch.completion_mask.to(logp.device)
            kl = sequence_kl(logp, ref.to(logp.device), mask, run.config.kl_estimator)
            per_agent.append(kl.cpu())
        out.append(per_agent)
    return out


def train_step(run: GroupBaselineRun) -> dict[str, float]:
    """The metrics row of one :func:`step` (for callers that do not log samples)."""
    return step(run).row


def step(run: GroupBaselineRun) -> StepResult:
    """One step: rollout, advantages, every agent's update; returns the metrics row and
    the rollout (for ``samples.jsonl``).

    A step that fails before the update (in the rollout: sampling, a reward function,
    the task's feedback) leaves the data and random streams as the last completed step
    left them, and the weights and optimizers untouched, so the checkpoint the loop
    driver writes on the way out resumes exactly (:func:`~comlrl.algos.training.loop.run_loop`).

    Data parallel (``run.world_size > 1``; every rank calls this together): this rank
    rolls out its share of the global batch, the update averages gradients over the
    ranks, and the returned metrics (rewards, advantages, lengths, losses, KL, clip
    fractions, tokens) are those of the global batch; timings are this rank's.
    """
    cfg = run.config
    if not isinstance(cfg, TrainConfig):
        raise TypeError(
            f"the group-baseline step needs a TrainConfig (estimator, advantage scaling), got "
            f"{type(cfg).__name__}"
        )
    t0 = time.perf_counter()
    generators = [getattr(a, "generator", None) for a in run.agents]
    # the data and random streams as the last completed step left them: put back when the
    # rollout fails (a reward function that raises), so the checkpoint the loop driver then
    # writes resumes to exactly the run that never failed (the weights are not touched yet)
    streams = ckpt.capture_state(
        step=run.step, optimizers=(), data=run.data, rng=run.rng, generators=generators
    )
    try:
        examples = run.data.next_batch(cfg.batch_size)  # the same global batch on every rank
        keys = (
            [derive_seed(cfg.seed, run.step, j) for j in range(len(examples))]
            if cfg.sampling_rng == "prompt"
            else None
        )
        lo, hi = shard_bounds(len(examples), run.rank, run.world_size)
        with full_weights(run.syncs):  # fsdp2: whole weights for sampling, resharded after
            ro = rollout(
                run.agents,
                examples[lo:hi],
                run.env,
                run.sampling,
                run.tree,
                map_agents=run.sample_pool.map,
                rng=run.rng,
                sample_keys=keys[lo:hi] if keys is not None else None,
            )
        kl = reward_kl(run, ro) if cfg.kl_mode == "reward" and cfg.kl_coef > 0 else None
        adv = group_advantages(
            ro, estimator=cfg.estimator, scale=cfg.advantage_scale, eps=cfg.advantage_eps,
            penalties=[[cfg.kl_coef * k for k in per] for per in kl] if kl is not None else None,
            stats=cfg.advantage_stats, group=cfg.advantage_group,
        )  # fmt: skip
    except Exception:
        ckpt.restore_state(
            streams, optimizers=(), data=run.data, rng=run.rng, generators=generators
        )
        raise
    t1 = time.perf_counter()

    # agents that share one model object take one step on the sum of their losses (one
    # set of optimizer moments, the first sharer's optimizer); each reports that step's
    # loss and grad norm and its own completions' KL/clip/ratio (shared_models)
    models = [agent.model for agent in run.agents]
    groups = {g[0]: g for g in sharing_groups(models)}
    # LoRA adapters of one base: one forward and backward per micro-batch for all of them
    batched = (
        {g[0]: g for g in adapter_groups(models)}
        if cfg.update_chunk_nodes is None and run.syncs is None
        else {}
    )
    in_batch = {m for g in batched.values() for m in g[1:]}

    def update(a: int) -> dict[int, dict[str, float]]:
        if a in batched:  # no reference in the update when the KL is in the reward
            refs = run.ref_models if run.update.kl_coef > 0 else None
            return update_adapter_group(
                models, run.optimizers, ro, adv, batched[a], run.update, ref_models=refs
            )
        members = groups.get(a)
        if members is None or a in in_batch:  # another agent's update steps this model
            return {}
        ref_model = (  # no reference in the update when the KL is in the reward
            run.ref_models[a] if run.ref_models is not None and run.update.kl_coef > 0 else None
        )
        sync = run.syncs[a] if run.syncs is not None else None
        if cfg.update_chunk_nodes is not None:  # 1.4.3's schedule: chunks of tree nodes
            return split_terms(
                update_in_node_chunks(
                    run.agents[a].model, run.optimizers[a], ro, adv, members, run.update,
                    cfg.update_chunk_nodes, split_turns=cfg.update_chunk_split_turns,
                    ref_model=ref_model, sync=sync,
                ),
                members,
            )  # fmt: skip
        return update_sharers(
            run.agents[a].model, run.optimizers[a], ro, adv, members, run.update,
            ref_model=ref_model, sync=sync,
        )  # fmt: skip

    stats: list[dict[str, float]] = [{} for _ in run.agents]
    for per_member in run.update_pool.map(update):
        for m, own in per_member.items():
            stats[m] = own
    t2 = time.perf_counter()
    run.step += 1
    summary = rollout_summary(
        ro, [[per_agent[a] for a in range(len(run.agents))] for per_agent in adv]
    )
    metrics = summary_metrics(merge_summaries(gather_objects(summary)))
    for a, agent_stats in enumerate(stats):
        metrics.update({f"{k}/agent_{a}": v for k, v in agent_stats.items()})
    ratio = grad_norm_ratio([s["grad_norm"] for s in stats if "grad_norm" in s])
    if ratio is not None:
        metrics["grad_norm_ratio"] = ratio
    if kl is not None:  # the mean summed KL of each agent's completions, and its penalty
        for a in range(len(run.agents)):
            mean = float(torch.cat([per[a] for per in kl]).mean())
            metrics[f"reward_kl/agent_{a}"] = mean
            metrics[f"reward_kl_penalty/agent_{a}"] = cfg.kl_coef * mean
    elapsed = t2 - t0
    row = {
        "step": run.step,
        **metrics,
        **{f"time/{k}": v for k, v in ro.timings.items()},
        "time/update_s": t2 - t1,
        "time/step_s": elapsed,
        "tokens_per_s": metrics["num_tokens"] / elapsed,
        "prompts_per_s": len(examples) / elapsed,
    }
    return StepResult(row, ro)


def evaluate(run: GroupBaselineRun) -> dict[str, float]:
    """The ``eval.jsonl`` row of the agents on ``run.eval_data`` (the training rollout,
    greedy or sampled, no update, scored in ``run.eval_env`` when set;
    :mod:`comlrl.algos.rollout.evaluate`). Raises ConfigError
    without an evaluation set."""
    row, _ = evaluate_rollouts(run)
    return row


def evaluate_rollouts(
    run: GroupBaselineRun, progress: Callable[[int], None] | None = None
) -> tuple[dict[str, float], list[Rollout]]:
    """:func:`evaluate`'s row and the evaluation rollouts themselves (``comlrl eval`` writes
    their joint actions); ``progress`` is called with the examples done after each batch.

    Raises:
        ConfigError: the run has no evaluation set.
    """
    cfg = run.config
    if run.eval_data is None:
        raise ConfigError("this run has no evaluation set; pass eval_dataset= to setup().")
    params = evaluation.eval_sampling(
        cfg.eval_num_samples,
        cfg.max_new_tokens,
        greedy=cfg.eval_greedy,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
    )
    row, rollouts = evaluation.evaluate(
        run.agents,
        run.env if run.eval_env is None else run.eval_env,
        run.eval_data,
        params,
        run.tree,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        map_agents=run.sample_pool.map,
        progress=progress,
    )  # fsdp2: called inside full_weights (see train), so no collective runs here
    return {"step": run.step, **row}, rollouts


def loop_settings(
    config: RLConfig,
    *,
    record: dict[str, Any] | None = None,
    desc: str = "train",
    overwrite: bool = False,
) -> LoopSettings:
    """The loop driver's settings of a :class:`TrainConfig` run (also IAC/MAAC's):
    outputs in ``config.output_dir`` (``overwrite``: a fresh run deletes another run's
    outputs there instead of refusing), ``config.yaml`` = ``record`` (default the config),
    evaluation rows in ``eval.jsonl``, the reporters of ``config.report_to``."""
    return LoopSettings(
        num_steps=config.num_steps,
        output_dir=Path(config.output_dir),
        record=config.model_dump() if record is None else record,
        save_every=config.save_every,
        keep_last=config.keep_last,
        eval_every=config.eval_every,
        eval_on_start=config.eval_on_start and bool(config.eval_every),
        log_samples=config.log_samples,
        progress=config.progress,
        desc=desc,
        reporters=lambda out: build_reporters(config, out, record=record),
        overwrite=overwrite,
    )


def collective(run: GroupBaselineRun) -> Collective:
    """How the ranks of ``run`` agree (one process: the defaults)."""
    return Collective(
        is_main=run.is_main,
        any_rank=all_reduce_flag,
        barrier=barrier,
        full_weights=lambda: full_weights(run.syncs),
        world_size=run.world_size,
    )


def train(
    run: GroupBaselineRun, *, record: dict[str, Any] | None = None, overwrite: bool = False
) -> list[dict[str, float]]:
    """Run ``config.num_steps`` steps under the loop driver
    (:func:`comlrl.algos.training.loop.run_loop`) and return their metrics rows.

    Data parallel: every rank calls this; rank 0 alone writes (samples are those of its
    own share of the batch; evaluation runs on rank 0 while the others wait at the next
    step), and rows are those of the global batch.

    Writes ``metrics.jsonl`` (one row per step), ``samples.jsonl`` (joint actions with
    rewards, returns, feedback and reward-function infos), ``eval.jsonl`` (every
    ``eval_every`` steps, and at step 0 with ``eval_on_start``), ``config.yaml``
    (``record``, default the config), step checkpoints (every ``save_every`` steps and at
    the last step) and ``final/`` in ``output_dir``; every row also goes to the reporters
    of :func:`~comlrl.algos.training.run.reporting.build_reporters` (TensorBoard, W&B,
    ``reward_curve.png``). A run put back by :func:`resume` continues from its step.
    A fresh run refuses an ``output_dir`` that holds another run unless ``overwrite``.

    Raises:
        ConfigError: ``output_dir`` holds another run and ``overwrite`` is False.
        TrainingInterrupted: after Ctrl-C: the step in progress was finished and
            checkpointed (the exception names the checkpoint).
    """
    if run.step == 0:  # a resumed run has its random streams back from the checkpoint
        torch.manual_seed(run.config.seed)
    loop = RecipeLoop(
        step=lambda: step(run),
        checkpoint=lambda path: checkpoint(run, path),
        save_final=lambda path: save(run, path.name),
        evaluate=(lambda: evaluate(run)) if run.eval_data is not None else None,
        start_step=run.step,
    )
    try:
        settings = loop_settings(run.config, record=record, overwrite=overwrite)
        return run_loop(loop, settings, collective(run))
    finally:
        run.close()


class MultiAgentTrainer:
    """Train ``A`` cooperating causal-LM agents with a group-baseline policy gradient.

    Give either a ``task`` (a :class:`comlrl.core.Task`: examples, per-agent prompts,
    batched joint reward, and for ``num_turns > 1`` its feedback) or ``dataset`` +
    ``formatters`` + ``reward_func`` (CoMLRL's form: ``reward_func(completions_agent1, ...,
    completions_agentA) -> list[float]``, optionally with ``example=`` or ``batch_items=``)
    and, for ``num_turns > 1``, ``transition`` (CoMLRL's ``external_transition``).

    Args:
        agents: ``A`` agents: :class:`HFAgent` objects, ``(model, tokenizer)`` pairs, or
            your own :class:`comlrl.core.Agent` with ``model`` and ``tokenizer``.
        config: a validated :class:`TrainConfig`; ``config.estimator`` picks the baseline.
        task: the task suite; ``task.load(config.task.split)`` gives the dataset unless
            ``dataset`` is passed.
        dataset: a sequence of examples (mappings); a ``datasets.Dataset`` works.
        formatters: ``A`` callables ``example -> prompt`` (without ``task``).
        reward_func: joint reward (without ``task``).
        transition: ``external_transition(prompt, agent_completions, num_agents,
            prompt_history_per_agent, response_history_per_agent) -> A prompts`` for turns
            after the first (with a task, it replaces the task's own prompts).
        eval_dataset: examples for evaluation (``config.eval_every``, :meth:`evaluate`);
            with a task and ``config.eval_every > 0`` it defaults to
            ``task.load(config.eval_split)``.
        eval_env: the environment evaluation plays and scores in (default: the training
            one), e.g. the task's true reward while training on a learned reward model
            (:meth:`MARLHFTrainer.rl_trainer <comlrl.algos.MARLHFTrainer.rl_trainer>`).
        environment: instead of ``task`` or ``formatters``/``transition``, a ready
            :class:`~comlrl.algos.rollout.environment.Environment` (e.g. a
            :class:`~comlrl.algos.CallbackEnvironment` subclass with its own prompts for
            later turns, as ``comlrl.trainers`` builds for CoMLRL 1.4.3 scripts); needs
            ``dataset``. ``reward_func``, when given too, is only recorded in ``config.yaml``.

    Raises:
        ConfigError: when the agents, task/formatters, dataset and config disagree
            (checked before any training work starts).
    """

    estimator: str | None = None
    #: whether ``config.estimator`` is the baseline (the actor-critic trainers: a critic)
    uses_estimator: bool = True
    #: the recipe's name in ``config.yaml`` (``None``: not recorded)
    algo: str | None = None

    def __init__(
        self,
        agents: Sequence[Any],
        config: RLConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        transition: Transition | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        eval_env: Environment | None = None,
        environment: Environment | None = None,
    ) -> None:
        from comlrl.estimators.registry import ESTIMATORS

        if (
            self.estimator is not None
            and isinstance(config, TrainConfig)
            and ESTIMATORS[config.estimator].name != self.estimator
        ):
            if "estimator" in config.model_fields_set:
                raise ConfigError(
                    f"{type(self).__name__} uses estimator={self.estimator!r} but "
                    f"config.estimator={config.estimator!r}; use MultiAgentTrainer for other estimators."
                )
            config = config.model_copy(update={"estimator": self.estimator})
        self.config = config
        self.agents = [
            a
            if not isinstance(a, tuple)
            else HFAgent(a[0], a[1], name=f"agent_{i}", **config.generation_options())
            for i, a in enumerate(agents)
        ]
        self.task = task
        env: Environment
        data: Sequence[Mapping[str, Any]]
        if environment is not None:
            if task is not None or formatters is not None or transition is not None:
                raise ConfigError(
                    "environment= replaces task=, formatters= and transition=; pass one form."
                )
            if dataset is None:
                raise ConfigError("environment= needs dataset= (the examples to train on).")
            env = environment
            data = dataset if isinstance(dataset, Sequence) else list(dataset)
        elif task is not None:
            env = TaskEnvironment(task, transition)
            data = list(dataset) if dataset is not None else list(task.load(config.task.split))
            if eval_dataset is None and config.eval_every:
                try:
                    eval_dataset = list(task.load(config.eval_split))
                except ValueError as exc:
                    raise ConfigError(f"eval_split={config.eval_split!r}: {exc}") from None
        else:
            if formatters is None or reward_func is None or dataset is None:
                raise ConfigError(
                    "without a task, pass dataset=, formatters= (one per agent) and reward_func=."
                )
            if len(formatters) != len(self.agents):
                raise ConfigError(
                    f"{len(formatters)} formatters for {len(self.agents)} agents; give one per agent."
                )
            env = CallbackEnvironment(formatters, reward_func, transition)
            data = dataset if isinstance(dataset, Sequence) else list(dataset)
        self.env = env
        #: what ``config.yaml`` records: the config, with the task or reward really used
        self.record = lifecycle.run_record(
            config, algo=self.algo, task=task, reward_func=reward_func, agents=self.agents
        )
        self.run = setup(
            self.agents,
            config,
            env,
            data,
            eval_dataset,
            eval_env=eval_env,
            group_baseline=self.uses_estimator,
        )

    @property
    def step(self) -> int:
        """Optimizer steps taken so far."""
        return self.run.step

    @property
    def optimizers(self) -> list[Any]:
        """One optimizer per agent."""
        return self.run.optimizers

    @property
    def output_dir(self) -> Path:
        """Where metrics, samples and checkpoints go."""
        return self.run.output_dir

    def train_step(self) -> dict[str, float]:
        """One step of :func:`comlrl.algos.recipes.group_baseline.recipe.train_step`."""
        return train_step(self.run)

    def save(self, tag: str) -> list[Path]:
        """Checkpoint every agent under ``output_dir/<tag>/agent_<i>`` (atomically)."""
        return save(self.run, tag)

    def evaluate(self) -> dict[str, float]:
        """One evaluation row (:func:`comlrl.algos.recipes.group_baseline.recipe.evaluate`)."""
        return evaluate(self.run)

    def resume(self, checkpoint: str | Path) -> int:
        """Continue from a step checkpoint (:func:`~comlrl.algos.recipes.group_baseline.recipe.resume`);
        returns its step."""
        return resume(self.run, checkpoint)

    def train(self, *, overwrite: bool = False) -> list[dict[str, float]]:
        """Run :func:`comlrl.algos.recipes.group_baseline.recipe.train`; closes the task after.

        A fresh run refuses an ``output_dir`` that holds another run (as ``comlrl train``
        does): :meth:`resume` it first, or pass ``overwrite=True`` to delete that run's
        outputs.

        Raises:
            ConfigError: ``output_dir`` holds another run and ``overwrite`` is False.
        """
        try:
            return train(self.run, record=self.record, overwrite=overwrite)
        finally:
            if self.task is not None:
                self.task.close()


class MAGRPOTrainer(MultiAgentTrainer):
    """Multi-agent GRPO: group-mean baseline, divided by the group std (Shao et al. 2024, eq. 3)."""

    estimator = "grpo"


class MARLOOTrainer(MultiAgentTrainer):
    """Multi-agent RLOO: leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024)."""

    estimator = "rloo"


class MAReMaxTrainer(MultiAgentTrainer):
    """Multi-agent ReMax: the best return of the other samples as the baseline (after Li et
    al. 2023; leave-one-out, so unbiased)."""

    estimator = "remax"


class MAREINFORCETrainer(MultiAgentTrainer):
    """Multi-agent REINFORCE: no baseline (Williams 1992)."""

    estimator = "reinforce"


def run_group_baseline(config: TrainConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=magrpo`` / ``mareinforce`` / ``marloo`` / ``maremax``:
    :class:`~comlrl.algos.MultiAgentTrainer` with ``config.estimator`` on ``config.task``
    (:func:`run_policy_gradient`)."""
    from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer

    return run_policy_gradient(config, outputs, MultiAgentTrainer, f"estimator {config.estimator}")


def run_policy_gradient(
    config: RLConfig,
    outputs: RunOutputs | None,
    trainer_cls: Callable[..., Any],
    label: str,
    *,
    num_models: int | None = None,
    refuse_tools: str | None = None,
) -> RunResult:
    """Task -> agents -> trainer -> train -> summary, the run ``comlrl train`` has always
    made (for the actor-critic trainers too: the same task, agents and outputs).
    ``trainer_cls(agents, config, task=, dataset=)`` builds the trainer; ``num_models``
    agents are loaded (default ``config.num_agents``; centralized MAGRPO: 1);
    ``refuse_tools`` names a recipe that cannot take tools (see
    :func:`~comlrl.algos.recipes.launch.preflight`). ``outputs`` (default: the
    config's) replace the config's output fields; with ``outputs.resume_from`` the run
    continues from that step checkpoint (a finished one returns no rows).

    Raises:
        ConfigError: a bad config, task, model name or checkpoint, before training (a
            model that does not load too, as its ``OSError`` / ``ValueError`` message).
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
        RewardFunctionError: the reward function failed (the last completed step is
            checkpointed).
    """
    import torch
    from comlrl.algos.models.ranks import is_main, rank_and_world
    from comlrl.algos.training.run import lifecycle
    from comlrl.algos.training.run.checkpoint import CheckpointError
    from comlrl.algos.training.run.summary import summary_line

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    main = is_main()
    if main:
        outputs.check_folder()
    task, examples = preflight(config, config.models, refuse_tools=refuse_tools)
    quiet_transformers()
    world = rank_and_world()[1]
    who = f"{config.num_agents} agents"
    if num_models is not None and num_models != config.num_agents:
        who = f"{num_models} policy for {config.num_agents} roles"
    if main:
        announce(
            config,
            len(examples),
            f"{label}, {config.num_steps} step{'s' if config.num_steps != 1 else ''} of "
            f"{config.batch_size} prompts x {config.num_generations} completions",
            who,
        )
        if world > 1:
            print(
                f"comlrl: data parallel over {world} processes ({config.data_parallel}), "
                f"{config.batch_size // world} prompts each",
                file=sys.stderr,
            )
    torch.manual_seed(config.seed)
    try:
        with setup_errors():
            agents = load_agents(config, num_models, **config.generation_options())
            trainer = trainer_cls(agents, config, task=task, dataset=examples)
    except BaseException:
        task.close()
        raise
    if outputs.overwrite and outputs.resume_from is None and main:  # now that the models loaded
        lifecycle.clear_run_outputs(config.output_dir)
    if outputs.resume_from is not None:
        try:
            step = trainer.resume(outputs.resume_from)
        except (CheckpointError, NotImplementedError) as exc:
            task.close()
            trainer.run.close()
            raise CheckpointError(f"cannot resume from {outputs.resume_from}: {exc}") from None
        if main:
            print(resuming_line(config.output_dir, step, config.num_steps, outputs.resume_from))
        if step >= config.num_steps:
            task.close()
            trainer.run.close()
            return RunResult(
                [],
                f"nothing to do: the run already has {step} steps; pass num_steps=N to train "
                "longer",
                outputs.output_dir,
            )
    history = trainer.train()
    return RunResult(history, summary_line(history, config.output_dir), outputs.output_dir)
