"""An update schedule in chunks of rollout-tree nodes (CoMLRL 1.4.3's ``rollout_buffer_size``).

By default a step's rollout takes one optimizer step per agent on every completion of
every turn (:func:`~comlrl.algos.training.update.policy.update_policy`). With
``update_chunk_nodes = R`` (a :class:`~comlrl.algos.training.config.rl.TrainConfig` field) the
step instead walks its trees' nodes in the order CoMLRL 1.4.3 buffers them (environment-step
order: each example's tree in pre-order, a node before the subtrees of its joint actions,
those in joint-action order), cuts that sequence into consecutive chunks of ``R`` nodes (the
last may be shorter: it is updated at the end of the step, where 1.4.3 carries it into the
next example's buffer) and takes one optimizer step per chunk, in chunk order; with
``update_chunk_split_turns`` one per turn present in a chunk (1.4.3 updates each turn's nodes
of a full buffer apart). A single chunk (``R`` at least the step's node count, no split)
is exactly the default update.

Later steps update completions that were sampled before earlier optimizer steps on the same
model, so they are off-policy by then: every step after the first uses the importance
ratio ``r = exp(logp - behaviour_logp)`` of
:func:`~comlrl.estimators.losses.policy_loss` in the PPO clipped surrogate
(``clip_ratio``, required: an unclipped ``-r * A`` has no bound, and ratios of 4.9 at the
defaults and 353 with Adam at 3e-2 were measured), never the on-policy surrogate that would
drop it (1.4.3 drops it).

Before the first optimizer step, one forward pass without gradient takes the trainer's
log-probs of the later chunks' completions (:func:`~comlrl.algos.training.update.logprobs.trainer_logprobs`):
the step's *old* log-probs, those of the weights that sampled. They are what the
sampler/trainer mismatch metrics (``mismatch_abs_logp_diff``, ``mismatch_kl``) compare with
the behaviour log-probs, so those measure the sampler's gap and not the drift of the earlier
chunks' steps. With truncated importance sampling (``UpdateSettings.tis_level``) the split is
verl's: the truncated weight ``min(pi_old / pi_behaviour, C)`` carries the sampler-to-trainer
gap, and the PPO ratio ``pi / pi_old`` of every chunk is clipped (the earlier chunks' steps
move it, so the clip engages). With a retempered update
(``UpdateSettings.sampling_temperature``) the ratio is ``pi / pi_old`` at the update's
temperature.
Advantages are those of the whole step (a group is the ``G`` completions of one node, so
chunking does not change them).

Named axes: ``N_t`` nodes at turn ``t``, ``G`` completions per node, ``R`` nodes per chunk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from comlrl.algos.records import PolicyBatch, Rollout
from comlrl.algos.training.update.logprobs import trainer_logprobs
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings

if TYPE_CHECKING:
    from comlrl.algos.models.gradient_sync import GradientSync

__all__ = ["preorder_nodes", "chunk_update_plan", "select_nodes", "update_in_node_chunks"]

#: one optimizer step of a plan: per turn it touches, the turn and its node indices there
PlanStep = list[tuple[int, list[int]]]


def preorder_nodes(ro: Rollout) -> list[tuple[int, int]]:
    """``(turn, node)`` of every node of ``ro``'s trees in 1.4.3's environment-step order:
    turn-0 nodes (one per example) in example order, each followed by the subtree of each
    of its joint actions' children in joint-action order (tree pre-order).

    Raises:
        ValueError: a ``child`` index that reaches a node twice or misses one (a malformed
            rollout).
    """
    children = [turn.child.tolist() for turn in ro.turns]
    order: list[tuple[int, int]] = []
    stack = [(0, n) for n in reversed(range(ro.turns[0].num_nodes))] if ro.turns else []
    while stack:
        t, n = stack.pop()
        order.append((t, n))
        if t + 1 < len(ro.turns):
            stack.extend((t + 1, c) for c in reversed(children[t][n]) if c >= 0)
    expected = sum(turn.num_nodes for turn in ro.turns)
    if len(order) != expected or len(set(order)) != expected:
        raise ValueError(
            f"the rollout's child links reach {len(set(order))} distinct nodes "
            f"({len(order)} visits) of its {expected}; each node must be one joint action's child"
        )
    return order


def chunk_update_plan(ro: Rollout, chunk_nodes: int, split_turns: bool = False) -> list[PlanStep]:
    """The optimizer steps of one agent: :func:`preorder_nodes` cut into consecutive chunks
    of ``chunk_nodes`` nodes, each chunk one step (``split_turns``: one step per turn it
    holds, in turn order, as 1.4.3 updates a full buffer); a step lists ``(turn, nodes)``
    per turn, in turn order, with the nodes in pre-order.

    Raises:
        ValueError: ``chunk_nodes < 1``.
    """
    if chunk_nodes < 1:
        raise ValueError(f"chunk_nodes must be >= 1, got {chunk_nodes!r}")
    order = preorder_nodes(ro)
    plan: list[PlanStep] = []
    for start in range(0, len(order), chunk_nodes):
        by_turn: dict[int, list[int]] = {}
        for t, n in order[start : start + chunk_nodes]:
            by_turn.setdefault(t, []).append(n)
        step = [(t, by_turn[t]) for t in sorted(by_turn)]
        plan.extend([[part] for part in step] if split_turns else [step])
    return plan


def select_nodes(batch: PolicyBatch, nodes: Sequence[int]) -> PolicyBatch:
    """The rows of ``nodes`` (each a group of ``G`` rows, node-major) of ``batch``, in the
    given order: a :class:`PolicyBatch` of ``len(nodes) * G`` rows, each tensor keeping
    its dtype and trailing shape (``input_ids`` / ``attention_mask`` ``[len(nodes) * G,
    S + L]`` int64, ``completion_mask`` ``[len(nodes) * G, L]`` bool,
    ``behaviour_logprobs`` ``[len(nodes) * G, L]`` float32).

    Raises:
        IndexError: a node outside ``[0, batch.num_prompts)``.
    """
    bad = [n for n in nodes if not 0 <= n < batch.num_prompts]
    if bad:
        raise IndexError(
            f"select_nodes: nodes {bad} are outside the batch's {batch.num_prompts} nodes "
            f"(0 to {batch.num_prompts - 1}); pass node indices of this turn"
        )
    g = batch.group_size
    rows = torch.tensor([n * g + j for n in nodes for j in range(g)], dtype=torch.long)
    rows = rows.to(batch.input_ids.device)
    return PolicyBatch(
        batch.input_ids.index_select(0, rows),
        batch.attention_mask.index_select(0, rows),
        batch.completion_mask.index_select(0, rows),
        batch.behaviour_logprobs.index_select(0, rows.to(batch.behaviour_logprobs.device)),
        g,
    )


def update_in_node_chunks(
    model: Any,
    optimizer: torch.optim.Optimizer,
    ro: Rollout,
    advantages: Sequence[Sequence[torch.Tensor]],
    members: Sequence[int],
    settings: UpdateSettings,
    chunk_nodes: int,
    *,
    split_turns: bool = False,
    ref_model: Any | None = None,
    sync: GradientSync | None = None,
) -> dict[str, float]:
    """Update ``model`` (the agents ``members``, which share it) on ``ro`` by
    :func:`chunk_update_plan`: one :func:`update_policy` call (``settings.num_iterations``
    optimizer steps) per plan step on those nodes' completions of every member. The first
    step's loss is ``settings``' own; every later step's uses the importance ratio to the
    behaviour log-probs, or with TIS or a retempered update to the old log-probs taken
    before the first step (see the module docstring). A plan of one step is exactly
    :func:`update_policy` on the whole rollout.

    Args:
        advantages: per turn ``t``, per agent, ``[N_t * G]`` (node-major), as
            :func:`comlrl.algos.recipes.group_baseline.advantages.group_advantages` returns.
        members: the agents whose completions train ``model`` (one, unless agents share it).
        split_turns: one step per turn of a chunk (1.4.3).

    Returns:
        The metrics of :func:`update_policy` averaged over the plan's steps that have them
        (per-turn keys ``turn_<t>/...`` named by the rollout turn; with several
        ``members``, per member ``term_<m>/...`` for
        :func:`~comlrl.algos.training.update.metric_sums.split_terms`), plus ``optimizer_steps``.

    Raises:
        ValueError: as :func:`chunk_update_plan` and :func:`update_policy`; a plan of more
            than one step with ``settings.clip_ratio`` None (the later steps' ratios would
            be unbounded).
    """
    plan = chunk_update_plan(ro, chunk_nodes, split_turns)
    if len(plan) > 1 and settings.clip_ratio is None:
        raise ValueError(
            f"chunk_nodes={chunk_nodes} splits this rollout into {len(plan)} optimizer steps; "
            "the later ones weight their completions by an importance ratio that is unbounded "
            "without the PPO clip: set UpdateSettings.clip_ratio (e.g. 0.2)"
        )
    parts = [_step_batches(ro, advantages, members, step) for step in plan]
    # the later chunks' old log-probs, before the first step moves the weights
    old = [
        [trainer_logprobs(model, b, settings) for b in batches] if i > 0 else None
        for i, (batches, *_) in enumerate(parts)
    ]
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for i, (batches, advs, turns, terms) in enumerate(parts):
        stats = update_policy(
            model, optimizer, batches, advs,
            settings if i == 0 else dataclasses.replace(settings, importance_ratio=True),
            ref_model=ref_model, sync=sync, terms=terms if len(members) > 1 else None,
            turns=turns, old_logprobs=old[i],
        )  # fmt: skip
        for key, value in stats.items():
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    out = {key: value / counts[key] for key, value in sums.items()}
    out["optimizer_steps"] = float(len(plan) * settings.num_iterations)
    return out


def _step_batches(
    ro: Rollout,
    advantages: Sequence[Sequence[torch.Tensor]],
    members: Sequence[int],
    step: PlanStep,
) -> tuple[list[PolicyBatch], list[torch.Tensor], list[int], list[int]]:
    """One plan step's batches, advantages, turns and terms (member by member, turn by
    turn), as :func:`update_policy` takes them."""
    batches, advs, turns, terms = [], [], [], []
    for m in members:
        for t, nodes in step:
            batch, adv = ro.turns[t].agents[m].batch, advantages[t][m]
            if nodes != list(range(batch.num_prompts)):  # a part of the turn
                index = torch.tensor(nodes, dtype=torch.long, device=adv.device)
                batch = select_nodes(batch, nodes)
                adv = adv.reshape(-1, batch.group_size).index_select(0, index).reshape(-1)
            batches.append(batch)
            advs.append(adv)
            turns.append(t)
            terms.append(m)
    return batches, advs, turns, terms
