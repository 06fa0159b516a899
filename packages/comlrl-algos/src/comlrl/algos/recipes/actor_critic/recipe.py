"""Building an actor-critic run: the critics (loaded, or a value head on each actor's
trunk), placed and given optimizers, on top of the group-baseline recipe's run
(:func:`setup`, :func:`attach`).

What an actor-critic run holds (:class:`ActorCriticRun`) and how it is saved: ``final/``
(:func:`save`), resumable step checkpoints in the one format (:func:`checkpoint`) and
continuing from one (:func:`resume`).

The actor-critic recipes: IAC (independent critics) and MAAC (one centralised critic).

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
5. the actor update: :func:`~comlrl.algos.training.update.shared_models.update_sharers` (the
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

Beside this module: :mod:`.config` (the config, critic placement), :mod:`.critic`
(critic inputs, values, advantages) and :mod:`.critic_updates` (the critics' updates); this
module builds the run, steps, saves, checkpoints and resumes it.

Trainer objects for the actor-critic recipes: a thin front over
:mod:`comlrl.algos.recipes.actor_critic.recipe`.

``IACTrainer(agents, config, task=...)`` / ``MAACTrainer(...)`` take the same task or
CoMLRL-style ``dataset`` + ``formatters`` + ``reward_func`` (+ ``transition``) arguments
as :class:`~comlrl.algos.recipes.group_baseline.recipe.MultiAgentTrainer`, an
:class:`~comlrl.algos.recipes.actor_critic.recipe.ActorCriticConfig`, and optionally ready-made
``critics`` (:class:`~comlrl.algos.models.value.Critic`). The loop and the maths live in the
recipe.

The end-to-end runs of the actor-critic recipes (``algo=iac``, ``algo=maac``): the
group-baseline run (:func:`~comlrl.algos.recipes.group_baseline.recipe.run_policy_gradient`:
the same task, agents and outputs) with an actor-critic trainer.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.models.devices import model_device
from comlrl.algos.models.value import Critic, ValueHead, hidden_size_of, save_value_head
from comlrl.algos.recipes.actor_critic.config import (
    ActorCriticConfig,
    Method,
    critic_placement,
    planned_agent_devices,
)
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
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline.recipe import (
    GroupBaselineRun,
    MultiAgentTrainer,
    run_policy_gradient,
)
from comlrl.algos.recipes.launch import RunOutputs, RunResult
from comlrl.algos.rollout.environment import Environment, Transition
from comlrl.algos.rollout.metrics import rollout_metrics
from comlrl.algos.rollout.tree import rollout
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.loop import RecipeLoop, StepResult, rewind_outputs, run_loop
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.run.saving import save_agent_checkpoint
from comlrl.algos.training.update.agents import build_optimizer
from comlrl.algos.training.update.policy import UpdateSettings
from comlrl.algos.training.update.shared_models import sharing_groups, update_sharers
from comlrl.core import Task
from comlrl.estimators.gae import value_loss

__all__ = [
    "actor_update_settings",
    "attach",
    "setup",
    "ActorCriticRun",
    "save",
    "checkpoint",
    "resume",
    "ActorCriticConfig",
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
    "critic_placement",
    "planned_agent_devices",
    "step",
    "train_step",
    "train",
    "evaluate",
    "IACTrainer",
    "MAACTrainer",
    "run_iac",
    "run_maac",
]


def _check_critics(
    critics: Sequence[Critic], method: Method, config: ActorCriticConfig, agents: Sequence[Any]
) -> None:
    want = len(agents) if method == "iac" else 1
    if len(critics) != want:
        raise ConfigError(f"{method.upper()} needs {want} critic(s), got {len(critics)}.")
    for i, critic in enumerate(critics):
        if critic.kind != config.critic_type:
            raise ConfigError(
                f"critic {i} is of kind {critic.kind!r} but config.critic_type={config.critic_type!r}."
            )
        if critic.shared and (method == "maac" or critic.trunk is not agents[i].model):
            raise ConfigError(
                f"critic {i} is marked shared but its trunk is not agent {i}'s model; a shared "
                "critic must sit on its own agent's model (IAC only)."
            )
        if not critic.shared and any(critic.trunk is a.model for a in agents):
            raise ConfigError(
                f"critic {i} is separate but its trunk is an agent's model, which its own "
                "optimizer would step a second time; use critic_mode='shared' (a value head "
                "on the agent's model, IAC) or give the critic its own model."
            )


def _build_critics(
    agents: Sequence[Any], config: ActorCriticConfig, method: Method
) -> list[Critic]:
    from comlrl.algos.models.loading import load_model_and_tokenizer

    if method == "iac" and config.critic_mode == "shared":
        return [
            Critic(
                a.model,
                a.tokenizer,
                ValueHead(hidden_size_of(a.model), config.value_head_hidden_dim),
                kind=config.critic_type,
                shared=True,
                max_length=config.critic_max_length,
            )
            for a in agents
        ]
    count = len(agents) if method == "iac" else 1
    out = []
    for i in range(count):
        name = config.critic_model or config.model_for(i)
        trunk, tok = load_model_and_tokenizer(
            name,
            seed=config.seed + 7919 * (i + 1),
            dtype=config.dtype,
            trust_remote_code=config.trust_remote_code,
        )
        head = ValueHead(hidden_size_of(trunk), config.value_head_hidden_dim)
        out.append(
            Critic(trunk, tok, head, kind=config.critic_type, max_length=config.critic_max_length)
        )
    return out


def actor_update_settings(settings: UpdateSettings, num_generations: int) -> UpdateSettings:
    """The actors' update settings: ``settings``, with ``shared_prefix`` off when ``G = 1``.

    The shared-prefix path runs each prompt through the model once and repeats its KV cache
    for the prompt's ``G`` completions; with one completion per prompt (CoMLRL 1.4.3's
    multi-turn setting) there is nothing to share and the split costs a second decoder call
    per turn (measured on stories260k, 4 prompts, 2 turns, 1 thread: 43 -> 37 ms per agent
    forward). The single forward computes the same log-probs and gradient up to float32
    round-off (tested against the shared-prefix path).
    """
    if num_generations == 1 and settings.shared_prefix:
        return dataclasses.replace(settings, shared_prefix=False)
    return settings


def attach(
    base: GroupBaselineRun,
    config: ActorCriticConfig,
    method: Method,
    critics: Sequence[Critic] | None = None,
) -> ActorCriticRun:
    """Add critics to a run built by :func:`comlrl.algos.recipes.group_baseline.recipe.setup`.

    Builds the critics from ``config`` when ``critics`` is None (separate critics load
    ``config.critic_model`` or the agent's model; a shared one puts a new head on the
    actor), places them (:func:`critic_placement`: ``critic_devices``, else beside their
    agents; checked before any critic loads or moves) and gives each separate critic an optimizer
    with ``config.critic_lr`` (critics on one trunk object: one optimizer, the same object
    for each, over all their parameters); a shared head joins its actor's optimizer as a
    parameter group with that learning rate (agents on one model object: the first one's
    optimizer, which steps for all of them). With ``G = 1`` the actors' update runs each prompt and
    its completion in one forward (:func:`actor_update_settings`).

    Raises:
        ConfigError: ``method`` unknown, MAAC with ``critic_mode="shared"``, critics
            that do not fit (count, kind, a shared critic not on its agent's model), or
            ``critic_devices`` that do not fit (:func:`critic_placement`).
    """
    if method not in ("iac", "maac"):
        raise ConfigError(f"unknown actor-critic method {method!r}; use 'iac' or 'maac'.")
    if method == "maac" and config.critic_mode == "shared":
        raise ConfigError(
            "MAAC's critic is centralised (it reads every agent's prompt), so it cannot share "
            "one actor's model: set critic_mode='separate'."
        )
    agents = base.agents
    devices = critic_placement(config, method, [model_device(a.model) for a in agents])
    critics = list(critics) if critics is not None else _build_critics(agents, config, method)
    _check_critics(critics, method, config, agents)
    base.update = actor_update_settings(base.update, config.num_generations)
    # agents on one model object step together with their leader's optimizer
    # (training.shared_models), so every value head on that model joins it; separate
    # critics on one trunk share one optimizer over all their parameters
    leader = {a: g[0] for g in sharing_groups([a.model for a in agents]) for a in g}
    optimizers: list[torch.optim.Optimizer | None] = [None] * len(critics)
    for i, critic in enumerate(critics):
        critic.head.to(devices[i])
        if critic.shared:
            base.optimizers[leader[i]].add_param_group(
                {"params": list(critic.head.parameters()), "lr": config.critic_lr}
            )
        else:
            critic.trunk.to(devices[i])
            critic.trunk.train()
    for group in sharing_groups([c.trunk for c in critics]):
        if critics[group[0]].shared:
            continue
        params = {id(p): p for c in group for p in critics[c].parameters()}
        optimizer = build_optimizer(
            list(params.values()),
            config.optimizer,
            lr=config.critic_lr,
            weight_decay=config.weight_decay,
        )
        for c in group:
            optimizers[c] = optimizer
    return ActorCriticRun(base, config, method, critics, optimizers)


def setup(
    agents: Sequence[Any],
    config: ActorCriticConfig,
    env: Environment,
    dataset: Sequence[Mapping[str, Any]],
    eval_dataset: Sequence[Mapping[str, Any]] | None = None,
    *,
    method: Method,
    critics: Sequence[Critic] | None = None,
) -> ActorCriticRun:
    """:func:`comlrl.algos.recipes.group_baseline.recipe.setup` (agents, data, actor optimizers,
    sampling, pools) followed by :func:`attach` (critics). ``critic_devices`` is checked
    before any model moves. Raises ConfigError as they do."""
    critic_placement(config, method, planned_agent_devices(config, len(agents)))
    base = group_baseline.setup(agents, config, env, dataset, eval_dataset, group_baseline=False)
    return attach(base, config, method, critics)


@dataclass
class ActorCriticRun:
    """What an actor-critic run holds between steps (built by :func:`setup`).

    ``base`` holds agents, environment, data, actor optimizers, sampling and pools;
    ``critics`` is one per agent (IAC) or one (MAAC); ``critic_optimizers[i]`` is None
    for a shared-trunk critic, whose head is a parameter group of its actor's optimizer.
    """

    base: GroupBaselineRun
    config: ActorCriticConfig
    method: Method
    critics: list[Critic]
    critic_optimizers: list[torch.optim.Optimizer | None]

    @property
    def step(self) -> int:
        return self.base.step

    def close(self) -> None:
        """Stop worker threads (safe to call twice)."""
        self.base.close()


def save(run: ActorCriticRun, tag: str) -> list[Path]:
    """Write every agent to ``output_dir/<tag>/agent_<i>`` (Hugging Face format, atomically)
    with, for a shared-trunk critic, its value head beside the weights; separate critics go
    to ``critic_<i>`` (IAC) or ``critic`` (MAAC), trunk and head. Returns the folders."""
    root = run.base.output_dir / tag
    out = []
    for i, agent in enumerate(run.base.agents):
        path = save_agent_checkpoint(agent, root / f"agent_{i}")
        out.append(path)
    for i, critic in enumerate(run.critics):
        if critic.shared:
            save_value_head(critic.head, root / f"agent_{i}", kind=critic.kind)
        else:
            out.append(critic.save(root / (f"critic_{i}" if run.method == "iac" else "critic")))
    return out


def _critic_state(run: ActorCriticRun) -> dict[str, Any]:
    """The critics' part of ``training_state.pt``: weights and optimizer state (CPU tensors)."""
    return {
        "method": run.method,
        "kind": run.config.critic_type,
        "heads": [
            {k: v.detach().cpu() for k, v in c.head.state_dict().items()} for c in run.critics
        ],
        "trunks": [
            None if c.shared else {k: v.detach().cpu() for k, v in c.trunk.state_dict().items()}
            for c in run.critics
        ],
        "optimizers": [None if o is None else o.state_dict() for o in run.critic_optimizers],
    }


def checkpoint(
    run: ActorCriticRun,
    path: str | Path | None = None,
    *,
    recipe_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write the step checkpoint ``path`` (default ``output_dir/checkpoints/step-N``)
    atomically and return it. ``recipe_state``: a caller's own plain-value state, saved
    under :data:`~comlrl.algos.training.run.checkpoint.RECIPE_STATE` (``comlrl.trainers``' IAC/MAAC
    keep their epoch cursor there).

    The folder is :func:`comlrl.algos.training.run.checkpoint.write_checkpoint`'s (built under a
    temporary name, then renamed): ``agent_<i>/`` (Hugging Face weights) and
    ``training_state.pt`` holding the actors' optimizers (a shared-trunk head's moments
    are a parameter group there), the data stream, every random stream, the step and,
    under ``"critics"``, each critic's head and (separate critics) trunk weights and
    optimizer state. ``torch.load(..., weights_only=True)`` reads it. (The loop driver
    prunes to ``keep_last``.)

    Raises:
        ConfigError: the run is data parallel (actor-critic checkpoints are single-process).
    """
    base = run.base
    if base.world_size > 1 or base.syncs is not None:
        raise ConfigError(
            "actor-critic checkpoints are written by a single process; run without "
            "data_parallel to checkpoint an IAC/MAAC run."
        )
    state = ckpt.capture_state(
        step=base.step,
        optimizers=base.optimizers,
        data=base.data,
        rng=base.rng,
        generators=[getattr(a, "generator", None) for a in base.agents],
    )
    state["critics"] = _critic_state(run)
    if recipe_state is not None:
        state[ckpt.RECIPE_STATE] = dict(recipe_state)
    if path is None:
        path = ckpt.step_checkpoint_path(base.output_dir, base.step)
    return ckpt.write_checkpoint(path, base.agents, state)


def resume(run: ActorCriticRun, path: str | Path, *, state: Mapping[str, Any] | None = None) -> int:
    """Put ``run`` back at the step checkpoint ``path`` written by :func:`checkpoint`:
    actor weights and optimizers, critics (heads, separate trunks, their optimizers),
    data stream and random streams; cut ``metrics.jsonl``/``samples.jsonl``/``eval.jsonl``
    back to its step and return the step. :func:`train` then continues as if never stopped.
    ``state``: the checkpoint's ``training_state.pt`` when the caller has read it already.

    Raises:
        CheckpointError: the checkpoint is incomplete, was written by another recipe (no
            critic state), or does not fit the run (method, critic kind, number of critics,
            a shared/separate mismatch, other shapes).
    """
    base = run.base
    if state is None:
        state = ckpt.load_training_state(path)
    saved = state.get("critics")
    if saved is None:
        raise ckpt.CheckpointError(
            f"{str(path)!r} holds no critic state (a group-baseline checkpoint?); resume it "
            "with the recipe that wrote it."
        )
    if (saved["method"], saved["kind"]) != (run.method, run.config.critic_type):
        raise ckpt.CheckpointError(
            f"{str(path)!r} was written by {saved['method'].upper()} with critic_type="
            f"{saved['kind']!r}; this run is {run.method.upper()} with critic_type="
            f"{run.config.critic_type!r}."
        )
    if len(saved["heads"]) != len(run.critics):
        raise ckpt.CheckpointError(
            f"{str(path)!r} has {len(saved['heads'])} critics but this run has {len(run.critics)}."
        )
    for i, agent in enumerate(base.agents):
        ckpt.load_agent_weights(agent.model, Path(path) / f"agent_{i}")
    base.step = ckpt.restore_state(
        state,
        optimizers=base.optimizers,
        data=base.data,
        rng=base.rng,
        generators=[getattr(a, "generator", None) for a in base.agents],
    )
    for i, critic in enumerate(run.critics):
        trunk, opt_state = saved["trunks"][i], saved["optimizers"][i]
        if (trunk is None) != critic.shared or (opt_state is None) != (
            run.critic_optimizers[i] is None
        ):
            raise ckpt.CheckpointError(
                f"critic {i} is {'shared' if critic.shared else 'separate'} in this run but "
                f"was {'shared' if trunk is None else 'separate'} when saved; use the same "
                "critic_mode."
            )
        try:
            critic.head.load_state_dict(saved["heads"][i])
            if trunk is not None:
                critic.trunk.load_state_dict(trunk)
            optimizer = run.critic_optimizers[i]
            if optimizer is not None:
                optimizer.load_state_dict(opt_state)
        except (RuntimeError, ValueError) as exc:
            raise ckpt.CheckpointError(
                f"critic {i}'s saved state does not fit this run: {exc}"
            ) from None
    rewind_outputs(base.output_dir, base.step)
    return base.step


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
        hold_terminal=cfg.hold_terminal_reward,
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
    optimizer.zero_grad(set_to_none=True)  # no gradient outlives the step (as update_policy)
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


class _ActorCriticTrainer(MultiAgentTrainer):
    method: Method = "iac"
    uses_estimator = False

    def __init__(
        self,
        agents: Sequence[Any],
        config: ActorCriticConfig,
        *,
        critics: Sequence[Critic] | None = None,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        transition: Transition | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        environment: Environment | None = None,
    ) -> None:
        if not isinstance(config, ActorCriticConfig):
            raise ConfigError(
                f"{type(self).__name__} needs an ActorCriticConfig (it has the critic's "
                f"settings), got {type(config).__name__}; build one with the same fields but the "
                "group-baseline ones (estimator, advantage_scale, advantage_eps, "
                "advantage_stats, advantage_group, update_chunk_nodes, "
                "update_chunk_split_turns)."
            )
        # critic_devices must fit the agents' placement before setup moves any model
        critic_placement(config, self.method, planned_agent_devices(config, len(agents)))
        super().__init__(
            agents,
            config,
            task=task,
            dataset=dataset,
            formatters=formatters,
            reward_func=reward_func,
            transition=transition,
            eval_dataset=eval_dataset,
            environment=environment,
        )
        self.ac_run = attach(self.run, config, self.method, critics)

    @property
    def critics(self) -> list[Critic]:
        """The critics: one per agent (IAC) or one (MAAC)."""
        return self.ac_run.critics

    def train_step(self) -> dict[str, float]:
        """One step of :func:`comlrl.algos.recipes.actor_critic.recipe.train_step`."""
        return train_step(self.ac_run)

    def save(self, tag: str) -> list[Path]:
        """Agents, value heads and critics under ``output_dir/<tag>``
        (:func:`comlrl.algos.recipes.actor_critic.recipe.save`)."""
        return save(self.ac_run, tag)

    def evaluate(self) -> dict[str, float]:
        """One evaluation row of the agents (critics are not used)."""
        return evaluate(self.ac_run)

    def resume(self, checkpoint: str | Path) -> int:
        """Continue from a step checkpoint (:func:`comlrl.algos.recipes.actor_critic.recipe.resume`:
        actors, critics, optimizers, data and random streams); returns its step.

        Raises:
            CheckpointError: the checkpoint is incomplete or does not fit this run.
        """
        return resume(self.ac_run, checkpoint)

    def checkpoint(self) -> Path:
        """Write a resumable step checkpoint now
        (:func:`comlrl.algos.recipes.actor_critic.recipe.checkpoint`); returns its folder."""
        return checkpoint(self.ac_run)

    def train(self, *, overwrite: bool = False) -> list[dict[str, float]]:
        """Run :func:`comlrl.algos.recipes.actor_critic.recipe.train`; closes the task after.
        ``overwrite`` as in :meth:`MultiAgentTrainer.train`."""
        try:
            return train(self.ac_run, record=self.record, overwrite=overwrite)
        finally:
            if self.task is not None:
                self.task.close()


class IACTrainer(_ActorCriticTrainer):
    """Independent actor-critic: each agent has its own critic that sees only its own prompt
    (``critic_type="v"``) or prompt and completion (``"q"``): a separate model
    (``critic_mode="separate"``) or a value head on the agent's model (``"shared"``).
    Advantages are GAE (Schulman et al. 2016) per turn; the actor takes PPO-clipped
    policy-gradient steps (Schulman et al. 2017)."""

    method = "iac"
    algo = "iac"


class MAACTrainer(_ActorCriticTrainer):
    """Multi-agent actor-critic with one centralised critic that reads every agent's prompt
    (``"v"``) and the joint action (``"q"``) — centralised training, decentralised execution
    (Lowe et al. 2017, MADDPG; Foerster et al. 2018, COMA). Same advantages and updates as
    :class:`IACTrainer`, with every agent credited from the shared critic."""

    method = "maac"
    algo = "maac"


def run_iac(config: ActorCriticConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=iac``: :class:`~comlrl.algos.IACTrainer` (a critic per agent) on
    ``config.task``; raises as :func:`run_policy_gradient`."""
    from comlrl.algos.recipes.actor_critic.recipe import IACTrainer

    return run_policy_gradient(
        config, outputs, IACTrainer, f"IAC ({config.critic_mode} {config.critic_type}-critics)"
    )


def run_maac(config: ActorCriticConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=maac``: :class:`~comlrl.algos.MAACTrainer` (one centralised critic) on
    ``config.task``; raises as :func:`run_policy_gradient`."""
    from comlrl.algos.recipes.actor_critic.recipe import MAACTrainer

    return run_policy_gradient(
        config, outputs, MAACTrainer, f"MAAC (centralised {config.critic_type}-critic)"
    )
