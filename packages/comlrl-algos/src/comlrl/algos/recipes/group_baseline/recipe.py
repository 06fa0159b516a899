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
4. :func:`~comlrl.algos.training.shared_models.update_sharers` per agent (concurrently where
   it helps; agents on one model object take one step on the sum of their losses):
   one optimizer step on the whole rollout, or with ``update_chunk_nodes`` one per chunk of
   tree nodes in CoMLRL 1.4.3's order (:mod:`comlrl.algos.training.node_chunks`);
5. metrics.

The four methods differ only in ``config.estimator``. :func:`setup` builds the run state
once; :func:`train` loops, logs, evaluates (:func:`evaluate`) and checkpoints
(:func:`checkpoint`); :func:`resume` puts a run back at a step checkpoint.

:mod:`.setup` builds the run and :mod:`.state` saves and restores it; this module has the
step, evaluation and the loop, and every name is importable from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.models.gradient_sync import full_weights
from comlrl.algos.models.ranks import all_reduce_flag, barrier, gather_objects, shard_bounds
from comlrl.algos.recipes.group_baseline.setup import GroupBaselineRun, setup
from comlrl.algos.recipes.group_baseline.state import checkpoint, resume, save
from comlrl.algos.records import Rollout
from comlrl.algos.rollout import evaluate as evaluation
from comlrl.algos.rollout.tree import derive_seed, rollout
from comlrl.algos.training import checkpoint as ckpt
from comlrl.algos.training.config import ConfigError, RLConfig, TrainConfig
from comlrl.algos.training.loop import (
    Collective,
    LoopSettings,
    RecipeLoop,
    StepResult,
    run_loop,
)
from comlrl.algos.training.metrics import merge_summaries, rollout_summary, summary_metrics
from comlrl.algos.training.node_chunks import update_in_node_chunks
from comlrl.algos.training.reporting import build_reporters
from comlrl.algos.training.shared_models import sharing_groups, update_sharers
from comlrl.algos.training.update import split_terms
from comlrl.estimators.advantages import (
    compute_advantages,
    return_moments,
    std_from_moments,
)
from comlrl.estimators.joint import credit_completions
from comlrl.estimators.registry import resolve_estimator

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
    "evaluate_rollouts",
    "checkpoint",
    "resume",
]


def group_advantages(
    ro: Rollout, *, estimator: str, scale: str = "auto", eps: float = 1e-6
) -> list[list[torch.Tensor]]:
    """Advantages of every completion: per turn ``t``, per agent, ``[N_t * G]`` float32.

    Each completion's return is the mean return of the joint actions it took part in
    (:func:`~comlrl.estimators.joint.credit_completions`); its group is the ``G`` completions
    its agent sampled at the same node (:func:`~comlrl.estimators.advantages.compute_advantages`).

    ``scale="batch"`` divides each (turn, agent)'s advantages by the std of that turn's
    credited returns of the agent over the *global* batch: under data parallelism each rank
    holds a shard of the prompts, so the shards' :func:`return_moments` are summed over the
    ranks (:func:`~comlrl.algos.models.ranks.gather_objects`; a rank may have no
    nodes at a later turn) and every rank divides by the same std as one process would.
    Every rank must call this together.
    """
    credited = []
    for turn in ro.turns:
        g = turn.agents[0].batch.group_size
        credited.append(credit_completions(turn.returns, turn.joint_index, g))  # [A, N_t, G]
    batch_stds: list[list[float | None]] = [[None] * c.shape[0] for c in credited]
    resolved = resolve_estimator(estimator).scale if scale == "auto" else scale
    if resolved == "batch":
        batch_stds = _global_batch_stds(credited)
    return [
        [
            compute_advantages(
                per_turn[a],
                estimator=estimator,
                scale=scale,  # type: ignore[arg-type]
                eps=eps,
                batch_std=batch_stds[t][a],
            ).reshape(-1)
            for a in range(per_turn.shape[0])
        ]
        for t, per_turn in enumerate(credited)
    ]


def _global_batch_stds(credited: list[torch.Tensor]) -> list[list[float | None]]:
    """Per turn and agent, the std of the credited returns of every rank's nodes."""
    local = {
        (t, a): return_moments(per_turn[a]).cpu()
        for t, per_turn in enumerate(credited)
        for a in range(per_turn.shape[0])
    }
    total: dict[tuple[int, int], torch.Tensor] = {}
    for shard in gather_objects(local):
        for key, moments in shard.items():
            total[key] = total[key] + moments if key in total else moments
    return [
        [std_from_moments(total[(t, a)]) for a in range(per_turn.shape[0])]
        for t, per_turn in enumerate(credited)
    ]


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
        adv = group_advantages(
            ro, estimator=cfg.estimator, scale=cfg.advantage_scale, eps=cfg.advantage_eps
        )
    except Exception:
        ckpt.restore_state(
            streams, optimizers=(), data=run.data, rng=run.rng, generators=generators
        )
        raise
    t1 = time.perf_counter()

    # agents that share one model object take one step on the sum of their losses (one
    # set of optimizer moments, the first sharer's optimizer); each reports that step's
    # loss and grad norm and its own completions' KL/clip/ratio (shared_models)
    groups = {g[0]: g for g in sharing_groups([agent.model for agent in run.agents])}

    def update(a: int) -> dict[int, dict[str, float]]:
        members = groups.get(a)
        if members is None:  # another agent's update steps this model
            return {}
        ref_model = run.ref_models[a] if run.ref_models is not None else None
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
