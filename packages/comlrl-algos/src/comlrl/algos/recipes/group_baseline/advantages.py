"""Advantages of the group-baseline recipes (:func:`group_advantages`): each completion's
credited return (less its reference-KL penalty with ``kl_mode="reward"``, :func:`reward_kl`)
against its group, agent-wise or pooled, with the batch-wide std of data-parallel runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from comlrl.algos.models.ranks import gather_objects
from comlrl.algos.records import Rollout
from comlrl.algos.training.update.logprobs import trainer_logprobs
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.estimators.advantages import std_from_moments
from comlrl.estimators.agentwise import Stats, agent_return_moments, agentwise_advantages
from comlrl.estimators.joint import credit_completions
from comlrl.estimators.kl_reward import sequence_kl
from comlrl.estimators.registry import resolve_estimator

__all__ = ["group_advantages", "reward_kl"]


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


def reward_kl(
    models: Sequence[Any],
    ref_models: Sequence[Any],
    ro: Rollout,
    settings: UpdateSettings,
    estimator: Literal["k1", "k2", "k3"],
) -> list[list[torch.Tensor]]:
    """Per turn ``t``, per agent, ``[N_t * G]`` float32: each completion's summed
    per-token KL estimate to its agent's reference model
    (:func:`comlrl.estimators.kl_reward.sequence_kl` with ``estimator``), from the trainer's
    log-probs before the update at the update's temperature (``settings``,
    :func:`~comlrl.algos.training.update.logprobs.trainer_logprobs`); ``kl_mode="reward"``
    subtracts ``kl_coef`` times it from the return. ``models[a]`` and ``ref_models[a]``
    are agent ``a``'s policy and reference model.
    """
    out = []
    for turn in ro.turns:
        per_agent = []
        for a, samples in enumerate(turn.agents):
            logp = trainer_logprobs(models[a], samples.batch, settings)
            ref = trainer_logprobs(ref_models[a], samples.batch, settings)
            mask = samples.batch.completion_mask.to(logp.device)
            kl = sequence_kl(logp, ref.to(logp.device), mask, estimator)
            per_agent.append(kl.cpu())
        out.append(per_agent)
    return out
