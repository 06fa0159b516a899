"""Agent-wise and global advantages of a multi-agent batch, and AT-GRPO's agent x turn groups,
against loop references, with their properties."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from comlrl.estimators.advantages import Scale, compute_advantages, std_from_moments
from comlrl.estimators.agentwise import (
    STATS,
    Stats,
    agent_return_moments,
    agent_turn_group_ids,
    agentwise_advantages,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

NAMES = ("reinforce", "grpo", "rloo", "remax")
SCALES: tuple[Scale, ...] = ("none", "group", "batch")
EPS = 1e-6
# float64 inputs; the loop reference differs only by summation order.
TOL: dict[str, Any] = {"rtol": 1e-9, "atol": 1e-9}
PROPS = settings(max_examples=40, deadline=None)


def _pstd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def loop_reference(
    returns: list[float],
    agents: list[int],
    groups: list[int],
    estimator: str,
    scale: Scale,
    stats: str,
    eps: float = EPS,
) -> list[float]:
    """Slow, obviously-correct advantages: Python loops over pools, groups and samples."""

    def pool_of(i: int) -> tuple[int, ...]:  # whose returns sample i is compared with
        return (agents[i],) if stats == "agent" else ()

    out = [0.0] * len(returns)
    for i, r in enumerate(returns):
        members = [
            j for j in range(len(returns)) if groups[j] == groups[i] and pool_of(j) == pool_of(i)
        ]
        others = [returns[j] for j in members if j != i]
        values = [returns[j] for j in members]
        if estimator == "reinforce":
            b = 0.0
        elif estimator == "grpo":
            b = sum(values) / len(values)
        elif estimator == "rloo":
            b = sum(others) / len(others) if others else r
        else:  # remax: the best of the other samples
            b = max(others) if others else r
        if scale == "group":
            s = _pstd(values) + eps
        elif scale == "batch":
            batch = [returns[j] for j in range(len(returns)) if pool_of(j) == pool_of(i)]
            s = _pstd(batch) + eps
        else:
            s = 1.0
        out[i] = (r - b) / s
    return out


reward = st.integers(-20, 20).map(lambda x: x / 4)


@st.composite
def multi_agent_batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat returns with an agent (0..A-1) and a group label each, in any order; groups of
    any size, agents of any number of samples per group (one included)."""
    m = draw(st.integers(1, 14))
    agents = draw(st.lists(st.integers(0, 2), min_size=m, max_size=m))
    groups = draw(st.lists(st.integers(-3, 3), min_size=m, max_size=m))
    values = draw(st.lists(reward, min_size=m, max_size=m))
    return (
        torch.tensor(values, dtype=torch.float64),
        torch.tensor(agents),
        torch.tensor(groups),
    )


@st.composite
def batches_with_a_varying_group(
    draw: st.DrawFn,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`multi_agent_batches` after 3 to 6 samples of agent 0 in group 0 (first)."""
    first = draw(st.lists(reward, min_size=3, max_size=6))
    returns, agents, groups = draw(multi_agent_batches())
    n = len(first)
    return (
        torch.cat([torch.tensor(first, dtype=torch.float64), returns]),
        torch.cat([torch.zeros(n, dtype=torch.long), agents]),
        torch.cat([torch.zeros(n, dtype=torch.long), groups]),
    )


# --- agreement with the loop reference ---------------------------------------------


@PROPS
@given(
    data=multi_agent_batches(),
    name=st.sampled_from(NAMES),
    scale=st.sampled_from(SCALES),
    stats=st.sampled_from(STATS),
)
def test_agentwise_advantages_match_loop_reference(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], name: str, scale: Scale, stats: Stats
) -> None:
    returns, agents, groups = data
    got = agentwise_advantages(returns, agents, groups, estimator=name, scale=scale, stats=stats)
    want = loop_reference(returns.tolist(), agents.tolist(), groups.tolist(), name, scale, stats)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), **TOL)


@PROPS
@given(data=multi_agent_batches(), name=st.sampled_from(NAMES), scale=st.sampled_from(SCALES))
def test_agent_stats_equal_compute_advantages_on_each_agent_alone(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], name: str, scale: Scale
) -> None:
    # what the group-baseline recipe did before: one compute_advantages call per agent
    returns, agents, groups = data
    got = agentwise_advantages(returns, agents, groups, estimator=name, scale=scale)
    for k in agents.unique():
        own = agents == k
        alone = compute_advantages(returns[own], estimator=name, group_ids=groups[own], scale=scale)
        torch.testing.assert_close(got[own], alone, **TOL)


@PROPS
@given(data=multi_agent_batches(), name=st.sampled_from(NAMES), scale=st.sampled_from(SCALES))
def test_global_stats_equal_compute_advantages_on_the_pooled_batch(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], name: str, scale: Scale
) -> None:
    returns, agents, groups = data
    got = agentwise_advantages(returns, agents, groups, estimator=name, scale=scale, stats="global")
    pooled = compute_advantages(returns, estimator=name, group_ids=groups, scale=scale)
    torch.testing.assert_close(got, pooled, **TOL)


# --- what agent-wise normalization is for (Dr. MAS) -----------------------------------


@PROPS
@given(
    data=multi_agent_batches(),
    name=st.sampled_from(("grpo", "rloo", "remax")),
    scale=st.sampled_from(("group", "batch")),
    factor=st.sampled_from((0.1, 3.0, 100.0)),
    shift=reward,
)
def test_agent_stats_ignore_the_scale_and_offset_of_another_agents_rewards(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    name: str,
    scale: Scale,
    factor: float,
    shift: float,
) -> None:
    # Rewriting agent 1's rewards as factor * r + shift changes nothing for the others and
    # only by eps's share for agent 1 itself (eps = 1e-12 here: float64 round-off only).
    returns, agents, groups = data
    moved = torch.where(agents == 1, factor * returns + shift, returns)
    before = agentwise_advantages(returns, agents, groups, estimator=name, scale=scale, eps=1e-12)
    after = agentwise_advantages(moved, agents, groups, estimator=name, scale=scale, eps=1e-12)
    torch.testing.assert_close(after, before, rtol=1e-7, atol=1e-7)


def test_global_stats_shrink_the_agent_whose_rewards_vary_less() -> None:
    # Two agents in one group around the same mean, agent 1's rewards ten times agent 0's
    # range. Globally, agent 0's advantages are divided by a std that agent 1 sets: ten
    # times smaller than agent 1's. Agent-wise, both are +-1 (up to eps).
    signs = torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    returns = torch.cat([0.5 + 0.1 * signs, 0.5 + signs])
    agents = torch.tensor([0] * 4 + [1] * 4)
    groups = torch.zeros(8, dtype=torch.long)
    own = agentwise_advantages(returns, agents, groups, stats="agent")
    pooled = agentwise_advantages(returns, agents, groups, stats="global")
    torch.testing.assert_close(own, torch.cat([signs, signs]), rtol=1e-4, atol=0)
    ratio = pooled[4:].abs().mean() / pooled[:4].abs().mean()
    torch.testing.assert_close(ratio, torch.tensor(10.0, dtype=torch.float64), rtol=1e-6, atol=0)


def test_global_stats_give_an_agent_below_the_team_mean_only_negative_advantages() -> None:
    # Agent 1's rewards sit 5 above agent 0's: against the pooled mean every completion of
    # agent 0 looks bad, its better ones included; against its own mean, half are good.
    part = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    returns = torch.cat([part, part + 5])
    agents = torch.tensor([0] * 4 + [1] * 4)
    groups = torch.zeros(8, dtype=torch.long)
    pooled = agentwise_advantages(returns, agents, groups, stats="global")
    own = agentwise_advantages(returns, agents, groups, stats="agent")
    assert bool((pooled[:4] < 0).all()) and bool((pooled[4:] > 0).all())
    assert (own[:4] > 0).sum().item() == 2 and (own[4:] > 0).sum().item() == 2


def test_identical_returns_make_agent_and_global_grpo_agree() -> None:
    # One joint return credited to every agent of an aligned joint action: the same numbers
    # for both agents, so pooling them changes neither the group mean nor its population std.
    joint = torch.tensor([0.0, 1.0, 3.0, 0.5, 2.0, 2.0], dtype=torch.float64)
    returns = joint.repeat(2)
    agents = torch.tensor([0] * 6 + [1] * 6)
    groups = torch.tensor([0, 0, 0, 1, 1, 1] * 2)
    scales: tuple[Scale, ...] = ("none", "batch")
    for name, scale in itertools.product(("grpo", "reinforce"), scales):
        own = agentwise_advantages(returns, agents, groups, estimator=name, scale=scale)
        pooled = agentwise_advantages(
            returns, agents, groups, estimator=name, scale=scale, stats="global"
        )
        torch.testing.assert_close(own, pooled, **TOL)
    own = agentwise_advantages(returns, agents, groups, estimator="grpo", scale="group")
    pooled = agentwise_advantages(returns, agents, groups, scale="group", stats="global")
    torch.testing.assert_close(own, pooled, **TOL)
    # leave-one-out baselines see the teammate's copy of the return when pooled
    own = agentwise_advantages(returns, agents, groups, estimator="rloo")
    pooled = agentwise_advantages(returns, agents, groups, estimator="rloo", stats="global")
    assert not torch.allclose(own, pooled)


# --- the trap: z-scoring must not merge the estimators -------------------------------


@PROPS
@given(
    data=batches_with_a_varying_group(),
    scale=st.sampled_from(SCALES),
    stats=st.sampled_from(STATS),
)
def test_estimators_stay_distinct_under_both_pools_and_every_scale(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], scale: Scale, stats: Stats
) -> None:
    returns, agents, groups = data
    # a pool-group of 3+ varying samples whose mean and max are non-zero (as in
    # test_advantages: else two definitions coincide on it)
    first = (groups == groups[0]) & ((agents == agents[0]) if stats == "agent" else True)
    group = returns[first]
    assume(group.numel() >= 3 and _pstd(group.tolist()) > 0)
    assume(group.mean().abs() > 1e-3 and group.max().abs() > 1e-3)
    results = {
        n: agentwise_advantages(returns, agents, groups, estimator=n, scale=scale, stats=stats)
        for n in NAMES
    }
    for x, y in itertools.combinations(NAMES, 2):
        assert not torch.allclose(results[x], results[y], rtol=1e-6, atol=1e-9), (x, y)


def test_agent_normalization_keeps_rloo_a_multiple_of_grpo_not_equal_to_it() -> None:
    # Dividing by the std of the returns keeps A_rloo = G / (G - 1) * A_grpo per agent;
    # dividing by the std of the advantages would have made the two identical.
    returns = torch.tensor([1.0, 0.0, 0.0, 0.5, 4.0, 0.0, 2.0, 2.0], dtype=torch.float64)
    agents = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    groups = torch.zeros(8, dtype=torch.long)
    scales: tuple[Scale, ...] = ("group", "batch")
    for scale in scales:
        grpo = agentwise_advantages(returns, agents, groups, estimator="grpo", scale=scale)
        rloo = agentwise_advantages(returns, agents, groups, estimator="rloo", scale=scale)
        torch.testing.assert_close(rloo, 4 / 3 * grpo, **TOL)
        assert not torch.allclose(rloo, grpo)


# --- edge cases ----------------------------------------------------------------------


@pytest.mark.parametrize("stats", STATS)
@pytest.mark.parametrize("scale", SCALES)
def test_singletons_and_all_equal_groups_give_zero_for_baselined_estimators(
    scale: Scale, stats: Stats
) -> None:
    returns = torch.tensor([3.0, 2.0, 2.0, 5.0, 1.0], dtype=torch.float64)
    agents = torch.tensor([0, 1, 1, 0, 0])
    groups = torch.tensor([7, 8, 8, 9, 9])  # a singleton, an all-equal pair, a varying pair
    for name in ("grpo", "rloo", "remax"):
        a = agentwise_advantages(returns, agents, groups, estimator=name, scale=scale, stats=stats)
        assert a[:3].tolist() == [0.0, 0.0, 0.0], (name, a)
        assert bool((a[3:] != 0).all())


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_returns_raise_naming_the_index(bad: float) -> None:
    returns = torch.zeros(5)
    returns[3] = bad
    ids = torch.zeros(5, dtype=torch.long)
    for stats in ("agent", "global"):
        with pytest.raises(ValueError, match=r"returns\[3\]"):
            agentwise_advantages(returns, ids, ids, stats=stats, scale="batch")


def test_empty_batch_gives_empty_advantages() -> None:
    empty = torch.zeros(0, dtype=torch.long)
    for stats in ("agent", "global"):
        assert agentwise_advantages(torch.zeros(0), empty, empty, stats=stats).shape == (0,)


def test_output_dtype_follows_compute_advantages() -> None:
    ids = torch.tensor([0, 0, 1, 1])
    assert agentwise_advantages(torch.ones(4, dtype=torch.float64), ids, ids).dtype == torch.float64
    out = agentwise_advantages(
        torch.tensor([1.0, 0.0, 2.0, 3.0]).bfloat16(), ids, ids, scale="batch"
    )
    assert out.dtype == torch.float32


def test_bad_arguments_name_the_value_and_the_choices() -> None:
    r, ids = torch.zeros(4), torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match=r"unknown stats 'team'; use one of \['agent', 'global'\]"):
        agentwise_advantages(r, ids, ids, stats="team")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown scale 'std'; use one of"):
        agentwise_advantages(r, ids, ids, scale="std")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown estimator 'ppo'"):
        agentwise_advantages(r, ids, ids, estimator="ppo")
    with pytest.raises(ValueError, match="eps must be > 0"):
        agentwise_advantages(r, ids, ids, eps=0.0)
    with pytest.raises(ValueError, match=r"agent_ids must have shape \[M\] = \[4\]"):
        agentwise_advantages(r, ids[:3], ids)
    with pytest.raises(ValueError, match="group_ids must be an integer tensor"):
        agentwise_advantages(r, ids, ids.float())
    with pytest.raises(ValueError, match="agent_ids must be >= 0"):
        agentwise_advantages(r, ids - 1, ids)
    with pytest.raises(ValueError, match=r"agent_ids go up to 1 but num_agents=1"):
        agentwise_advantages(r, ids, ids, num_agents=1)
    with pytest.raises(ValueError, match=r"returns must be flat \[M\]"):
        agentwise_advantages(r.reshape(2, 2), ids, ids)
    with pytest.raises(ValueError, match="batch_std is the divisor of scale='batch'"):
        agentwise_advantages(r, ids, ids, batch_std=torch.ones(2))
    with pytest.raises(ValueError, match=r"batch_std must be \[A\] = \[2\]"):
        agentwise_advantages(r, ids, ids, scale="batch", batch_std=torch.ones(3))
    with pytest.raises(ValueError, match="batch_std must be finite and >= 0"):
        agentwise_advantages(r, ids, ids, scale="batch", batch_std=torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="unknown stats 'x'"):
        agent_return_moments(r, ids, stats="x")  # type: ignore[arg-type]


# --- data parallel: per-agent moments ------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    shards=st.lists(multi_agent_batches(), min_size=1, max_size=3),
    stats=st.sampled_from(STATS),
    name=st.sampled_from(NAMES),
)
def test_summed_shard_moments_give_each_shard_the_whole_batchs_advantages(
    shards: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], stats: Stats, name: str
) -> None:
    # Groups stay within a shard (a prompt's tree lives on one rank): offset the labels.
    shards = [(r, a, g + 100 * i) for i, (r, a, g) in enumerate(shards)]
    whole = [torch.cat(parts) for parts in zip(*shards, strict=True)]
    total = sum(agent_return_moments(r, a, 3, stats=stats) for r, a, _ in shards)
    assert isinstance(total, torch.Tensor)
    stds = torch.tensor([std_from_moments(row) for row in total], dtype=torch.float64)
    want = agentwise_advantages(*whole, num_agents=3, estimator=name, scale="batch", stats=stats)
    got = torch.cat(
        [
            agentwise_advantages(
                r, a, g, num_agents=3, estimator=name, scale="batch", stats=stats, batch_std=stds
            )
            for r, a, g in shards
        ]
    )
    # moments (float64 sums) against two-pass stds: 1e-9 relative at |r| <= 5
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_agent_moments_rows_are_each_agents_or_the_whole_batchs() -> None:
    returns = torch.tensor([1.0, 2.0, 4.0, -1.0])
    agents = torch.tensor([0, 1, 1, 0])
    own = agent_return_moments(returns, agents)
    torch.testing.assert_close(
        own, torch.tensor([[2.0, 0.0, 2.0], [2.0, 6.0, 20.0]], dtype=torch.float64)
    )
    pooled = agent_return_moments(returns, agents, 3, stats="global")
    torch.testing.assert_close(pooled, torch.tensor([[4.0, 6.0, 22.0]] * 3, dtype=torch.float64))


# --- AT-GRPO's agent x turn groups ---------------------------------------------------


@PROPS
@given(
    rows=st.lists(
        st.tuples(st.integers(-3, 3), st.integers(0, 2), st.integers(0, 2)), min_size=0, max_size=20
    )
)
def test_agent_turn_groups_match_a_dict_of_keys(rows: list[tuple[int, int, int]]) -> None:
    example, turn, agent = (torch.tensor([r[i] for r in rows], dtype=torch.long) for i in range(3))
    got = agent_turn_group_ids(example, turn, agent).tolist()
    labels = {key: n for n, key in enumerate(sorted(set(rows)))}
    assert got == [labels[row] for row in rows]


def test_agent_turn_groups_pool_the_branches_of_one_turn() -> None:
    # Example 0's tree at turn 1 has two nodes (branches); AT-GRPO puts agent 0's
    # completions at both in one group, apart from agent 1's and from turn 0's.
    example = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])
    turn = torch.tensor([1, 1, 1, 1, 0, 0, 1, 1])
    agent = torch.tensor([0, 0, 0, 1, 0, 0, 0, 0])  # first two: node A, next two: node B
    ids = agent_turn_group_ids(example, turn, agent)
    assert ids[0] == ids[1] == ids[2] and len(set(ids.tolist())) == 4
    returns = torch.tensor([1.0, 0.0, 2.0, 5.0, 0.0, 1.0, 3.0, 1.0], dtype=torch.float64)
    adv = agentwise_advantages(returns, agent, ids, estimator="grpo", scale="none")
    torch.testing.assert_close(adv[:3], torch.tensor([0.0, -1.0, 1.0], dtype=torch.float64))


def test_agent_turn_group_errors_name_the_argument() -> None:
    ids = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="turn_ids must be an integer tensor"):
        agent_turn_group_ids(ids, ids.float(), ids)
    with pytest.raises(ValueError, match=r"agent_ids must have shape \[M\] = \[3\]"):
        agent_turn_group_ids(ids, ids, ids[:2])
    with pytest.raises(ValueError, match=r"example_ids must be 1-D"):
        agent_turn_group_ids(ids.reshape(1, 3), ids, ids)
