"""How unevenly one step moved the agents: :func:`grad_norm_ratio` of their gradient norms
(the ``grad_norm_ratio`` metric of the group-baseline recipes)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["grad_norm_ratio"]


def grad_norm_ratio(norms: Sequence[float]) -> float | None:
    """The largest agent's gradient norm over the median agent's.

    Dr. MAS (Feng et al. 2026, arXiv 2602.08847) traces gradient-norm spikes of multi-agent
    GRPO to a global advantage normalization; this ratio shows the spread of one step. The
    median agent is the lower middle one (an actual agent's norm: with two agents the ratio
    is the larger norm over the smaller). Norms are each agent's pre-clip global norm of
    one optimizer step.

    Args:
        norms: one norm per agent (>= 0).

    Returns:
        ``max / median`` (>= 1); 1.0 when every norm is 0; None with fewer than two agents,
        or when the median agent's norm is 0 and another's is not (unbounded).
    """
    if len(norms) < 2:
        return None
    ordered = sorted(float(n) for n in norms)
    median, top = ordered[(len(ordered) - 1) // 2], ordered[-1]
    if top == 0.0:
        return 1.0
    return top / median if median > 0.0 else None
