"""Critic-based returns, advantages and value loss (pure functions over tensors, no transformers).

Two layouts:

- flat trajectories ``[B, T]`` (``B`` episodes, ``T`` turns, ``dones[b, t]`` True where
  the episode ends with turn ``t``): :func:`discounted_returns` and :func:`gae`;
- a multi-turn rollout tree (:mod:`comlrl.estimators.returns`' layout: per turn ``[N_t, K]``
  joint actions with ``child`` links and ``terminal`` flags): :func:`tree_gae`, which on
  a chain (``K = 1``) equals :func:`gae` and with ``lam = 1`` gives the targets of
  :func:`comlrl.estimators.returns.tree_returns` (both tested).

Generalized advantage estimation follows Schulman et al. 2016, "High-Dimensional
Continuous Control Using Generalized Advantage Estimation", eq. 11-16: the TD residual
``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)`` (eq. 11, with ``V(s_{t+1}) = 0`` after
the episode ends) and ``A_t = sum_l (gamma * lam)**l * delta_{t+l}`` (eq. 16), computed
backwards as ``A_t = delta_t + gamma * lam * A_{t+1}``. The value targets are the
lambda-returns ``A_t + V(s_t)``. :func:`value_loss` is the squared error of PPO (Schulman
et al. 2017, eq. 9) with the optional clipping of the new value to within ``clip_range``
of the value at sampling time (PPO's reference implementation; studied in Engstrom et
al. 2020, "Implementation Matters in Deep RL").

Named axes: ``B`` episodes, ``T`` turns, ``N_t`` nodes at turn ``t``, ``K`` joint actions
per node. Units: rewards, values and returns are in task reward units.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from comlrl.estimators.returns import hold_factor
from torch import Tensor

__all__ = ["discounted_returns", "gae", "tree_gae", "q_advantages", "value_loss"]


def _check_discount(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def _check_flat(rewards: Tensor, dones: Tensor, values: Tensor | None = None) -> torch.dtype:
    if rewards.dim() != 2 or not rewards.dtype.is_floating_point:
        raise ValueError(
            f"rewards must be a floating tensor [B, T], got shape {list(rewards.shape)} "
            f"dtype {rewards.dtype}"
        )
    if dones.shape != rewards.shape:
        raise ValueError(
            f"dones {list(dones.shape)} must have the shape of rewards {list(rewards.shape)}"
        )
    if values is not None and values.shape != rewards.shape:
        raise ValueError(
            f"values {list(values.shape)} must have the shape of rewards {list(rewards.shape)}"
        )
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite; check the reward function for NaN/inf")
    return torch.float64 if rewards.dtype == torch.float64 else torch.float32


def discounted_returns(
    rewards: Tensor, dones: Tensor, gamma: float, *, bootstrap: Tensor | None = None
) -> Tensor:
    """Discounted returns ``R_t = r_t + gamma * (1 - done_t) * R_{t+1}`` of ``B`` episodes.

    Sutton and Barto 2018, eq. 3.9. Past the last column the return is ``bootstrap``
    (e.g. a critic's value of the state after the last turn of a truncated episode), 0
    when None. Entries after an episode's end (padding) do not reach the entries before it.

    Args:
        rewards: ``[B, T]`` floating rewards.
        dones: ``[B, T]`` bool (or 0/1), True where the episode ends with turn ``t``.
        gamma: discount in ``[0, 1]``.
        bootstrap: ``[B]`` value after column ``T - 1`` for episodes not done there.

    Returns:
        ``[B, T]`` returns, float32 (float64 for float64 rewards).

    Raises:
        ValueError: shapes do not match, non-floating or non-finite rewards, ``gamma``
            outside ``[0, 1]``.
    """
    _check_discount("gamma", gamma)
    dtype = _check_flat(rewards, dones)
    b, t_max = rewards.shape
    r = rewards.to(dtype)
    cont = (~dones.to(torch.bool)).to(dtype)
    nxt = _bootstrap(bootstrap, b, r)
    out = torch.empty_like(r)
    for t in range(t_max - 1, -1, -1):
        nxt = r[:, t] + gamma * cont[:, t] * nxt
        out[:, t] = nxt
    return out


def _bootstrap(bootstrap: Tensor | None, b: int, like: Tensor) -> Tensor:
    if bootstrap is None:
        return like.new_zeros(b)
    if bootstrap.shape != (b,):
        raise ValueError(f"bootstrap must be [B] = [{b}], got {list(bootstrap.shape)}")
    return bootstrap.detach().to(like.dtype)


def gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    gamma: float,
    lam: float,
    *,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimates and lambda-return targets of ``B`` episodes.

    Schulman et al. 2016, eq. 11 and 16: ``delta_t = r_t + gamma * (1 - done_t) *
    V_{t+1} - V_t`` and ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}``, with
    ``V_T = bootstrap`` (0 when None) and ``A_T = 0``. ``lam = 0`` gives the one-step TD
    error, ``lam = 1`` the Monte Carlo return minus ``V_t``. Values are treated as
    constants (detached).

    Args:
        rewards: ``[B, T]`` floating rewards.
        values: ``[B, T]`` critic values ``V(s_t)`` (or ``Q(s_t, a_t)``).
        dones: ``[B, T]`` bool (or 0/1), True where the episode ends with turn ``t``.
        gamma: discount in ``[0, 1]``.
        lam: GAE ``lambda`` in ``[0, 1]``.
        bootstrap: ``[B]`` value of the state after column ``T - 1``.

    Returns:
        ``(advantages, targets)``, both ``[B, T]`` float32 (float64 for float64 rewards);
        ``targets = advantages + values`` (the lambda-returns a critic regresses on).

    Raises:
        ValueError: shapes do not match, non-floating or non-finite rewards or values,
            ``gamma`` or ``lam`` outside ``[0, 1]``.
    """
    _check_discount("gamma", gamma)
    _check_discount("lam", lam)
    dtype = _check_flat(rewards, dones, values)
    if not bool(torch.isfinite(values).all()):
        raise ValueError("values must be finite; the critic returned NaN/inf")
    b, t_max = rewards.shape
    r, v = rewards.to(dtype), values.detach().to(dtype)
    cont = (~dones.to(torch.bool)).to(dtype)
    next_value = _bootstrap(bootstrap, b, r)
    next_adv = r.new_zeros(b)
    adv = torch.empty_like(r)
    for t in range(t_max - 1, -1, -1):
        delta = r[:, t] + gamma * cont[:, t] * next_value - v[:, t]
        next_adv = delta + gamma * lam * cont[:, t] * next_adv
        adv[:, t] = next_adv
        next_value = v[:, t]
    return adv, adv + v


def tree_gae(
    rewards: Sequence[Tensor],
    values: Sequence[Tensor],
    child: Sequence[Tensor],
    terminal: Sequence[Tensor],
    gamma: float,
    lam: float,
    *,
    num_turns: int | None = None,
    hold_terminal: bool = True,
) -> tuple[list[Tensor], list[Tensor]]:
    """GAE over a multi-turn rollout tree, per joint action of every turn.

    Joint action ``j`` of node ``n`` at turn ``t`` has value ``v_j`` (``V(s_n)``
    broadcast over the node's ``K`` joint actions for a state critic, ``Q(s_n, a_j)`` for
    a joint-action critic). The state after it is its child node ``c = c(j)``; as in
    :func:`comlrl.estimators.returns.tree_returns` the expectation over the next joint action
    is the mean over the child's sampled joint actions: ``V' = mean_k v_{c,k}`` and
    ``A' = mean_k A_{c,k}``. Then (Schulman et al. 2016, eq. 11 and 16)

    - ``delta_j = r_j + gamma * V' - v_j`` and ``A_j = delta_j + gamma * lam * A'``;
    - terminal joint actions: ``V' = A' = 0``, and a reward that ends the episode before
      the turn limit ``T`` is held for the turns it skips, ``r_j * (1 + gamma + ... +
      gamma**(T - 1 - t))``, as in :func:`~comlrl.estimators.returns.tree_returns`
      (an early success is not ranked below a sibling fixed a turn later); with
      ``hold_terminal=False`` it counts once (CoMLRL 1.4.3's actor-critic targets);
    - pruned ones (not terminal, no child under a branching limit): ``V'`` and ``A'``
      are the means over the expanded siblings of the same node (0 with none).

    On a chain (``K = 1``) this is :func:`gae`; with ``lam = 1`` the targets
    ``A_j + v_j`` equal :func:`~comlrl.estimators.returns.tree_returns`.

    Args:
        rewards: per turn ``t``, ``[N_t, K]`` floating rewards.
        values: per turn, ``[N_t, K]`` critic values (detached).
        child: per turn, ``[N_t, K]`` int64 child node at turn ``t + 1`` or ``-1``.
        terminal: per turn, ``[N_t, K]`` bool.
        gamma: discount in ``[0, 1]``.
        lam: GAE ``lambda`` in ``[0, 1]``.
        num_turns: the turn limit ``T`` (None: ``len(rewards)``).
        hold_terminal: hold an early end's reward (the default); False: count it once.

    Returns:
        ``(advantages, targets)``: per turn ``[N_t, K]`` float32 (float64 for float64
        rewards); ``targets = advantages + values``.

    Raises:
        ValueError: mismatched turn counts or shapes, ``gamma``/``lam`` outside
            ``[0, 1]``, non-finite rewards or values, a child index out of range, a
            joint action that is terminal and expanded, children at the last turn, or
            ``num_turns < len(rewards)``.
    """
    _check_discount("gamma", gamma)
    _check_discount("lam", lam)
    if not len(rewards) == len(values) == len(child) == len(terminal):
        raise ValueError(
            f"got {len(rewards)} turns of rewards, {len(values)} of values, {len(child)} of "
            f"child and {len(terminal)} of terminal; give one tensor per turn for each"
        )
    depth = len(rewards)
    horizon = depth if num_turns is None else num_turns
    if horizon < depth:
        raise ValueError(f"num_turns={num_turns} but the tree has {depth} turns")
    advs: list[Tensor] = [torch.empty(0)] * depth
    targets: list[Tensor] = [torch.empty(0)] * depth
    for t in range(depth - 1, -1, -1):
        r, v, c, term = rewards[t], values[t], child[t], terminal[t].to(torch.bool)
        if r.dim() != 2 or not r.dtype.is_floating_point:
            raise ValueError(
                f"turn {t}: rewards must be a floating [N_t, K] tensor, got {list(r.shape)} {r.dtype}"
            )
        if v.shape != r.shape or c.shape != r.shape or term.shape != r.shape:
            raise ValueError(
                f"turn {t}: rewards {list(r.shape)}, values {list(v.shape)}, child "
                f"{list(c.shape)} and terminal {list(term.shape)} must all be [N_t, K]"
            )
        dtype = torch.float64 if r.dtype == torch.float64 else torch.float32
        r, v = r.to(dtype), v.detach().to(dtype)
        if not bool(torch.isfinite(r).all()) or not bool(torch.isfinite(v).all()):
            raise ValueError(f"turn {t}: rewards and values must be finite")
        expanded = c >= 0
        if bool((expanded & term).any()):
            raise ValueError(f"turn {t}: a joint action cannot be terminal and expanded")
        if t == depth - 1 and bool(expanded.any()):
            raise ValueError(f"turn {t} is the last turn but has child indices >= 0")
        if hold_terminal:
            r = torch.where(term, r * hold_factor(gamma, t, horizon), r)
        if t == depth - 1 or not bool(expanded.any()):
            next_v = next_a = torch.zeros_like(r)
        else:
            n_next = advs[t + 1].shape[0]
            if int(c.max()) >= n_next:
                raise ValueError(
                    f"turn {t}: child index {int(c.max())} but turn {t + 1} has {n_next} nodes"
                )
            idx = c.clamp(min=0)
            zero = r.new_zeros(())
            node_v = values[t + 1].detach().to(dtype).mean(dim=1)
            node_a = advs[t + 1].to(dtype).mean(dim=1)
            next_v = torch.where(expanded, node_v[idx], zero)
            next_a = torch.where(expanded, node_a[idx], zero)
            count = expanded.sum(dim=1, keepdim=True).clamp(min=1)
            pruned = ~expanded & ~term
            next_v = torch.where(
                pruned, (next_v.sum(dim=1, keepdim=True) / count).expand_as(r), next_v
            )
            next_a = torch.where(
                pruned, (next_a.sum(dim=1, keepdim=True) / count).expand_as(r), next_a
            )
        adv = r + gamma * next_v - v + gamma * lam * next_a
        advs[t] = adv
        targets[t] = adv + v
    return advs, targets


def q_advantages(lambda_returns: Tensor, q_values: Tensor) -> Tensor:
    """Actor advantages with a joint-action critic ``Q(s, a)``: ``G^lambda(s, a_k) - b(s)``.

    The Q of the action being scored cannot be its own baseline: by the policy-gradient
    theorem (Sutton et al. 2000) ``E_a[grad log pi(a|s) G(s, a)] = E_a[grad log pi(a|s)
    Q(s, a)]``, so ``G - Q(s, a)`` (what :func:`tree_gae` gives with Q as the value) has
    zero expected gradient once the critic fits: the actor learns only from the critic's
    errors. The baseline must not depend on the scored action; here it is
    ``b(s) = mean_k Q(s, a_k)`` over the node's ``K`` sampled joint actions, a sampled
    ``V(s) = E_a Q(s, a)`` (as in the counterfactual baseline of Foerster et al. 2018,
    COMA, marginalised over the sampled joint actions rather than one agent's). With
    ``K = 1`` no such estimate exists and ``b = 0`` (the caller's whitening then subtracts
    the batch mean, an action-independent baseline). The critic still enters through the
    lambda-return, which bootstraps on the next turn's Q (SARSA(lambda); Sutton and Barto
    2018, sec. 12.7).

    Args:
        lambda_returns: ``[N, K]`` floating lambda-return targets of one turn
            (:func:`tree_gae`'s targets with the Q values).
        q_values: ``[N, K]`` sampling-time ``Q(s_n, a_k)``.

    Returns:
        ``[N, K]`` advantages, the dtype of ``lambda_returns``; with ``K >= 2`` each node's
        advantages sum to ``K * (mean_k G - mean_k Q)``.

    Raises:
        ValueError: shapes differ or are not 2-D.
    """
    if lambda_returns.dim() != 2 or q_values.shape != lambda_returns.shape:
        raise ValueError(
            f"lambda_returns {list(lambda_returns.shape)} and q_values "
            f"{list(q_values.shape)} must both be [N, K]"
        )
    if lambda_returns.shape[1] < 2:
        return lambda_returns.clone()
    baseline = q_values.to(lambda_returns.dtype).mean(dim=1, keepdim=True)
    return lambda_returns - baseline


def value_loss(
    values: Tensor,
    targets: Tensor,
    *,
    old_values: Tensor | None = None,
    clip_range: float | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Squared-error critic loss, optionally clipped around the values at sampling time.

    Unclipped: ``l = (V - R)**2`` (PPO, Schulman et al. 2017, eq. 9's ``L^VF``). Clipped:
    ``V_clip = V_old + clip(V - V_old, -eps, eps)`` and ``l = max((V - R)**2, (V_clip -
    R)**2)``, which stops the critic moving more than ``eps`` from ``V_old`` per batch in
    the direction that lowers the loss (PPO's reference implementation; Engstrom et al.
    2020). The loss is the mean of ``l`` over valid entries (0 for none); no factor 1/2.

    Args:
        values: any shape ``[...]``, floating, the critic's current values (with grad).
        targets: same shape, regression targets (e.g. lambda-returns from :func:`gae`);
            treated as constants.
        old_values: same shape, values when the batch was sampled; needed with
            ``clip_range``.
        clip_range: ``eps > 0`` in reward units, or None for no clipping.
        mask: same shape, bool (or 0/1) valid entries; None = all valid.

    Returns:
        ``(loss, metrics)``: scalar float32 loss (float64 for float64 values) and Python
        floats ``value_loss``, ``value_mean``, ``target_mean``, ``value_clip_fraction``
        (share of valid entries whose clipped term is the larger one and differs),
        ``explained_variance`` (``1 - Var[R - V] / Var[R]``, population variances; 0
        when ``Var[R] = 0``).

    Raises:
        ValueError: mismatched shapes, non-floating values, ``clip_range <= 0`` or
            not finite, ``clip_range`` without ``old_values``.
    """
    if not values.dtype.is_floating_point:
        raise ValueError(f"values must be floating point, got dtype {values.dtype}")
    for name, other in (("targets", targets), ("old_values", old_values), ("mask", mask)):
        if other is not None and other.shape != values.shape:
            raise ValueError(
                f"{name} must have the shape of values {list(values.shape)}, got {list(other.shape)}"
            )
    if clip_range is not None:
        if isinstance(clip_range, bool) or not (math.isfinite(clip_range) and clip_range > 0):
            raise ValueError(f"clip_range must be a finite number > 0 or None, got {clip_range!r}")
        if old_values is None:
            raise ValueError(
                "clip_range needs old_values (the values at sampling time); pass them or set clip_range=None"
            )
    dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    valid = (
        torch.ones_like(values, dtype=torch.bool)
        if mask is None
        else mask.to(device=values.device, dtype=torch.bool)
    )
    zero = values.new_zeros((), dtype=dtype)
    v = torch.where(valid, values.to(dtype), zero)
    target = torch.where(valid, targets.detach().to(device=values.device, dtype=dtype), zero)
    err = (v - target) ** 2
    clipped_active = torch.zeros_like(valid)
    if clip_range is not None and old_values is not None:
        old = torch.where(valid, old_values.detach().to(device=values.device, dtype=dtype), zero)
        v_clip = old + torch.clamp(v - old, -clip_range, clip_range)
        err_clip = (v_clip - target) ** 2
        with torch.no_grad():
            clipped_active = valid & (err_clip > err)
        err = torch.maximum(err, err_clip)
    count = valid.sum()
    loss = torch.where(valid, err, zero).sum() / count.clamp(min=1).to(dtype)
    with torch.no_grad():
        n = count.clamp(min=1).to(dtype)
        v_mean = v.sum() / n
        t_mean = target.sum() / n
        var_t = torch.where(valid, (target - t_mean) ** 2, zero).sum() / n
        resid = target - v
        r_mean = torch.where(valid, resid, zero).sum() / n
        var_r = torch.where(valid, (resid - r_mean) ** 2, zero).sum() / n
        ev = torch.where(var_t > 0, 1 - var_r / var_t.clamp(min=torch.finfo(dtype).tiny), zero)
        frac = clipped_active.sum().to(dtype) / n
        stats = torch.stack([loss.detach(), v_mean, t_mean, frac, ev]).tolist()
    names = ["value_loss", "value_mean", "target_mean", "value_clip_fraction", "explained_variance"]
    return loss, dict(zip(names, stats, strict=True))
