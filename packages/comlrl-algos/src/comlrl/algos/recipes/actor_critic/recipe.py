"""The actor-critic recipes: IAC (independent critics) and MAAC (one centralised critic).

One step, read top to bottom in :func:`train_step`:

1. the next ``batch_size`` examples;
2. :func:`~comlrl.algos.rollout.tree.rollout`, as in the group-baseline recipe: ``G``
   completions per node per agent (``G = 1``: one trajectory per prompt, CoMLRL 1.4.3's
   setting), joint rewards per turn from the environment, the next turn's nodes from its
   feedback;
3. :func:`critic_inputs` + :func:`rollout_values`: the critics' values of every node
   (``critic_type="v"``) or joint action (``"q"``), without gradient, at sampling time:
   IAC gives each agent a critic that reads only that agent's prompt (and completion);
   MAAC's one critic reads every agent's prompt (and the joint action);
4. :func:`~comlrl.algos.functional.gae.tree_gae`: per-turn GAE advantages and lambda-return targets
   (Schulman et al. 2016) on the rollout tree; each completion is credited with the mean
   advantage of the joint actions it took part in
   (:func:`~comlrl.algos.functional.joint.credit_completions`), optionally whitened per agent;
5. the actor update: :func:`~comlrl.algos.training.update.update_policy` with the PPO clip against
   the behaviour log-probs; the critic update: :func:`update_critic` (clipped value loss,
   its own optimizer and learning rate). With a value head on the actor's own model
   (IAC, ``critic_mode="shared"``) both losses go into one backward and one optimizer
   step (:func:`update_shared`), weighted ``policy + value_loss_coef * value``.

:func:`setup` builds the run once (the agents, data, sampling and pools of
:func:`comlrl.algos.recipes.group_baseline.recipe.setup`, plus the critics);
:func:`train` loops, logs, evaluates and saves; :func:`save` writes every agent and
critic (value heads as ``value_head.safetensors`` beside the Hugging Face weights);
:func:`checkpoint` writes a resumable step checkpoint and :func:`resume` continues from one.

One module per job, gathered here: :mod:`.config` (the config, critic placement),
:mod:`.critic` (critic inputs, values, advantages, updates), :mod:`.setup` (building the
run), :mod:`.state` (the run, saving, checkpoints, resume); this module has the step and
the loop.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from comlrl.algos.functional.gae import value_loss
from comlrl.algos.recipes.actor_critic.config import (
    ActorCriticConfig,
    critic_placement,
    planned_agent_devices,
)
from comlrl.algos.recipes.actor_critic.config import Method as Method  # the trainers' type
from comlrl.algos.recipes.actor_critic.critic import (
    AGENT_REWARDS_KEY,
    agent_rewards,
    critic_advantages,
    critic_inputs,
    joint_prompt,
    rollout_values,
    update_critic,
    update_shared,
)
from comlrl.algos.recipes.actor_critic.setup import actor_update_settings, attach, setup
from comlrl.algos.recipes.actor_critic.state import ActorCriticRun, checkpoint, resume, save
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.rollout.tree import rollout
from comlrl.algos.training.loop import RecipeLoop, StepResult, run_loop
from comlrl.algos.training.steps import rollout_metrics
from comlrl.algos.training.update import split_terms, update_policy

__all__ = [
    "ActorCriticConfig",
    "ActorCriticRun",
    "AGENT_REWARDS_KEY",
    "agent_rewards",
    "joint_prompt",
    "critic_inputs",
    "rollout_values",
    "critic_advantages",
    "update_critic",
    "update_shared",
    "actor_update_settings",
    "critic_placement",
    "planned_agent_devices",
    "setup",
    "attach",
    "step",
    "train_step",
    "train",
    "save",
    "checkpoint",
    "resume",
    "evaluate",
]


def train_step(run: ActorCriticRun) -> dict[str, float]:
    """The metrics row of one :func:`step`."""
    return step(run).row


def step(run: ActorCriticRun) -> StepResult:
    """One step: rollout, critic values, GAE, actor and critic updates; the metrics row
    and the rollout."""
    cfg, base = run.config, run.base
    t0 = time.perf_counter()
    examples = base.data.next_batch(cfg.batch_size)
    ro = rollout(
        base.agents,
        examples,
        base.env,
        base.sampling,
        base.tree,
        map_agents=base.sample_pool.map,
        rng=base.rng,
    )
    t1 = time.perf_counter()
    per_turn_texts = [
        [critic_inputs(turn, run.method, cfg.critic_type, c) for turn in ro.turns]
        for c in range(len(run.critics))
    ]
    texts = [[s for turn in per_turn for s in turn] for per_turn in per_turn_texts]
    live: list[torch.Tensor] | None = None
    if _can_fuse_critic_forward(run):
        # One forward per critic serves both the sampling-time values and the value loss.
        live = [critic.values(texts[c]) for c, critic in enumerate(run.critics)]
        values = [
            list(torch.split(v.detach().float().cpu(), [len(x) for x in per_turn_texts[c]]))
            for c, v in enumerate(live)
        ]
    else:
        for critic in run.critics:
            critic.trunk.eval()
        values = rollout_values(ro, run.critics, run.method, micro_batch_size=cfg.micro_batch_size)
        for critic in run.critics:
            critic.trunk.train()
    adv, targets = critic_advantages(
        ro,
        values,
        run.method,
        cfg.critic_type,
        gamma=cfg.gamma,
        lam=cfg.gae_lambda,
        normalize=cfg.advantage_normalization,
        num_turns=cfg.num_turns,
    )
    old = [torch.cat(v) for v in values]
    tgt = [torch.cat(t) for t in targets]
    t2 = time.perf_counter()

    # actors that share one model object take one step on the sum of their losses
    sharers: dict[int, list[int]] = {}
    for a, agent in enumerate(base.agents):
        sharers.setdefault(id(agent.model), []).append(a)
    actor_stats: dict[int, dict[str, float]] = {}

    def update_actor(a: int) -> dict[str, float]:
        batches = ro.agent_batches(a)
        per_turn = [per_agent[a] for per_agent in adv]
        members = sharers[id(base.agents[a].model)]
        if run.method == "iac" and run.critics[a].shared:
            return update_shared(
                base.agents[a].model,
                run.critics[a],
                base.optimizers[a],
                batches,
                per_turn,
                base.update,
                texts[a],
                old[a],
                tgt[a],
                coef=cfg.value_loss_coef,
                clip_range=cfg.value_clip_range,
                ref_model=base.ref_models[a] if base.ref_models is not None else None,
            )
        stats: dict[str, float] = {}
        if members[0] == a:  # the first sharer steps for all of them
            shared = update_policy(
                base.agents[a].model,
                base.optimizers[a],
                [b for m in members for b in ro.agent_batches(m)],
                [per_agent[m] for m in members for per_agent in adv],
                base.update,
                ref_model=base.ref_models[a] if base.ref_models is not None else None,
                terms=[m for m in members for _ in ro.turns] if len(members) > 1 else None,
                turns=[t for _ in members for t in range(len(ro.turns))],
            )
            actor_stats.update(split_terms(shared, members))
            stats = actor_stats[a]
        if run.method == "iac":
            stats = {**stats, **_critic_step(run, a, texts[a], old[a], tgt[a], live)}
        return stats

    stats = base.update_pool.map(update_actor)
    for a in range(len(base.agents)):  # sharers report the shared step, each its own terms
        first = sharers[id(base.agents[a].model)][0]
        if first != a and a in actor_stats:
            stats[a] = {**actor_stats[a], **stats[a]}
    critic_stats = (
        _critic_step(run, 0, texts[0], old[0], tgt[0], live) if run.method == "maac" else {}
    )
    t3 = time.perf_counter()
    base.step += 1
    metrics = rollout_metrics(
        ro, [[per_agent[a] for a in range(len(base.agents))] for per_agent in adv]
    )
    for a, agent_stats in enumerate(stats):
        metrics.update({f"{k}/agent_{a}": v for k, v in agent_stats.items()})
    metrics.update({f"critic/{k}": v for k, v in critic_stats.items()})
    elapsed = t3 - t0
    row = {
        "step": base.step,
        **metrics,
        **{f"time/{k}": v for k, v in ro.timings.items()},
        "time/critic_values_s": t2 - t1,
        "time/update_s": t3 - t2,
        "time/step_s": elapsed,
        "tokens_per_s": metrics["num_tokens"] / elapsed,
        "prompts_per_s": len(examples) / elapsed,
    }
    return StepResult(row, ro)


def _has_dropout(model: Any) -> bool:
    """True when ``model`` drops out anything in train mode (a ``Dropout`` module with
    ``p > 0`` or a config dropout probability > 0, e.g. Llama's ``attention_dropout``)."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
    config = getattr(model, "config", None)
    for key in ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop"):
        value = getattr(config, key, 0.0)
        if isinstance(value, int | float) and value > 0:
            return True
    return False


def _can_fuse_critic_forward(run: ActorCriticRun) -> bool:
    """Whether the critics' sampling-time values can come from the value loss's own
    forward: one critic update (``num_iterations == 1``, so the critic's weights are
    those of sampling time), all texts in one pass (``micro_batch_size`` None), separate
    critics (a shared trunk is the actor, updated together with it) and no dropout (the
    sampling-time values must not be noisy). The values are then the same numbers the
    unfused path computes (tested), and one critic forward per step is saved."""
    cfg = run.config
    return (
        cfg.num_iterations == 1
        and cfg.micro_batch_size is None
        and not any(c.shared for c in run.critics)
        and not any(_has_dropout(c.trunk) for c in run.critics)
    )


def _critic_step(
    run: ActorCriticRun,
    c: int,
    texts: list[str],
    old: torch.Tensor,
    tgt: torch.Tensor,
    live: list[torch.Tensor] | None = None,
) -> dict[str, float]:
    cfg = run.config
    optimizer = run.critic_optimizers[c]
    assert optimizer is not None  # shared critics are updated in update_shared
    if live is not None:
        return _fused_critic_update(run, c, optimizer, live[c], old, tgt)
    return update_critic(
        run.critics[c],
        optimizer,
        texts,
        old,
        tgt,
        coef=cfg.value_loss_coef,
        clip_range=cfg.value_clip_range,
        num_iterations=cfg.num_iterations,
        max_grad_norm=cfg.max_grad_norm,
        micro_batch_size=cfg.micro_batch_size,
    )


def _fused_critic_update(
    run: ActorCriticRun,
    c: int,
    optimizer: torch.optim.Optimizer,
    values: torch.Tensor,
    old: torch.Tensor,
    tgt: torch.Tensor,
) -> dict[str, float]:
    """:func:`update_critic` with one iteration on values already computed with gradient
    (``values [M]``, the graph of this step's critic forward); same loss and metrics."""
    cfg, critic = run.config, run.critics[c]
    optimizer.zero_grad(set_to_none=True)
    target = tgt.to(values.device)
    loss, stats = value_loss(
        values.unsqueeze(1).expand_as(target),
        target,
        old_values=old.to(values.device).unsqueeze(1).expand_as(target),
        clip_range=cfg.value_clip_range,
    )
    (loss * cfg.value_loss_coef).backward()
    if cfg.max_grad_norm is not None:
        stats["critic_grad_norm"] = float(
            torch.nn.utils.clip_grad_norm_(list(critic.parameters()), cfg.max_grad_norm)
        )
    optimizer.step()
    return stats


def evaluate(run: ActorCriticRun) -> dict[str, float]:
    """The agents' evaluation row (:func:`comlrl.algos.recipes.group_baseline.recipe.evaluate`;
    critics play no part at evaluation)."""
    return group_baseline.evaluate(run.base)


def train(
    run: ActorCriticRun, *, record: dict[str, Any] | None = None, overwrite: bool = False
) -> list[dict[str, float]]:
    """Run ``config.num_steps`` steps under the loop driver
    (:func:`comlrl.algos.training.loop.run_loop`), as the group-baseline recipe does:
    ``metrics.jsonl`` and ``samples.jsonl`` rows per step, ``eval.jsonl`` every
    ``eval_every`` steps (and at step 0 with ``eval_on_start``), ``config.yaml`` (with
    ``algo``: what ``comlrl train --resume`` runs), the reporters of ``report_to``
    (TensorBoard, W&B, ``reward_curve.png``), resumable step checkpoints
    ``checkpoints/step-NNNNNN/`` every ``save_every`` steps and at the last step
    (:func:`checkpoint`), and ``final/`` (:func:`save`) in ``output_dir``. A run put back
    by :func:`resume` continues from its step. ``record`` (default: ``algo`` and the
    config) is what ``config.yaml`` holds; a fresh run refuses an ``output_dir`` that holds
    another run unless ``overwrite``.

    Raises:
        ConfigError: ``output_dir`` holds another run and ``overwrite`` is False.
        TrainingInterrupted: after Ctrl-C: the step in progress was finished and
            checkpointed (the exception names the checkpoint).
    """
    cfg, base = run.config, run.base
    if base.step == 0:  # a resumed run has its random streams back from the checkpoint
        torch.manual_seed(cfg.seed)
    loop = RecipeLoop(
        step=lambda: step(run),
        checkpoint=lambda path: checkpoint(run, path),
        save_final=lambda path: save(run, path.name),
        evaluate=(lambda: evaluate(run)) if base.eval_data is not None else None,
        start_step=base.step,
    )
    settings = group_baseline.loop_settings(
        cfg,
        record=record if record is not None else {"algo": run.method, **cfg.model_dump()},
        desc=run.method,
        overwrite=overwrite,
    )
    try:
        return run_loop(loop, settings)
    finally:
        run.close()
