"""gae: discounted returns, GAE (flat and on a rollout tree) and the value loss, against plain
Python loops, with hypothesis properties."""

from __future__ import annotations

import random

import pytest
import torch
from comlrl.estimators.gae import discounted_returns, gae, q_advantages, tree_gae, value_loss
from comlrl.estimators.returns import tree_returns
from hypothesis import given, settings
from hypothesis import strategies as st

# Tolerance: float32 recursions of at most 6 steps over numbers of magnitude <= 10 (each
# step a few float32 ops, round-off ~1e-6 relative); the loop references run in Python
# floats (float64).
TOL = dict(atol=1e-5, rtol=1e-5)

finite = st.floats(-10, 10, allow_nan=False, width=32)
unit = st.floats(0, 1)


@st.composite
def trajectories(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    r = torch.tensor(draw(st.lists(finite, min_size=b * t, max_size=b * t))).view(b, t)
    v = torch.tensor(draw(st.lists(finite, min_size=b * t, max_size=b * t))).view(b, t)
    d = torch.tensor(draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))).view(b, t)
    return r, v, d


def _loop_returns(r: list[float], d: list[bool], gamma: float, boot: float) -> list[float]:
    out, nxt = [0.0] * len(r), boot
    for t in reversed(range(len(r))):
        nxt = r[t] + (0.0 if d[t] else gamma * nxt)
        out[t] = nxt
    return out


def _loop_gae(
    r: list[float], v: list[float], d: list[bool], gamma: float, lam: float, boot: float
) -> list[float]:
    """Schulman et al. 2016 eq. 16 summed term by term, not recursively."""
    n, out = len(r), []
    values = [*v, boot]
    for t in range(n):
        total, weight = 0.0, 1.0
        for s in range(t, n):
            nxt = 0.0 if d[s] else values[s + 1]
            total += weight * (r[s] + gamma * nxt - v[s])
            if d[s]:
                break
            weight *= gamma * lam
        out.append(total)
    return out


@settings(max_examples=80, deadline=None)
@given(trajectories(), unit, st.floats(-5, 5))
def test_discounted_returns_match_a_loop(
    traj: tuple[torch.Tensor, ...], gamma: float, boot: float
) -> None:
    r, _, d = traj
    bootstrap = torch.full((r.shape[0],), boot)
    got = discounted_returns(r, d, gamma, bootstrap=bootstrap)
    want = [_loop_returns(r[i].tolist(), d[i].tolist(), gamma, boot) for i in range(r.shape[0])]
    torch.testing.assert_close(got, torch.tensor(want), **TOL)


@settings(max_examples=80, deadline=None)
@given(trajectories(), unit, unit, st.floats(-5, 5))
def test_gae_matches_the_sum_of_discounted_td_errors(
    traj: tuple[torch.Tensor, ...], gamma: float, lam: float, boot: float
) -> None:
    r, v, d = traj
    bootstrap = torch.full((r.shape[0],), boot)
    adv, targets = gae(r, v, d, gamma, lam, bootstrap=bootstrap)
    want = [
        _loop_gae(r[i].tolist(), v[i].tolist(), d[i].tolist(), gamma, lam, boot)
        for i in range(r.shape[0])
    ]
    torch.testing.assert_close(adv, torch.tensor(want), **TOL)
    torch.testing.assert_close(targets, adv + v, **TOL)


@settings(max_examples=60, deadline=None)
@given(trajectories(), unit)
def test_lambda_one_targets_are_the_returns_and_lambda_zero_the_td_error(
    traj: tuple[torch.Tensor, ...], gamma: float
) -> None:
    r, v, d = traj
    _, targets = gae(r, v, d, gamma, 1.0)
    torch.testing.assert_close(targets, discounted_returns(r, d, gamma), **TOL)
    adv0, _ = gae(r, v, d, gamma, 0.0)
    next_v = torch.cat([v[:, 1:], torch.zeros(r.shape[0], 1)], dim=1) * (~d)
    torch.testing.assert_close(adv0, r + gamma * next_v - v, **TOL)


@settings(max_examples=60, deadline=None)
@given(trajectories(), unit, unit, st.floats(-5, 5))
def test_gae_is_shift_equivariant_in_a_constant_value_on_one_step_episodes(
    traj: tuple[torch.Tensor, ...], gamma: float, lam: float, c: float
) -> None:
    # With every turn terminal, A_t = r_t - V_t: adding c to V subtracts c from A.
    r, v, _ = traj
    d = torch.ones_like(r, dtype=torch.bool)
    a1, _ = gae(r, v, d, gamma, lam)
    a2, _ = gae(r, v + c, d, gamma, lam)
    torch.testing.assert_close(a2, a1 - c, **TOL)


def _chain_tree(
    r: torch.Tensor, v: torch.Tensor, d: torch.Tensor
) -> tuple[list[torch.Tensor], ...]:
    """The [B, T] trajectories as a K = 1 tree: a node per live episode per turn."""
    b, t_max = r.shape
    alive = list(range(b))
    rs, vs, cs, ts, rows = [], [], [], [], []
    for t in range(t_max):
        last = t == t_max - 1
        nxt = [i for i in alive if not d[i, t] and not last]
        rs.append(r[alive, t].view(-1, 1))
        vs.append(v[alive, t].view(-1, 1))
        ts.append(torch.tensor([bool(d[i, t]) or last for i in alive]).view(-1, 1))
        cs.append(
            torch.tensor([nxt.index(i) if i in nxt else -1 for i in alive], dtype=torch.int64).view(
                -1, 1
            )
        )
        rows.append(list(alive))
        alive = nxt
        if not alive:
            break
    return rs, vs, cs, ts, rows  # type: ignore[return-value]


@settings(max_examples=60, deadline=None)
@given(trajectories(), unit, unit)
def test_tree_gae_on_a_chain_is_flat_gae(
    traj: tuple[torch.Tensor, ...], gamma: float, lam: float
) -> None:
    r, v, d = traj
    rs, vs, cs, ts, rows = _chain_tree(r, v, d)
    adv, targets = tree_gae(rs, vs, cs, ts, gamma, lam)
    d_last = d.clone()
    d_last[:, -1] = True
    # the tree holds a reward that ends an episode early for the turns it skips
    r_held = r.clone()
    for i in range(r.shape[0]):
        first = int(d_last[i].nonzero()[0])
        r_held[i, first] *= sum(gamma**k for k in range(len(rs) - first))
    flat_adv, flat_targets = gae(r_held, v, d_last, gamma, lam)
    for t, alive in enumerate(rows):
        torch.testing.assert_close(adv[t].view(-1), flat_adv[alive, t], **TOL)
        torch.testing.assert_close(targets[t].view(-1), flat_targets[alive, t], **TOL)


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[torch.Tensor], ...]:
    """Random rollout trees: K joint actions per node, each terminal, expanded or pruned."""
    k, num_turns = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n = draw(st.integers(1, 3))
    rs, vs, cs, ts = [], [], [], []
    for t in range(num_turns):
        kinds = draw(st.lists(st.sampled_from("tep"), min_size=n * k, max_size=n * k))
        if t == num_turns - 1:
            kinds = ["t"] * (n * k)
        child, term, count = [], [], 0
        for kind in kinds:
            term.append(kind == "t")
            child.append(count if kind == "e" else -1)
            count += kind == "e"
        rs.append(torch.tensor(draw(st.lists(finite, min_size=n * k, max_size=n * k))).view(n, k))
        vs.append(torch.tensor(draw(st.lists(finite, min_size=n * k, max_size=n * k))).view(n, k))
        cs.append(torch.tensor(child, dtype=torch.int64).view(n, k))
        ts.append(torch.tensor(term).view(n, k))
        n = count
        if n == 0:
            break
    return rs, vs, cs, ts


def _loop_tree_gae(rs, vs, cs, ts, gamma: float, lam: float):  # type: ignore[no-untyped-def]
    """Recursive reference: (A, target) of joint action (t, n, j) straight from the rule."""

    def node(t: int, n: int) -> tuple[float, float]:  # mean value, mean advantage of a node
        k = rs[t].shape[1]
        advs = [action(t, n, j) for j in range(k)]
        return sum(float(vs[t][n, j]) for j in range(k)) / k, sum(advs) / k

    def reward(t: int, n: int, j: int) -> float:  # an early end is held for skipped turns
        held = sum(gamma**i for i in range(len(rs) - t)) if bool(ts[t][n, j]) else 1.0
        return float(rs[t][n, j]) * held

    def future(t: int, n: int, j: int) -> tuple[float, float]:
        if bool(ts[t][n, j]):
            return 0.0, 0.0
        c = int(cs[t][n, j])
        if c >= 0:
            return node(t + 1, c)
        sib = [int(x) for x in cs[t][n].tolist() if x >= 0]
        if not sib:
            return 0.0, 0.0
        pairs = [node(t + 1, c) for c in sib]
        return sum(p[0] for p in pairs) / len(sib), sum(p[1] for p in pairs) / len(sib)

    def action(t: int, n: int, j: int) -> float:
        nv, na = future(t, n, j)
        return reward(t, n, j) + gamma * nv - float(vs[t][n, j]) + gamma * lam * na

    return [
        torch.tensor(
            [[action(t, n, j) for j in range(r.shape[1])] for n in range(r.shape[0])]
        ).view(r.shape)
        for t, r in enumerate(rs)
    ]


@settings(max_examples=80, deadline=None)
@given(trees(), unit, unit)
def test_tree_gae_matches_a_recursive_reference(
    tree: tuple[list[torch.Tensor], ...], gamma: float, lam: float
) -> None:
    rs, vs, cs, ts = tree
    adv, targets = tree_gae(rs, vs, cs, ts, gamma, lam)
    want = _loop_tree_gae(rs, vs, cs, ts, gamma, lam)
    for t in range(len(rs)):
        torch.testing.assert_close(adv[t], want[t], **TOL)
        torch.testing.assert_close(targets[t], want[t] + vs[t], **TOL)


@settings(max_examples=60, deadline=None)
@given(trees(), unit)
def test_tree_gae_with_lambda_one_targets_the_tree_returns(
    tree: tuple[list[torch.Tensor], ...], gamma: float
) -> None:
    rs, vs, cs, ts = tree
    _, targets = tree_gae(rs, vs, cs, ts, gamma, 1.0)
    for got, want in zip(targets, tree_returns(rs, cs, ts, gamma), strict=True):
        torch.testing.assert_close(got, want, **TOL)


@settings(max_examples=60, deadline=None)
@given(trees(), unit)
def test_unheld_tree_gae_with_lambda_one_targets_the_unheld_tree_returns(
    tree: tuple[list[torch.Tensor], ...], gamma: float
) -> None:
    rs, vs, cs, ts = tree
    _, targets = tree_gae(rs, vs, cs, ts, gamma, 1.0, hold_terminal=False)
    unheld = tree_returns(rs, cs, ts, gamma, hold_terminal=False)
    for got, want in zip(targets, unheld, strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_tree_gae_holds_an_early_success_for_the_turns_it_skips() -> None:
    # issue 20's example with zero values: the first-turn success (1.0, ended) and the
    # sibling (0.2) fixed next turn (1.0): advantages [2.0, 1.2] at lam = 1, not [1.0, 1.2]
    rs = [torch.tensor([[1.0, 0.2]]), torch.tensor([[1.0, 1.0]])]
    vs = [torch.zeros(1, 2), torch.zeros(1, 2)]
    cs = [torch.tensor([[-1, 0]]), torch.full((1, 2), -1)]
    ts = [torch.tensor([[True, False]]), torch.ones(1, 2, dtype=torch.bool)]
    adv, _ = tree_gae(rs, vs, cs, ts, 1.0, 1.0)
    torch.testing.assert_close(adv[0], torch.tensor([[2.0, 1.2]]))
    # a tree cut short because every episode ended: held for the turn limit
    adv, _ = tree_gae(
        rs[:1],
        vs[:1],
        [torch.full((1, 2), -1)],
        [torch.ones(1, 2, dtype=torch.bool)],
        0.5,
        1.0,
        num_turns=3,
    )
    torch.testing.assert_close(adv[0], torch.tensor([[1.75, 0.35]]))
    with pytest.raises(ValueError, match="num_turns=1 but the tree has 2 turns"):
        tree_gae(rs, vs, cs, ts, 1.0, 1.0, num_turns=1)


def test_bad_inputs_are_rejected_with_the_reason() -> None:
    r, d = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="lam must be a number in"):
        gae(r, r, d, 0.9, 1.5)
    with pytest.raises(ValueError, match="values .* must have the shape"):
        gae(r, torch.zeros(2, 2), d, 0.9, 0.9)
    with pytest.raises(ValueError, match="bootstrap must be"):
        discounted_returns(r, d, 0.9, bootstrap=torch.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        gae(torch.full((2, 3), float("nan")), r, d, 0.9, 0.9)
    with pytest.raises(ValueError, match="last turn"):
        tree_gae([r], [r], [torch.zeros(2, 3, dtype=torch.int64)], [d], 1.0, 1.0)
    with pytest.raises(ValueError, match="clip_range needs old_values"):
        value_loss(r, r, clip_range=0.2)
    with pytest.raises(ValueError, match="clip_range must be"):
        value_loss(r, r, old_values=r, clip_range=-1.0)


def test_value_loss_by_hand_with_clipping() -> None:
    values = torch.tensor([1.0, 0.0, 2.0], requires_grad=True)
    old = torch.tensor([0.0, 0.0, 0.0])
    targets = torch.tensor([2.0, 1.0, 0.0])
    loss, metrics = value_loss(values, targets, old_values=old, clip_range=0.5)
    # entry 0: err (1-2)^2 = 1, clipped V = 0.5 -> (0.5-2)^2 = 2.25 -> 2.25 (no gradient to V)
    # entry 1: err 1, clipped V = 0 -> 1 -> max = 1 (gradient 2 * (0 - 1) = -2)
    # entry 2: err 4, clipped V = 0.5 -> 0.25 -> 4 (gradient 2 * 2 = 4)
    torch.testing.assert_close(loss, torch.tensor((2.25 + 1 + 4) / 3))
    loss.backward()
    assert values.grad is not None
    torch.testing.assert_close(values.grad, torch.tensor([0.0, -2.0, 4.0]) / 3)
    assert metrics["value_clip_fraction"] == pytest.approx(1 / 3)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(finite, finite, finite, st.booleans()), min_size=1, max_size=12),
    st.floats(0.01, 5),
)
def test_value_loss_matches_a_loop_and_masked_entries_get_no_gradient(
    rows: list[tuple[float, float, float, bool]], eps: float
) -> None:
    v = torch.tensor([r[0] for r in rows], requires_grad=True)
    target = torch.tensor([r[1] for r in rows])
    old = torch.tensor([r[2] for r in rows])
    mask = torch.tensor([r[3] for r in rows])
    loss, _ = value_loss(v, target, old_values=old, clip_range=eps, mask=mask)
    terms = []
    for vi, ti, oi, mi in rows:
        if mi:
            vi, ti, oi = float(torch.tensor(vi)), float(torch.tensor(ti)), float(torch.tensor(oi))
            vc = oi + min(max(vi - oi, -eps), eps)
            terms.append(max((vi - ti) ** 2, (vc - ti) ** 2))
    want = sum(terms) / len(terms) if terms else 0.0
    # Squares of numbers up to 20 in float32: absolute error grows with the value (~1e-4 at 400).
    torch.testing.assert_close(loss, torch.tensor(want, dtype=torch.float32), atol=1e-3, rtol=1e-5)
    loss.backward()
    assert v.grad is not None
    assert bool((v.grad[~mask] == 0).all())


def test_value_loss_explained_variance_is_one_for_a_perfect_critic() -> None:
    rng = random.Random(0)
    targets = torch.tensor([rng.uniform(-1, 1) for _ in range(16)])
    _, metrics = value_loss(targets.clone(), targets)
    assert metrics["explained_variance"] == pytest.approx(1.0)
    _, metrics = value_loss(torch.zeros(16), targets)
    assert metrics["explained_variance"] == pytest.approx(0.0, abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 5),
    k=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_q_advantages_subtract_an_action_independent_baseline(n: int, k: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, k, generator=gen)
    q = torch.randn(n, k, generator=gen)
    adv = q_advantages(g, q)
    want = torch.empty(n, k)
    for i in range(n):  # loop reference
        base = sum(float(q[i, j]) for j in range(k)) / k if k >= 2 else 0.0
        for j in range(k):
            want[i, j] = float(g[i, j]) - base
    # float32 mean of <= 6 values vs a float64 loop: round-off ~1e-7 on values of order 1.
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=1e-5)
    # The baseline does not depend on which action is scored: permuting the Q values of
    # a node's joint actions leaves every advantage unchanged.
    perm = torch.randperm(k, generator=gen)
    torch.testing.assert_close(q_advantages(g, q[:, perm]), adv, atol=1e-6, rtol=1e-6)


def test_q_advantages_keep_the_signal_that_gae_on_q_cancels() -> None:
    """A two-armed bandit with an exact critic (Q = the deterministic return): GAE with Q
    as the value gives zero advantages (no learning signal); q_advantages favours the
    better arm."""
    g = torch.tensor([[1.0, 0.0, 1.0, 0.0]])  # arms 1, 0, 1, 0 of one node
    q = g.clone()
    zero = torch.zeros_like(g)
    advs, targets = tree_gae(
        [g], [q], [torch.full_like(g, -1, dtype=torch.long)], [torch.ones_like(g)], 1.0, 1.0
    )
    assert bool((advs[0] == zero).all())
    adv = q_advantages(targets[0], q)
    assert adv.tolist() == [[0.5, -0.5, 0.5, -0.5]]
    with pytest.raises(ValueError, match="must both be"):
        q_advantages(g, q[:, :2])
