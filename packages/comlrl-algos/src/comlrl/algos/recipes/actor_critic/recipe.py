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
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from comlrl.algos.functional.gae import q_advantages, tree_gae, value_loss
from comlrl.algos.functional.joint import credit_completions
from comlrl.algos.models.devices import model_device
from comlrl.algos.models.value import Critic, ValueHead, hidden_size_of, save_value_head
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline.recipe import GroupBaselineRun
from comlrl.algos.records import Rollout, TurnRollout
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.rollout.tree import rollout
from comlrl.algos.training import checkpoint as ckpt
from comlrl.algos.training.config import ConfigError, TrainConfig
from comlrl.algos.training.loop import RecipeLoop, StepResult, rewind_outputs, run_loop
from comlrl.algos.training.steps import build_optimizer, rollout_metrics, save_agent_checkpoint
from comlrl.algos.training.update import UpdateSettings, update_policy
from pydantic import Field, model_validator

__all__ = [
    "ActorCriticConfig",
    "ActorCriticRun",
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

Method = Literal["iac", "maac"]


class ActorCriticConfig(TrainConfig):
    """:class:`~comlrl.algos.training.config.TrainConfig` plus the critic's settings (IAC, MAAC).

    ``learning_rate`` is the actors'; ``clip_ratio`` is the actors' PPO clip against the
    behaviour log-probs (needed for ``num_iterations > 1``). ``num_generations`` defaults
    to 1 (one trajectory per prompt, CoMLRL 1.4.3's setting); any ``G`` works.
    ``estimator``, ``advantage_scale`` and ``advantage_eps`` are not used: the critic is
    the baseline.
    """

    num_generations: int = Field(1, ge=1, description="G, completions per prompt per agent.")
    estimator: str = Field("reinforce", description="Not used by actor-critic recipes.")
    clip_ratio: float | None = Field(
        0.2, gt=0, description="Actor PPO clip epsilon; None = no clip."
    )
    critic_learning_rate: float | None = Field(
        None, gt=0, description="Critic learning rate per optimizer step; None = learning_rate."
    )
    value_loss_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    value_clip_range: float | None = Field(
        None,
        gt=0,
        description="Clip new values to within this of the sampling-time values "
        "(reward units); None = no clipping.",
    )
    gae_lambda: float = Field(
        1.0,
        ge=0,
        le=1,
        description="GAE lambda: 1 = Monte Carlo returns minus the value, 0 = one-step TD error.",
    )
    critic_type: Literal["v", "q"] = Field(
        "v",
        description="v: V(prompt) read at the last prompt token; q: Q(prompt, "
        "completion) read at the last response token.",
    )
    critic_mode: Literal["separate", "shared"] = Field(
        "separate",
        description="IAC: a separate critic model per agent, or a value head on "
        "the actor's own model (shared trunk). MAAC's centralised critic is always separate.",
    )
    critic_model: str | None = Field(
        None,
        description="Model (HF id, path or built-in name) of separate critics; None = "
        "the agent's own model (MAAC: agent 0's).",
    )
    value_head_hidden_dim: int | None = Field(
        None, ge=1, description="Hidden layer width of the value head; None = linear head."
    )
    advantage_normalization: bool = Field(
        True,
        description="Whiten each agent's advantages over the step (mean 0, std 1; "
        "skipped with a single advantage).",
    )
    critic_max_length: int | None = Field(
        None, ge=1, description="Cut critic inputs to their last N tokens; None = no cut."
    )
    critic_devices: list[str] | None = Field(
        None,
        description="Where the critics live: IAC one device per agent (critic i on device "
        "i), MAAC one device for the centralised critic. None: each critic beside its agent "
        "(MAAC: beside agent 0). A value head on the actor's trunk (critic_mode='shared') "
        "lives with its actor, so there it may only repeat the agents' devices.",
    )

    @model_validator(mode="after")
    def _ac_consistent(self) -> ActorCriticConfig:
        if self.critic_mode == "shared" and self.critic_model is not None:
            raise ValueError(
                f"critic_model={self.critic_model!r} names a separate critic but "
                "critic_mode='shared' puts the value head on the actor; drop one of them."
            )
        if self.critic_devices is not None:
            from comlrl.algos.models.devices import validate_devices

            count = len(self.critic_devices)
            if count not in (1, self.num_agents):
                raise ValueError(
                    f"critic_devices lists {count} devices for num_agents={self.num_agents}; "
                    f"give one per agent for IAC (e.g. {[f'cuda:{i}' for i in range(self.num_agents)]})"
                    " or one for MAAC's centralised critic (e.g. ['cuda:0'])."
                )
            validate_devices(self.critic_devices, count, "critic_devices")
            if self.critic_mode == "shared":
                agents = self.agent_devices or (
                    [self.device] * self.num_agents if self.device != "auto" else None
                )
                if agents is not None and count == self.num_agents:
                    for i, (c, a) in enumerate(zip(self.critic_devices, agents, strict=True)):
                        if _same_device(c, a):
                            continue
                        raise ValueError(
                            f"critic_devices[{i}]={c!r} but agent {i} lives on {a!r}, and "
                            "critic_mode='shared' puts its value head on that agent's own "
                            "model; drop critic_devices or use critic_mode='separate'."
                        )
        if self.critic_mode == "shared" and self.kl_coef > 0:
            raise ValueError(
                "critic_mode='shared' does not support kl_coef > 0 yet; use "
                "critic_mode='separate' or kl_coef=0."
            )
        return self

    @property
    def critic_lr(self) -> float:
        """The critic's learning rate (``critic_learning_rate`` or ``learning_rate``)."""
        return (
            self.critic_learning_rate
            if self.critic_learning_rate is not None
            else self.learning_rate
        )


def _same_device(a: str, b: str) -> bool:
    """Whether two device names name one device (``cuda`` is ``cuda:0``)."""
    x, y = torch.device(a.strip()), torch.device(b.strip())
    return x.type == y.type and (x.index or 0) == (y.index or 0)


def planned_agent_devices(config: TrainConfig, num_agents: int) -> list[torch.device]:
    """Where setup will place each agent (``agent_devices``, else ``device``), without
    moving anything, so critic placement can be checked before any model moves.

    Raises:
        ConfigError: ``agent_devices`` that do not fit (see
            :func:`comlrl.algos.models.devices.validate_devices`).
    """
    from comlrl.algos.models.devices import agent_placement
    from comlrl.algos.training.steps import resolve_device

    try:
        return agent_placement(num_agents, config.agent_devices, resolve_device(config.device))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def critic_placement(
    config: ActorCriticConfig, method: Method, agent_devices: Sequence[torch.device]
) -> list[torch.device]:
    """The device of each critic: IAC critic ``i`` on ``critic_devices[i]`` (default: agent
    ``i``'s device), MAAC's one critic on ``critic_devices[0]`` (default: agent 0's). Moves
    nothing; call it before any model is placed.

    Args:
        config: the run's config (``critic_devices``, ``critic_mode``).
        method: ``"iac"`` or ``"maac"``.
        agent_devices: ``A`` devices, where each agent is (or will be) placed.

    Raises:
        ConfigError: ``critic_devices`` does not list one device per critic (``A`` for
            IAC, 1 for MAAC), names a device this machine lacks, or puts a value head on
            a trunk shared with its actor (``critic_mode="shared"``) anywhere but on that
            actor's device.
    """
    from comlrl.algos.models.devices import validate_devices

    count = len(agent_devices) if method == "iac" else 1
    names = config.critic_devices
    if names is None:
        return list(agent_devices[:count])
    if len(names) != count:
        raise ConfigError(
            f"{method.upper()} has {count} critic{'s' if count != 1 else ''} but "
            f"critic_devices={names!r}; "
            + (
                "give one device per agent (critic i beside or apart from agent i)."
                if method == "iac"
                else "give one device for the centralised critic, e.g. ['cuda:0']."
            )
        )
    try:
        devices = validate_devices(names, count, "critic_devices")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if method == "iac" and config.critic_mode == "shared":
        for i, (c, a) in enumerate(zip(devices, agent_devices, strict=True)):
            if not _same_device(str(c), str(a)):
                raise ConfigError(
                    f"critic_devices[{i}]={names[i]!r} but agent {i} is on {str(a)!r}, and "
                    "critic_mode='shared' puts its value head on that agent's own model; drop "
                    "critic_devices or use critic_mode='separate'."
                )
    return devices


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


def joint_prompt(prompts: Sequence[str], completions: Sequence[str] | None = None) -> str:
    """The centralised critic's text: every agent's prompt and, for ``Q``, its completion.

    ``Agent 1 prompt: ...`` lines for every agent, then (with ``completions``)
    ``Agent 1 response: ...`` lines; the value is read at the text's last token.
    """
    lines = [f"Agent {a + 1} prompt: {p}" for a, p in enumerate(prompts)]
    if completions is not None:
        lines += [f"Agent {a + 1} response: {c}" for a, c in enumerate(completions)]
    return "\n".join(lines)


def critic_inputs(turn: TurnRollout, method: Method, kind: str, critic: int) -> list[str]:
    """The texts critic ``critic`` reads at one turn, in the order of its values.

    - IAC, ``v``: agent ``critic``'s ``N_t`` prompts;
    - IAC, ``q``: its ``N_t * G`` prompt+completion texts, node-major;
    - MAAC, ``v``: ``N_t`` :func:`joint_prompt` texts;
    - MAAC, ``q``: ``N_t * K`` joint prompt + joint action texts, node-major.
    """
    if method == "iac":
        samples = turn.agents[critic]
        if kind == "v":
            return list(samples.prompts)
        return [
            p + c.text
            for p, group in zip(samples.prompts, samples.completions, strict=True)
            for c in group
        ]
    num_agents = len(turn.agents)
    if kind == "v":
        return [joint_prompt([s.prompts[n] for s in turn.agents]) for n in range(turn.num_nodes)]
    rows = turn.joint_index.tolist()
    return [
        joint_prompt(
            [s.prompts[n] for s in turn.agents],
            [turn.agents[a].completions[n][row[a]].text for a in range(num_agents)],
        )
        for n in range(turn.num_nodes)
        for row in rows
    ]


def _as_joint(
    values: torch.Tensor, turn: TurnRollout, method: Method, kind: str, critic: int
) -> torch.Tensor:
    """A critic's values at one turn as ``[N_t, K]``, one per joint action."""
    n, k = turn.rewards.shape
    if kind == "v":
        return values.view(n, 1).expand(n, k)
    if method == "maac":
        return values.view(n, k)
    g = turn.agents[critic].batch.group_size
    return values.view(n, g)[:, turn.joint_index[:, critic].to(values.device)]


@torch.no_grad()
def rollout_values(
    ro: Rollout, critics: Sequence[Critic], method: Method, *, micro_batch_size: int | None = None
) -> list[list[torch.Tensor]]:
    """Sampling-time values: per critic ``c``, per turn ``t``, the flat ``[M_t]`` float32
    values of :func:`critic_inputs` (on CPU)."""
    return [
        [
            critic.values(
                critic_inputs(turn, method, critic.kind, c), micro_batch_size=micro_batch_size
            )
            .float()
            .cpu()
            for turn in ro.turns
        ]
        for c, critic in enumerate(critics)
    ]


def critic_advantages(
    ro: Rollout,
    values: Sequence[Sequence[torch.Tensor]],
    method: Method,
    kind: str,
    *,
    gamma: float,
    lam: float,
    normalize: bool,
    eps: float = 1e-8,
) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """Per-completion advantages for the actors and regression targets for the critics.

    Args:
        ro: the step's rollout.
        values: :func:`rollout_values`' output.
        method: ``"iac"`` (critic ``a`` for agent ``a``) or ``"maac"`` (one critic).
        kind: ``"v"`` or ``"q"``.
        gamma: discount; lam: GAE lambda (:func:`~comlrl.algos.functional.gae.tree_gae`).
        normalize: whiten each agent's advantages over all turns of the step
            (population std + ``eps``; skipped with fewer than 2).

    With a ``v`` critic the advantages are :func:`~comlrl.algos.functional.gae.tree_gae`'s GAE; with
    a ``q`` critic they are :func:`~comlrl.algos.functional.gae.q_advantages` (the lambda-return
    minus the mean Q of the node's joint actions; ``K = 1``: the lambda-return, and the
    whitening's batch mean is the baseline).

    Returns:
        ``(advantages, targets)``: ``advantages[t][a]`` is ``[N_t * G]`` float32 (rows
        of agent ``a``'s batch); ``targets[c][t]`` is critic ``c``'s ``[M_t, J]`` targets
        for its ``M_t`` values, ``J = K`` for ``v`` (a node's value is regressed on the
        lambda-return of each of its joint actions) and ``J = 1`` for ``q``.
    """
    num_agents = ro.num_agents
    turns = ro.turns
    joint = [
        [_as_joint(values[c][t], turn, method, kind, c) for t, turn in enumerate(turns)]
        for c in range(len(values))
    ]
    adv_out: list[list[torch.Tensor]] = [[torch.empty(0)] * num_agents for _ in turns]
    targets_out: list[list[torch.Tensor]] = []
    for c in range(len(values)):
        advs, targets = tree_gae(
            [t.rewards for t in turns],
            joint[c],
            [t.child for t in turns],
            [t.terminal for t in turns],
            gamma,
            lam,
        )
        per_turn = []
        for t, turn in enumerate(turns):
            g = turn.agents[0].batch.group_size
            # Q: the lambda-return minus an action-independent baseline (q_advantages);
            # G - Q(s, a) would cancel the policy gradient once the critic fits.
            actor_adv = q_advantages(targets[t], joint[c][t]) if kind == "q" else advs[t]
            credited = credit_completions(actor_adv, turn.joint_index, g)  # [A, N_t, G]
            agents = range(num_agents) if method == "maac" else [c]
            for a in agents:
                adv_out[t][a] = credited[a].reshape(-1).float()
            if kind == "v":
                per_turn.append(targets[t].float())
            elif method == "maac":
                per_turn.append(targets[t].reshape(-1, 1).float())
            else:
                per_turn.append(
                    credit_completions(targets[t], turn.joint_index, g)[c].reshape(-1, 1).float()
                )
        targets_out.append(per_turn)
    if normalize:
        for a in range(num_agents):
            flat = torch.cat([adv_out[t][a] for t in range(len(turns))])
            if flat.numel() > 1:
                mean, std = flat.mean(), flat.std(unbiased=False)
                for t in range(len(turns)):
                    adv_out[t][a] = (adv_out[t][a] - mean) / (std + eps)
    return adv_out, targets_out


def _value_chunks(
    critic: Critic,
    texts: Sequence[str],
    old_values: torch.Tensor,
    targets: torch.Tensor,
    clip_range: float | None,
    micro_batch_size: int | None,
    scale: float,
) -> dict[str, float]:
    """Backward ``scale * value_loss`` over ``texts`` in micro-batches; returns metrics."""
    m = len(texts)
    per = micro_batch_size or m
    sums: dict[str, float] = {}
    for i in range(0, m, per):
        j = min(i + per, m)
        v = critic.values(texts[i:j])
        tgt = targets[i:j].to(v.device)
        loss, metrics = value_loss(
            v.unsqueeze(1).expand_as(tgt),
            tgt,
            old_values=old_values[i:j].to(v.device).unsqueeze(1).expand_as(tgt),
            clip_range=clip_range,
        )
        (loss * (scale * (j - i) / m)).backward()
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value * (j - i) / m
    return sums


def update_critic(
    critic: Critic,
    optimizer: torch.optim.Optimizer,
    texts: Sequence[str],
    old_values: torch.Tensor,
    targets: torch.Tensor,
    *,
    coef: float = 1.0,
    clip_range: float | None = None,
    num_iterations: int = 1,
    max_grad_norm: float | None = 1.0,
    micro_batch_size: int | None = None,
) -> dict[str, float]:
    """Take ``num_iterations`` optimizer steps on ``coef *``
    :func:`~comlrl.algos.functional.gae.value_loss` of a separate critic.

    Args:
        critic: the critic (trunk and head are trained).
        optimizer: its optimizer.
        texts: ``M`` critic inputs (:func:`critic_inputs`, all turns concatenated).
        old_values: ``[M]`` sampling-time values.
        targets: ``[M, J]`` targets; value ``m`` is compared with each of its ``J``.
        coef: value-loss weight; clip_range: value clip (reward units) or None.
        num_iterations: optimizer steps on this batch.
        max_grad_norm: clip the critic's gradient norm; None = no clipping.
        micro_batch_size: texts per forward/backward; None = all at once.

    Returns:
        metrics averaged over the steps: ``value_loss``, ``value_mean``, ``target_mean``,
        ``value_clip_fraction``, ``explained_variance`` and ``critic_grad_norm``.

    Raises:
        ValueError: ``old_values`` or ``targets`` do not have ``M`` rows.
    """
    m = len(texts)
    if old_values.shape != (m,) or targets.dim() != 2 or targets.shape[0] != m:
        raise ValueError(
            f"{m} texts but old_values {list(old_values.shape)} and targets "
            f"{list(targets.shape)}; need [M] and [M, J]"
        )
    totals: dict[str, float] = {}
    for _ in range(num_iterations):
        optimizer.zero_grad(set_to_none=True)
        stats = _value_chunks(
            critic, texts, old_values, targets, clip_range, micro_batch_size, coef
        )
        if max_grad_norm is not None:
            stats["critic_grad_norm"] = float(
                torch.nn.utils.clip_grad_norm_(list(critic.parameters()), max_grad_norm)
            )
        optimizer.step()
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value / num_iterations
    return totals


def update_shared(
    model: Any,
    critic: Critic,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[Any],
    advantages: Sequence[torch.Tensor],
    settings: UpdateSettings,
    texts: Sequence[str],
    old_values: torch.Tensor,
    targets: torch.Tensor,
    *,
    coef: float,
    clip_range: float | None,
) -> dict[str, float]:
    """Actor and value head on one trunk: ``policy_loss + coef * value_loss``, one backward
    and one optimizer step per iteration (the optimizer holds the model's parameters and
    the head's, each group with its own learning rate).

    One code path with the actors' update: :func:`~comlrl.algos.training.update.update_policy`
    (micro-batches, loss weighting, fused log-probs, clipping) with the value loss as its
    ``extra_loss`` and the head as ``extra_params`` (no reference KL here). Returns
    ``update_policy``'s metrics (``loss`` is the policy's) and :func:`update_critic`'s
    value metrics.
    """
    return update_policy(
        model,
        optimizer,
        batches,
        advantages,
        settings,
        extra_loss=lambda: _value_chunks(
            critic, texts, old_values, targets, clip_range, settings.micro_batch_size, coef
        ),
        extra_params=list(critic.head.parameters()),
    )


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
    with ``config.critic_lr``; a shared head joins its actor's optimizer as a parameter
    group with that learning rate. With ``G = 1`` the actors' update runs each prompt and
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
    optimizers: list[torch.optim.Optimizer | None] = []
    for i, critic in enumerate(critics):
        device = devices[i]
        if critic.shared:
            critic.head.to(device)
            base.optimizers[i].add_param_group(
                {"params": list(critic.head.parameters()), "lr": config.critic_lr}
            )
            optimizers.append(None)
        else:
            critic.trunk.to(device)
            critic.head.to(device)
            critic.trunk.train()
            optimizers.append(
                build_optimizer(
                    list(critic.parameters()),
                    config.optimizer,
                    lr=config.critic_lr,
                    weight_decay=config.weight_decay,
                )
            )
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
    )
    old = [torch.cat(v) for v in values]
    tgt = [torch.cat(t) for t in targets]
    t2 = time.perf_counter()

    def update_actor(a: int) -> dict[str, float]:
        batches = ro.agent_batches(a)
        per_turn = [per_agent[a] for per_agent in adv]
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
            )
        stats = update_policy(
            base.agents[a].model,
            base.optimizers[a],
            batches,
            per_turn,
            base.update,
            ref_model=base.ref_models[a] if base.ref_models is not None else None,
        )
        if run.method == "iac":
            stats.update(_critic_step(run, a, texts[a], old[a], tgt[a], live))
        return stats

    stats = base.update_pool.map(update_actor)
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


def checkpoint(run: ActorCriticRun, path: str | Path | None = None) -> Path:
    """Write the step checkpoint ``path`` (default ``output_dir/checkpoints/step-N``)
    atomically and return it.

    The folder is :func:`comlrl.algos.training.checkpoint.write_checkpoint`'s (built under a
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
    if path is None:
        path = ckpt.step_checkpoint_path(base.output_dir, base.step)
    return ckpt.write_checkpoint(path, base.agents, state)


def resume(run: ActorCriticRun, path: str | Path) -> int:
    """Put ``run`` back at the step checkpoint ``path`` written by :func:`checkpoint`:
    actor weights and optimizers, critics (heads, separate trunks, their optimizers),
    data stream and random streams; cut ``metrics.jsonl``/``samples.jsonl``/``eval.jsonl``
    back to its step and return the step. :func:`train` then continues as if never stopped.

    Raises:
        CheckpointError: the checkpoint is incomplete, was written by another recipe (no
            critic state), or does not fit the run (method, critic kind, number of critics,
            a shared/separate mismatch, other shapes).
    """
    base = run.base
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
