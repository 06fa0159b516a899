"""Advantages of several agents' completions in one batch: whose statistics an agent is
measured against (its own, or the team's pooled), and agent x turn groups in multi-turn trees.

In a multi-agent batch every completion has a return ``r``, an agent ``k`` and a group (the
prompt, tree node or turn its siblings share). :func:`agentwise_advantages` computes the
estimator's advantage ``A = (r - b) / s`` (:func:`~comlrl.estimators.advantages.compute_advantages`)
with the baseline ``b`` and the divisor ``s`` taken from one of two pools of returns:

- ``stats="agent"``: agent ``k``'s own returns only. Its baseline is computed over agent
  ``k``'s samples of the group, and ``s`` is the std of agent ``k``'s returns over that
  group (``scale="group"``) or over all of agent ``k``'s samples in the batch
  (``scale="batch"``). This is Dr. MAS's agent-wise normalization (Feng et al. 2026, "Dr.
  MAS: Stable Reinforcement Learning for Multi-Agent LLM Systems", arXiv 2602.08847,
  eq. 5): for GRPO, ``A_{i,k} = (r_{i,k} - mean_k) / (std_k + eps)``, each agent's
  advantages standardized by its own reward statistics, so an agent whose rewards live on
  another scale (or around another mean) than its teammates' still gets advantages of unit
  scale, and its gradient norm does not grow or vanish with the others' reward ranges.
- ``stats="global"``: the agents' returns pooled. Every agent's samples of a group form one
  group (so ``rloo``/``remax``'s "other samples" include teammates'), and ``s`` is the std of
  the pooled group, or of every return in the batch. This is GRPO's normalization applied
  to the whole multi-agent batch (Dr. MAS's eq. 2, the baseline it improves on): an agent
  whose returns vary less than its teammates' gets advantages, and so gradients, smaller by
  the ratio of the ranges.

When every agent's returns are the same numbers (one joint return credited to every agent
of an aligned joint action), the two coincide for ``grpo`` and ``reinforce``; they differ
where the agents' returns differ (``cross`` joint actions credit each completion with its
own mean; a task that rewards each agent apart).

:func:`agent_turn_group_ids` gives the group of AT-GRPO (Zhao et al. 2025, "Stronger
Together: On-Policy Reinforcement Learning for Collaborative LLMs", arXiv 2510.11062): the
completions of one agent at one turn of one example's rollout, whatever branch of the
tree they continue. Grouping by the prompt alone (one example's completions of every agent
and turn together) compares completions written for different prompts (roles differ by
agent, histories by turn); AT-GRPO's key keeps a group to one agent and one turn.

Conventions are those of :mod:`comlrl.estimators.advantages`: population standard deviations
(``ddof=0``, divide by ``n``), ``eps`` added to the std (not the variance), the divisor always
a std of the *returns*, never of the advantages, and no re-centring after the baseline, so
the four estimators stay distinct under both pools and every scale (z-scoring the
advantages would make them one). Defined edge cases, for either pool: a group of one sample
has advantage 0 under ``grpo``, ``rloo`` and ``remax`` (``r`` under ``reinforce``); a group of
equal returns has advantage 0 under the baselined estimators; a NaN or infinite return
raises naming its index; ``reinforce`` divided by a zero std gets ``r / eps``.

Named axes: ``M`` samples (flat, any order), ``A`` agents (labels ``0 .. A - 1``).
"""

from __future__ import annotations

from typing import Literal

import torch
from comlrl.estimators.advantages import SCALES, Scale, compute_advantages, return_moments
from comlrl.estimators.registry import Estimator, resolve_estimator
from torch import Tensor

__all__ = [
    "STATS",
    "agent_return_moments",
    "agent_turn_group_ids",
    "agentwise_advantages",
]

#: Accepted values of ``agentwise_advantages(stats=...)``.
STATS: tuple[str, ...] = ("agent", "global")

Stats = Literal["agent", "global"]


def _integer_ids(name: str, ids: Tensor, num_samples: int) -> Tensor:
    """``ids`` as int64 ``[M]``, or a ValueError naming ``name``."""
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got dtype {ids.dtype}")
    if ids.shape != (num_samples,):
        raise ValueError(
            f"{name} must have shape [M] = [{num_samples}] like the returns, got {list(ids.shape)}"
        )
    return ids.to(torch.int64)


def _check_stats(stats: str) -> None:
    if stats not in STATS:
        raise ValueError(f"unknown stats {stats!r}; use one of {list(STATS)}")


def agent_turn_group_ids(example_ids: Tensor, turn_ids: Tensor, agent_ids: Tensor) -> Tensor:
    """AT-GRPO's group of every sample: one label per distinct ``(example, turn, agent)``.

    Zhao et al. 2025 (AT-GRPO, arXiv 2510.11062) group a multi-agent, multi-turn batch by
    agent and turn: the completions agent ``k`` wrote at turn ``t`` of one example's rollout
    share a baseline, over every branch of the tree that reached turn ``t``. Pass the
    result as ``group_ids`` to :func:`agentwise_advantages` (either pool) or to
    :func:`~comlrl.estimators.advantages.compute_advantages`.

    Args:
        example_ids: ``[M]`` integer, the example (task instance) of each sample.
        turn_ids: ``[M]`` integer, its turn.
        agent_ids: ``[M]`` integer, the agent that wrote it.

    Returns:
        ``[M]`` int64 labels ``0 .. num_groups - 1``, numbered in the lexicographic order
        of ``(example, turn, agent)``; two samples share a label exactly when they share
        all three ids.

    Raises:
        ValueError: an argument that is not a 1-D integer tensor, or shapes that differ.
    """
    if not isinstance(example_ids, Tensor):
        raise TypeError(f"example_ids must be a torch.Tensor, got {type(example_ids).__name__}")
    num_samples = example_ids.shape[0] if example_ids.dim() == 1 else -1
    if num_samples < 0:
        raise ValueError(f"example_ids must be 1-D [M], got shape {list(example_ids.shape)}")
    keys = torch.stack(
        [
            _integer_ids("example_ids", example_ids, num_samples),
            _integer_ids("turn_ids", turn_ids, num_samples).to(example_ids.device),
            _integer_ids("agent_ids", agent_ids, num_samples).to(example_ids.device),
        ],
        dim=1,
    )
    if num_samples == 0:
        return torch.zeros(0, dtype=torch.int64, device=example_ids.device)
    return torch.unique(keys, dim=0, return_inverse=True)[1]


def _num_agents(agent_ids: Tensor, num_agents: int | None) -> int:
    """``A``: ``num_agents`` when given (checked against the labels), else ``max + 1``."""
    if num_agents is not None and (isinstance(num_agents, bool) or num_agents < 1):
        raise ValueError(f"num_agents must be a positive integer, got {num_agents!r}")
    if agent_ids.numel() and int(agent_ids.min()) < 0:
        raise ValueError(f"agent_ids must be >= 0, got {int(agent_ids.min())}")
    top = int(agent_ids.max()) + 1 if agent_ids.numel() else 1
    if num_agents is None:
        return top
    if top > num_agents:
        raise ValueError(
            f"agent_ids go up to {top - 1} but num_agents={num_agents}; labels must lie in "
            f"[0, {num_agents})"
        )
    return num_agents


def agent_return_moments(
    returns: Tensor, agent_ids: Tensor, num_agents: int | None = None, *, stats: Stats = "agent"
) -> Tensor:
    """Per agent, the count, sum and sum of squares of the returns its ``scale="batch"``
    divisor is the std of: what each data-parallel rank contributes.

    Like :func:`~comlrl.estimators.advantages.return_moments`, moments add over shards: sum
    this over the ranks, take :func:`~comlrl.estimators.advantages.std_from_moments` of each
    row, and pass the ``[A]`` stds as ``agentwise_advantages(batch_std=...)``.

    Args:
        returns: ``[M]`` real returns (treated as constants).
        agent_ids: ``[M]`` integer agent of each return, in ``[0, A)``.
        num_agents: ``A`` (default ``max(agent_ids) + 1``).
        stats: ``"agent"``: row ``k`` holds agent ``k``'s returns' moments; ``"global"``:
            every row holds the moments of all returns (each agent's divisor is the
            batch's std).

    Returns:
        ``[A, 3]`` float64 ``(n, sum r, sum r**2)`` per agent, on the device of ``returns``.

    Raises:
        ValueError: unknown ``stats``; ``agent_ids`` of the wrong shape, dtype or range.
    """
    _check_stats(stats)
    values = returns.detach().to(torch.float64).reshape(-1)
    ids = _integer_ids("agent_ids", agent_ids, values.numel()).to(values.device)
    count = _num_agents(ids, num_agents)
    if stats == "global":
        return return_moments(values).unsqueeze(0).expand(count, 3).clone()
    columns = torch.stack([torch.ones_like(values), values, values * values], dim=1)
    return values.new_zeros(count, 3).index_add(0, ids, columns)


def _agent_stds(values: Tensor, agent_ids: Tensor, num_agents: int, stats: Stats) -> Tensor:
    """``[A]`` population std of each agent's returns (``stats="agent"``) or of all
    returns repeated (``"global"``), in two passes (mean first: no cancellation)."""
    if stats == "global":
        return values.std(correction=0).expand(num_agents).clone()
    zeros = values.new_zeros(num_agents)
    counts = zeros.index_add(0, agent_ids, torch.ones_like(values)).clamp(min=1)
    centred = values - (zeros.index_add(0, agent_ids, values) / counts)[agent_ids]
    return (zeros.index_add(0, agent_ids, centred * centred) / counts).sqrt()


def agentwise_advantages(
    returns: Tensor,
    agent_ids: Tensor,
    group_ids: Tensor,
    *,
    num_agents: int | None = None,
    estimator: str | Estimator = "grpo",
    scale: Scale = "auto",
    stats: Stats = "agent",
    eps: float = 1e-6,
    batch_std: Tensor | None = None,
) -> Tensor:
    """Advantages ``A = (r - b) / s`` of a multi-agent batch, with ``b`` and ``s`` from each
    agent's own returns (``stats="agent"``, Dr. MAS eq. 5) or the agents' pooled returns
    (``stats="global"``, Dr. MAS eq. 2); see the module docstring.

    With ``stats="agent"``, sample ``i`` of agent ``k`` in group ``g``:

    - ``b_i``: the estimator's baseline over the samples of agent ``k`` in group ``g``
      (``grpo``: their mean, ``rloo``: the mean of the others, ``remax``: the max of the
      others, ``reinforce``: 0);
    - ``s``: ``1`` (``scale="none"``); the population std of those samples' returns plus
      ``eps`` (``"group"``); the population std of all of agent ``k``'s returns in the batch
      plus ``eps`` (``"batch"``; ``batch_std[k] + eps`` when given).

    With ``stats="global"``, the same with "agent ``k``'s samples" read as "every agent's
    samples". ``scale="auto"`` is the estimator's own scaling (``grpo``: group). The result
    for agent ``k`` under ``stats="agent"`` equals
    ``compute_advantages(returns[agent_ids == k], group_ids=group_ids[agent_ids == k], ...)``
    for ``scale`` ``none`` and ``group``, and, for ``batch``, that call's ``batch`` result
    (it already divides by the std of agent ``k``'s returns).

    Args:
        returns: ``[M]`` real returns (treated as constants).
        agent_ids: ``[M]`` integer agent of each sample, in ``[0, A)``.
        group_ids: ``[M]`` integer group of each sample: the prompt or tree node its
            siblings share, or :func:`agent_turn_group_ids`. Different agents' samples may
            carry the same label; ``stats`` decides whether they are one group.
        num_agents: ``A`` (default ``max(agent_ids) + 1``); the length of ``batch_std``.
        estimator: a name in :data:`~comlrl.estimators.registry.ESTIMATORS` or an
            :class:`~comlrl.estimators.registry.Estimator`.
        scale: ``"auto"``, ``"none"``, ``"group"`` or ``"batch"``.
        stats: ``"agent"`` or ``"global"`` (:data:`STATS`).
        eps: added to the std; > 0.
        batch_std: with ``scale="batch"`` only: ``[A]`` stds (finite, >= 0), entry ``k``
            the divisor of agent ``k``, e.g. of the whole batch of which ``returns`` is one
            data-parallel shard (:func:`agent_return_moments` summed over ranks).

    Returns:
        ``[M]`` advantages: float64 for float64 returns, else float32.

    Raises:
        ValueError: unknown ``stats``, ``scale`` or estimator; ``eps <= 0``; ids of the
            wrong shape, dtype or range; a NaN or infinite return (the message names its
            index); ``batch_std`` with another scale, of the wrong shape, negative or not
            finite.
    """
    _check_stats(stats)
    est = resolve_estimator(estimator)
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {list(SCALES)}")
    resolved = est.scale if scale == "auto" else scale
    if not isinstance(returns, Tensor):
        raise TypeError(f"returns must be a torch.Tensor, got {type(returns).__name__}")
    if returns.dim() != 1:
        raise ValueError(f"returns must be flat [M], got shape {list(returns.shape)}")
    agents = _integer_ids("agent_ids", agent_ids, returns.numel()).to(returns.device)
    groups = _integer_ids("group_ids", group_ids, returns.numel()).to(returns.device)
    count = _num_agents(agents, num_agents)
    if batch_std is not None:
        if resolved != "batch":
            raise ValueError(
                f"batch_std is the divisor of scale='batch', but scale={resolved!r}; "
                "drop batch_std or set scale='batch'"
            )
        if batch_std.shape != (count,):
            raise ValueError(
                f"batch_std must be [A] = [{count}], one std per agent, got {list(batch_std.shape)}"
            )
        if not bool((torch.isfinite(batch_std) & (batch_std >= 0)).all()):
            raise ValueError(f"batch_std must be finite and >= 0, got {batch_std.tolist()}")
    if stats == "agent" and returns.numel():
        keys = torch.unique(torch.stack([groups, agents], dim=1), dim=0, return_inverse=True)[1]
    else:
        keys = groups
    # the baseline (and the group std) by compute_advantages, which also checks the returns
    # and eps; the batch divisor per agent below, so that it can be the agent's own
    within: Scale = "none" if resolved == "batch" else resolved
    adv = compute_advantages(returns, estimator=est, group_ids=keys, scale=within, eps=eps)
    if resolved != "batch" or adv.numel() == 0:
        return adv
    if batch_std is None:
        std = _agent_stds(returns.detach().to(adv.dtype), agents, count, stats)
    else:
        std = batch_std.to(device=adv.device, dtype=adv.dtype)
    return adv / (std[agents] + eps)
