"""Advantages of the group-baseline recipes (:func:`group_advantages`): each completion's
credited return against its group of ``G`` siblings, with the batch-wide std of data-parallel
runs."""

from __future__ import annotations

import torch
from comlrl.algos.models.ranks import (
    gather_objects,
)
from comlrl.algos.records import Rollout
from comlrl.estimators.advantages import compute_advantages, return_moments, std_from_moments
from comlrl.estimators.joint import credit_completions
from comlrl.estimators.registry import resolve_estimator

__all__ = ["group_advantages"]


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
