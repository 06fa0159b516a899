"""Returns down a multi-turn rollout tree (pure functions over tensors, no transformers).

At turn ``t`` there are ``N_t`` nodes with ``K`` joint actions each. Joint action ``j`` of
node ``n`` earns reward ``r_j`` and either ends the episode (*terminal*), opens a child
node ``c(j)`` at turn ``t + 1`` (*expanded*), or is neither because a branching limit did
not expand it (*pruned*). With the value of a node defined as the mean return of its
joint actions, ``V(n) = mean_j R_j``, and ``T`` the turn limit (turns ``0 .. T - 1``), the
return of a joint action is

- terminal: ``R_j = r_j * (1 + gamma + ... + gamma**(T - 1 - t))``: the reward is *held*
  for the turns the episode skips, as if the final state kept earning it (an absorbing
  state). At the last turn the factor is 1. Without this, ending early cost the turns
  it skipped: a first-turn success (1.0) beside a sibling that failed (0.2) and was fixed
  next turn (1.0) got returns [1.0, 1.2], so the success had the lower advantage. Held,
  they are [2.0, 1.2]. The rule applies to every early end (a reward over the
  termination threshold, or the task's ``done``), so a failure that ends the episode is
  held too. It assumes each turn's reward scores the joint action's state (a pass rate,
  a judge's grade), the convention of CoMLRL's multi-turn tasks;
- expanded: ``R_j = r_j + gamma * V(c(j))``;
- pruned: ``R_j = r_j + gamma * mean{ V(c(i)) : i an expanded sibling of j }`` (its own
  future was not sampled, so it is estimated by that of its expanded siblings, which
  share its node; with no expanded sibling the future counts 0).

With ``hold_terminal=False`` a terminal joint action's return is its reward alone,
``R_j = r_j`` (the plain sum of the rewards the episode earned). With ``gamma = 1`` and
``hold_terminal=False`` this is the return CoMLRL 1.4.3's MAGRPO trains on (it ignores its
``discount`` option and does not hold an early end's reward). The discounted sum follows Sutton and Barto 2018, eq. 3.8,
with the expectation over the next joint action replaced by the mean over the sampled
children (a Monte Carlo tree estimate).

Named axes: ``N_t`` nodes at turn ``t``, ``K`` joint actions per node.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["hold_factor", "tree_returns"]


def hold_factor(gamma: float, turn: int, num_turns: int) -> float:
    """``1 + gamma + ... + gamma**(num_turns - 1 - turn)``: what an episode that ends at
    ``turn`` (0-based) of a ``num_turns`` limit multiplies its last reward by (the reward
    held for the turns it skips; 1 at the last turn)."""
    return float(sum(gamma**i for i in range(num_turns - turn)))


def tree_returns(
    rewards: Sequence[Tensor],
    child: Sequence[Tensor],
    terminal: Sequence[Tensor],
    gamma: float = 1.0,
    *,
    num_turns: int | None = None,
    hold_terminal: bool = True,
) -> list[Tensor]:
    """Discounted returns of every joint action of a rollout tree, turn by turn.

    Args:
        rewards: per turn ``t``, ``[N_t, K]`` float rewards.
        child: per turn, ``[N_t, K]`` int64 index of the child node at turn ``t + 1``
            (into that turn's ``N_{t+1}`` nodes), ``-1`` when there is none. The last
            turn's entries must all be ``-1``.
        terminal: per turn, ``[N_t, K]`` bool, True where the episode ended.
        gamma: discount in ``[0, 1]``.
        num_turns: the turn limit ``T`` the terminal rewards are held for (see the
            module docstring); None: ``len(rewards)``. Pass the episode's limit when the
            tree stopped early because every episode had ended.
        hold_terminal: hold an early end's reward for the turns it skips (the default);
            False: a terminal joint action's return is its reward (``num_turns`` unused).

    Returns:
        per turn, ``[N_t, K]`` returns in the dtype of ``rewards`` (float32 for
        non-float64 input).

    Raises:
        ValueError: mismatched lengths or shapes, ``gamma`` outside ``[0, 1]``, a child
            index outside ``[-1, N_{t+1})``, a joint action that is both terminal and
            expanded, a non-finite reward, or ``num_turns < len(rewards)``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if not len(rewards) == len(child) == len(terminal):
        raise ValueError(
            f"got {len(rewards)} turns of rewards, {len(child)} of child and "
            f"{len(terminal)} of terminal; give one tensor per turn for each"
        )
    depth = len(rewards)
    horizon = depth if num_turns is None else num_turns
    if horizon < depth:
        raise ValueError(f"num_turns={num_turns} but the tree has {depth} turns")
    out: list[Tensor] = [torch.empty(0)] * depth
    for t in range(depth - 1, -1, -1):
        r, c, term = rewards[t], child[t], terminal[t].to(torch.bool)
        dtype = torch.float64 if r.dtype == torch.float64 else torch.float32
        r = r.to(dtype)
        if r.dim() != 2 or c.shape != r.shape or term.shape != r.shape:
            raise ValueError(
                f"turn {t}: rewards {list(r.shape)}, child {list(c.shape)} and terminal "
                f"{list(term.shape)} must all be [N_t, K]"
            )
        if not bool(torch.isfinite(r).all()):
            raise ValueError(f"turn {t}: rewards must be finite, got {r.tolist()}")
        expanded = c >= 0
        if bool((expanded & term).any()):
            raise ValueError(f"turn {t}: a joint action cannot be terminal and expanded")
        # terminal: held for the skipped turns (or counted once)
        held = r * hold_factor(gamma, t, horizon) if hold_terminal else r
        if t == depth - 1:
            if bool(expanded.any()):
                raise ValueError(f"turn {t} is the last turn but has child indices >= 0")
            out[t] = torch.where(term, held, r)
            continue
        values = out[t + 1].mean(dim=1) if out[t + 1].numel() else out[t + 1].new_zeros(0)
        if expanded.any() and int(c.max()) >= values.numel():
            raise ValueError(
                f"turn {t}: child index {int(c.max())} but turn {t + 1} has {values.numel()} nodes"
            )
        future = torch.where(expanded, values.to(dtype)[c.clamp(min=0)], r.new_zeros(()))
        count = expanded.sum(dim=1, keepdim=True)
        sibling_mean = future.sum(dim=1, keepdim=True) / count.clamp(min=1)
        pruned = ~expanded & ~term
        future = torch.where(pruned, sibling_mean.expand_as(future), future)
        out[t] = torch.where(term, held, r + gamma * future)
    return out
