"""Building an actor-critic run: the critics (loaded, or a value head on each actor's
trunk), placed and given optimizers, on top of the group-baseline recipe's run
(:func:`setup`, :func:`attach`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from comlrl.algos.models.devices import model_device
from comlrl.algos.models.value import Critic, ValueHead, hidden_size_of
from comlrl.algos.recipes.actor_critic.config import (
    ActorCriticConfig,
    Method,
    critic_placement,
    planned_agent_devices,
)
from comlrl.algos.recipes.actor_critic.state import ActorCriticRun
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline.recipe import GroupBaselineRun
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.training.agents import build_optimizer
from comlrl.algos.training.config import ConfigError
from comlrl.algos.training.shared_models import sharing_groups
from comlrl.algos.training.update import UpdateSettings

__all__ = [
    "actor_update_settings",
    "attach",
    "setup",
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
