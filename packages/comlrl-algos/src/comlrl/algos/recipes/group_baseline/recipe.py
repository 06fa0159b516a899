"""The group-baseline recipe: MAGRPO, MARLOO, MAReMax and MAREINFORCE.

One step, read top to bottom in :func:`train_step` (``DESIGN.md`` §3):

1. the next ``batch_size`` examples;
2. :func:`~comlrl.algos.rollout.tree.rollout`: every agent samples ``G`` completions per node,
   joint actions are scored, and (multi-turn) the environment's feedback opens the next
   turn's nodes; returns are discounted down the tree;
3. :func:`group_advantages`: per turn and agent, each completion is credited with the
   mean return of the joint actions it took part in and compared with its ``G`` siblings
   by the estimator (``mean``: MAGRPO, leave-one-out: MARLOO, ``max``: MAReMax, none:
   MAREINFORCE);
4. :func:`~comlrl.algos.training.update.update_policy` per agent (concurrently where it helps);
5. metrics.

The four methods differ only in ``config.estimator``. :func:`setup` builds the run state
once; :func:`train` loops, logs, evaluates (:func:`evaluate`) and checkpoints
(:func:`checkpoint`); :func:`resume` puts a run back at a step checkpoint.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.functional.advantages import compute_advantages
from comlrl.algos.functional.joint import credit_completions
from comlrl.algos.models import distributed as dp
from comlrl.algos.models.devices import agent_placement
from comlrl.algos.models.lora import attach_lora, model_key, reference_model
from comlrl.algos.records import Rollout
from comlrl.algos.rollout import evaluate as evaluation
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.rollout.tree import TreeSettings, derive_seed, rollout
from comlrl.algos.training import checkpoint as ckpt
from comlrl.algos.training.config import ConfigError, TrainConfig
from comlrl.algos.training.diagnostics import warn_if_cannot_learn
from comlrl.algos.training.loop import (
    Collective,
    LoopSettings,
    RecipeLoop,
    StepResult,
    rewind_outputs,
    run_loop,
)
from comlrl.algos.training.reporting import build_reporters
from comlrl.algos.training.steps import (
    AgentPool,
    DataStream,
    build_optimizer,
    merge_summaries,
    resolve_device,
    rollout_summary,
    save_agent_checkpoint,
    summary_metrics,
)
from comlrl.algos.training.update import UpdateSettings, update_policy
from comlrl.core import SamplingParams

__all__ = [
    "GroupBaselineRun",
    "setup",
    "group_advantages",
    "step",
    "train_step",
    "loop_settings",
    "train",
    "save",
    "evaluate",
    "checkpoint",
    "resume",
]


@dataclass
class GroupBaselineRun:
    """What a group-baseline run holds between steps (built by :func:`setup`)."""

    config: TrainConfig
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
    #: data parallel (:mod:`comlrl.algos.models.distributed`): this process's rank, the number of
    #: ranks, and per agent the gradient averaging (None in a single process).
    rank: int = 0
    world_size: int = 1
    syncs: list[dp.GradientSync] | None = field(default=None, repr=False)

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
    config: TrainConfig,
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
    :class:`~comlrl.algos.models.distributed.GradientSync` of ``config.data_parallel``, each rank
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
        data = DataStream(dataset, seed=config.seed, shuffle=config.shuffle)
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
    rank, world = dp.rank_and_world()
    if world > 1:
        try:
            dp.shard_bounds(config.batch_size, rank, world)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
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
            agent.seed(_agent_seed(config.seed, i, rank))
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
        by_model: dict[int, dp.GradientSync] = {}  # one wrapper per model object
        syncs = [
            by_model.setdefault(id(a.model), dp.wrap_model(a.model, config.data_parallel))
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
        sampling=SamplingParams(
            num_generations=config.num_generations,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
        ),
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


def _agent_seed(seed: int, agent: int, rank: int, step: int = 0) -> int:
    """Seed of an agent's own sampling stream (``sampling_rng="agent"``); rank 0 at step 0
    keeps the single-process seed."""
    if rank == 0 and step == 0:
        return seed * 1_000_003 + agent
    return derive_seed(seed, agent, rank, step)


def group_advantages(
    ro: Rollout, *, estimator: str, scale: str = "auto", eps: float = 1e-6
) -> list[list[torch.Tensor]]:
    """Advantages of every completion: per turn ``t``, per agent, ``[N_t * G]`` float32.

    Each completion's return is the mean return of the joint actions it took part in
    (:func:`~comlrl.algos.functional.joint.credit_completions`); its group is the ``G`` completions
    its agent sampled at the same node (:func:`~comlrl.algos.functional.advantages.compute_advantages`).
    """
    out = []
    for turn in ro.turns:
        g = turn.agents[0].batch.group_size
        credited = credit_completions(turn.returns, turn.joint_index, g)  # [A, N_t, G]
        out.append(
            [
                compute_advantages(
                    credited[a],
                    estimator=estimator,
                    scale=scale,  # type: ignore[arg-type]
                    eps=eps,
                ).reshape(-1)
                for a in range(credited.shape[0])
            ]
        )
    return out


def train_step(run: GroupBaselineRun) -> dict[str, float]:
    """The metrics row of one :func:`step` (for callers that do not log samples)."""
    return step(run).row


def step(run: GroupBaselineRun) -> StepResult:
    """One step: rollout, advantages, every agent's update; returns the metrics row and
    the rollout (for ``samples.jsonl``).

    Data parallel (``run.world_size > 1``; every rank calls this together): this rank
    rolls out its share of the global batch, the update averages gradients over the
    ranks, and the returned metrics (rewards, advantages, lengths, losses, KL, clip
    fractions, tokens) are those of the global batch; timings are this rank's.
    """
    cfg = run.config
    t0 = time.perf_counter()
    examples = run.data.next_batch(cfg.batch_size)  # the same global batch on every rank
    keys = (
        [derive_seed(cfg.seed, run.step, j) for j in range(len(examples))]
        if cfg.sampling_rng == "prompt"
        else None
    )
    lo, hi = dp.shard_bounds(len(examples), run.rank, run.world_size)
    with dp.full_weights(run.syncs):  # fsdp2: whole weights for sampling, resharded after
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
    adv = group_advantages(
        ro, estimator=cfg.estimator, scale=cfg.advantage_scale, eps=cfg.advantage_eps
    )
    t1 = time.perf_counter()

    # agents that share one model object take one step on the sum of their losses (one
    # set of optimizer moments, the first sharer's optimizer); the others report its stats
    sharers: dict[int, list[int]] = {}
    for a, agent in enumerate(run.agents):
        sharers.setdefault(id(agent.model), []).append(a)

    def update(a: int) -> dict[str, float] | None:
        members = sharers[id(run.agents[a].model)]
        if members[0] != a:
            return None
        batches = [b for m in members for b in ro.agent_batches(m)]
        return update_policy(
            run.agents[a].model,
            run.optimizers[a],
            batches,
            [per_agent[m] for m in members for per_agent in adv],
            run.update,
            ref_model=run.ref_models[a] if run.ref_models is not None else None,
            sync=run.syncs[a] if run.syncs is not None else None,
            terms=[m for m in members for _ in ro.agent_batches(m)],
        )

    results = run.update_pool.map(update)
    stats = [results[sharers[id(agent.model)][0]] or {} for agent in run.agents]
    t2 = time.perf_counter()
    run.step += 1
    summary = rollout_summary(
        ro, [[per_agent[a] for a in range(len(run.agents))] for per_agent in adv]
    )
    metrics = summary_metrics(merge_summaries(dp.gather_objects(summary)))
    for a, agent_stats in enumerate(stats):
        metrics.update({f"{k}/agent_{a}": v for k, v in agent_stats.items()})
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


def evaluate(run: GroupBaselineRun) -> dict[str, float]:
    """The ``eval.jsonl`` row of the agents on ``run.eval_data`` (the training rollout,
    greedy or sampled, no update, scored in ``run.eval_env`` when set;
    :mod:`comlrl.algos.rollout.evaluate`). Raises ConfigError
    without an evaluation set."""
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
    row, _ = evaluation.evaluate(
        run.agents,
        run.env if run.eval_env is None else run.eval_env,
        run.eval_data,
        params,
        run.tree,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        map_agents=run.sample_pool.map,
    )  # fsdp2: called inside dp.full_weights (see train), so no collective runs here
    return {"step": run.step, **row}


def checkpoint(run: GroupBaselineRun, path: str | Path | None = None) -> Path:
    """Write the step checkpoint ``path`` (default ``output_dir/checkpoints/step-N``):
    agents + training state, atomically; returns the folder. (The loop driver prunes to
    ``keep_last``.)

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
    return ckpt.write_checkpoint(path, run.agents, state, state_dicts=models)


def resume(run: GroupBaselineRun, path: str | Path) -> int:
    """Put ``run`` back at the step checkpoint ``path`` (weights, optimizers, data stream,
    random streams), cut the logs in ``output_dir`` back to its step, and return the step:
    :func:`train` then continues as if never stopped. Raises CheckpointError when the
    checkpoint is incomplete or does not fit the run."""
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
                agent.seed(_agent_seed(run.config.seed, i, run.rank, run.step))
    if run.is_main:
        rewind_outputs(run.output_dir, run.step)
    dp.barrier()
    return run.step


def loop_settings(
    config: TrainConfig,
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
        reporters=lambda out: build_reporters(config, out),
        overwrite=overwrite,
    )


def collective(run: GroupBaselineRun) -> Collective:
    """How the ranks of ``run`` agree (one process: the defaults)."""
    return Collective(
        is_main=run.is_main,
        any_rank=dp.all_reduce_flag,
        barrier=dp.barrier,
        full_weights=lambda: dp.full_weights(run.syncs),
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
    of :func:`~comlrl.algos.training.reporting.build_reporters` (TensorBoard, W&B,
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
