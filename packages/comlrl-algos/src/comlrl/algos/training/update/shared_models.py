"""Agents that share one model object: one optimizer step on the sum of their losses.

Several agents may be given the same model object (one policy playing every role, each
role with its own prompts). Stepping it once per agent would take two optimizer steps
per training step with two sets of Adam moments, the second on weights the first already
moved, with no importance ratio for that (issue 20, finding 6). Instead the first agent of
each sharing group (:func:`sharing_groups`) steps once, with its own optimizer, on
``L_0 + L_1 + ...`` where each ``L_m`` is reduced over agent ``m``'s completions as if it
were alone (:func:`~comlrl.algos.training.update.policy.update_policy`'s ``terms``); the others'
optimizers are never stepped. Every recipe that updates policies from a rollout goes
through :func:`update_sharers` (group baseline, IAC, MAAC), and critics that share a trunk
group the same way (:func:`~comlrl.algos.recipes.actor_critic.critic_updates.update_critics`).

Agents that are LoRA adapters of one base (``lora.shared_base``, ``lora.batch_agents``) are
another kind of group (:func:`adapter_groups`): each keeps its own adapter and optimizer,
and :func:`update_adapter_group` updates them in one forward and backward per micro-batch
(:func:`~comlrl.algos.training.update.policy.update_adapters`).

Named axes: ``A`` agents, ``T`` turns of the rollout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from comlrl.algos.records import Rollout
from comlrl.algos.training.update.metric_sums import split_terms
from comlrl.algos.training.update.policy import update_adapters, update_policy
from comlrl.algos.training.update.settings import UpdateSettings

if TYPE_CHECKING:
    from comlrl.algos.models.gradient_sync import GradientSync

__all__ = ["adapter_groups", "sharing_groups", "update_adapter_group", "update_sharers"]


def sharing_groups(objects: Sequence[object]) -> list[list[int]]:
    """Indices of ``objects`` grouped by identity (``is``, not ``==``), each group in index
    order and the groups in order of their first index: ``[m, m, n] -> [[0, 1], [2]]``.

    The first index of a group is its *leader*: the one whose optimizer steps for all of
    them. Used on the agents' models and on the critics' trunks.
    """
    groups: dict[int, list[int]] = {}
    for i, obj in enumerate(objects):
        groups.setdefault(id(obj), []).append(i)
    return list(groups.values())


def update_sharers(
    model: Any,
    optimizer: torch.optim.Optimizer,
    ro: Rollout,
    advantages: Sequence[Sequence[torch.Tensor]],
    members: Sequence[int],
    settings: UpdateSettings,
    *,
    ref_model: Any | None = None,
    sync: GradientSync | None = None,
    extra_loss: Callable[[], Mapping[str, float]] | None = None,
    extra_params: Sequence[torch.nn.Parameter] = (),
) -> dict[int, dict[str, float]]:
    """One :func:`~comlrl.algos.training.update.policy.update_policy` call for every agent in
    ``members`` (agents on the one ``model``): their batches of every turn, agent-major,
    each agent's loss a term of its own, so the step follows the gradient of the sum of
    their losses; a single member is the plain update.

    Args:
        model: the members' one model object.
        optimizer: the leader's optimizer (``members[0]``); no other is stepped.
        ro: the step's rollout.
        advantages: per turn ``t``, per agent ``a``, ``[N_t * G]`` float advantages.
        members: the agents on ``model`` (a group of :func:`sharing_groups`).
        settings, ref_model, sync, extra_loss, extra_params: as for ``update_policy``. An
            ``extra_loss`` that reports a member's own metric names it ``term_<m>/<name>``.

    Returns:
        Per member its metrics (:func:`~comlrl.algos.training.update.metric_sums.split_terms`): the
        step's ``loss`` (the summed loss), ``grad_norm`` and an ``extra_loss``'s shared
        metrics, and its own completions' KL, clip fraction and ratio per turn.

    Raises:
        ValueError: no members, or as ``update_policy`` does.
    """
    if not members:
        raise ValueError("update_sharers needs at least one member (an agent index)")
    turns = range(len(ro.turns))
    stats = update_policy(
        model,
        optimizer,
        [b for m in members for b in ro.agent_batches(m)],
        [advantages[t][m] for m in members for t in turns],
        settings,
        ref_model=ref_model,
        sync=sync,
        terms=[m for m in members for _ in turns] if len(members) > 1 else None,
        turns=[t for _ in members for t in turns],
        extra_loss=extra_loss,
        extra_params=extra_params,
    )
    return split_terms(stats, members)


def adapter_groups(models: Sequence[Any]) -> list[list[int]]:
    """Indices of the agents whose models are LoRA adapters of one base that batches its
    agents (``lora.batch_agents``), two or more per group, in index order; the groups in
    order of their first index (the group's *leader*, which runs the update)."""
    groups: dict[int, list[int]] = {}
    for i, model in enumerate(models):
        shared = getattr(model, "shared", None)
        if getattr(type(model), "is_lora_policy", False) and getattr(shared, "batched", False):
            groups.setdefault(id(shared), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def update_adapter_group(
    models: Sequence[Any],
    optimizers: Sequence[torch.optim.Optimizer],
    ro: Rollout,
    advantages: Sequence[Sequence[torch.Tensor]],
    members: Sequence[int],
    settings: UpdateSettings,
    *,
    ref_models: Sequence[Any | None] | None = None,
) -> dict[int, dict[str, float]]:
    """The update of the agents ``members`` (a group of :func:`adapter_groups`) on their
    completions of every turn, in one forward and backward per micro-batch; each agent's
    own optimizer steps on its own loss.

    Args:
        models, optimizers: every agent's model and optimizer (indexed by agent).
        ro: the step's rollout.
        advantages: per turn ``t``, per agent, ``[N_t * G]`` float advantages.
        members: the agents of the group.
        settings: as for :func:`~comlrl.algos.training.update.policy.update_policy`.
        ref_models: every agent's KL reference (indexed by agent), or ``None``.

    Returns:
        Per member its metrics, as :func:`update_sharers` returns them for one agent.
    """
    turns = range(len(ro.turns))
    stats = update_adapters(
        [models[m] for m in members],
        [optimizers[m] for m in members],
        [ro.agent_batches(m) for m in members],
        [[advantages[t][m] for t in turns] for m in members],
        settings,
        ref_models=[ref_models[m] for m in members] if ref_models is not None else None,
        turns=list(turns),
    )
    return dict(zip(members, stats, strict=True))
