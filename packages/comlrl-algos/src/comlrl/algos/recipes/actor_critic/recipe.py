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
4. :func:`~comlrl.estimators.gae.tree_gae`: per-turn GAE advantages and lambda-return targets
   (Schulman et al. 2016) on the rollout tree; each completion is credited with the mean
   advantage of the joint actions it took part in
   (:func:`~comlrl.estimators.joint.credit_completions`), optionally whitened per agent;
5. the actor update: :func:`~comlrl.algos.training.shared_models.update_sharers` (the
   policy update, with the PPO clip against the behaviour log-probs); the critic update:
   :func:`update_critics` (clipped value loss, its own optimizer and learning rate). With
   a value head on the actor's own model (IAC, ``critic_mode="shared"``) both losses go
   into one backward and one optimizer step (:func:`value_terms`), weighted ``policy +
   value_loss_coef * value``. Agents given one model object take one optimizer step on
   the sum of their losses (and of their heads' value losses), as in the group-baseline
   recipe; separate critics on one trunk object take one step on the sum of theirs.

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
)
from comlrl.algos.recipes.actor_critic.critic_updates import (
    update_critic,
    update_critics,
    update_shared,
    value_terms,
)
from comlrl.algos.recipes.actor_critic.setup import actor_update_settings, attach, setup
from comlrl.algos.recipes.actor_critic.state import ActorCriticRun, checkpoint, resume, save
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.rollout.tree import rollout
from comlrl.algos.training.loop import RecipeLoop, StepResult, run_loop
from comlrl.algos.training.metrics import rollout_metrics
from comlrl.algos.training.shared_models import sharing_groups, update_sharers
from comlrl.estimators.gae import value_loss

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
    "update_critics",
    "value_terms",
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

    # Agents on one model object take one step on the sum of their losses (with value
    # heads on that model, plus coef times the sum of their value losses), with the first
    # one's optimizer; separate critics on one trunk take one step on the sum of their
    # value losses (training.shared_models).
    actor_groups = {g[0]: g for g in sharing_groups([a.model for a in base.agents])}
    critic_groups = {
        g[0]: g
        for g in sharing_groups([c.trunk for c in run.critics])
        if run.method == "iac" and not run.critics[g[0]].shared
    }

    def update(a: int) -> list[tuple[int, dict[str, float]]]:
        out: list[tuple[int, dict[str, float]]] = []
        members = actor_groups.get(a)
        if members is not None:
            heads = {
                m: run.critics[m] for m in members if run.method == "iac" and run.critics[m].shared
            }
            values = (
                value_terms(
                    heads, dict(enumerate(texts)), dict(enumerate(old)), dict(enumerate(tgt)),
                    coef=cfg.value_loss_coef, clip_range=cfg.value_clip_range,
                    micro_batch_size=base.update.micro_batch_size,
                )
                if heads
                else None
            )  # fmt: skip
            out += update_sharers(
                base.agents[a].model, base.optimizers[a], ro, adv, members, base.update,
                ref_model=base.ref_models[a] if base.ref_models is not None else None,
                extra_loss=values,
                extra_params=[p for c in heads.values() for p in c.head.parameters()],
            ).items()  # fmt: skip
        critics = critic_groups.get(a)
        if critics is not None:
            out += zip(critics, _critic_step(run, critics, texts, old, tgt, live), strict=True)
        return out

    stats: list[dict[str, float]] = [{} for _ in base.agents]
    for parts in base.update_pool.map(update):
        for m, own in parts:
            stats[m].update(own)
    critic_stats = _critic_step(run, [0], texts, old, tgt, live)[0] if run.method == "maac" else {}
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
    members: list[int],
    texts: list[list[str]],
    old: list[torch.Tensor],
    tgt: list[torch.Tensor],
    live: list[torch.Tensor] | None = None,
) -> list[dict[str, float]]:
    """One critic update of the separate critics ``members`` (one critic, or critics on
    one trunk: one step on the sum of their value losses, with their one optimizer);
    each member's value metrics."""
    cfg = run.config
    optimizer = run.critic_optimizers[members[0]]
    assert optimizer is not None  # value heads on an actor are stepped with the actor
    if live is not None:
        return _fused_critic_update(run, members, optimizer, live, old, tgt)
    return update_critics(
        [run.critics[c] for c in members],
        optimizer,
        [texts[c] for c in members],
        [old[c] for c in members],
        [tgt[c] for c in members],
        coef=cfg.value_loss_coef,
        clip_range=cfg.value_clip_range,
        num_iterations=cfg.num_iterations,
        max_grad_norm=cfg.max_grad_norm,
        micro_batch_size=cfg.micro_batch_size,
    )


def _fused_critic_update(
    run: ActorCriticRun,
    members: list[int],
    optimizer: torch.optim.Optimizer,
    live: list[torch.Tensor],
    old: list[torch.Tensor],
    tgt: list[torch.Tensor],
) -> list[dict[str, float]]:
    """:func:`update_critics` with one iteration on values already computed with gradient
    (``live[c]``, ``[M_c]``: the graph of this step's forward of critic ``c``); same loss
    and metrics."""
    cfg = run.config
    optimizer.zero_grad(set_to_none=True)
    out = []
    for c in members:
        values = live[c]
        target = tgt[c].to(values.device)
        loss, stats = value_loss(
            values.unsqueeze(1).expand_as(target),
            target,
            old_values=old[c].to(values.device).unsqueeze(1).expand_as(target),
            clip_range=cfg.value_clip_range,
        )
        (loss * cfg.value_loss_coef).backward()
        out.append(stats)
    if cfg.max_grad_norm is not None:
        params = {id(p): p for c in members for p in run.critics[c].parameters()}
        norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.max_grad_norm))
        for stats in out:
            stats["critic_grad_norm"] = norm
    optimizer.step()
    return out


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
