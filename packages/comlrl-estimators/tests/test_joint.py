"""Joint-action indices and crediting joint returns back to completions."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from comlrl.estimators.advantages import compute_advantages
from comlrl.estimators.joint import (
    MAX_CROSS_JOINT_ACTIONS,
    credit_completions,
    joint_action_indices,
)
from hypothesis import given, settings
from hypothesis import strategies as st

PROPS = settings(max_examples=40, deadline=None)
TOL: dict[str, Any] = {"rtol": 1e-12, "atol": 1e-12}


def loop_credit(joint_returns: torch.Tensor, joint_index: torch.Tensor, g: int) -> torch.Tensor:
    """Reference: for each agent, prompt and completion, average the joint returns."""
    p, k = joint_returns.shape
    a_count = joint_index.shape[1]
    out = torch.zeros(a_count, p, g, dtype=joint_returns.dtype)
    for a in range(a_count):
        for prompt in range(p):
            for c in range(g):
                members = [
                    joint_returns[prompt, j].item() for j in range(k) if joint_index[j, a] == c
                ]
                out[a, prompt, c] = sum(members) / len(members)
    return out


@pytest.mark.parametrize("num_agents,group_size", [(1, 1), (1, 4), (2, 3), (3, 2), (4, 3)])
def test_align_pairs_the_gth_completion_of_every_agent(num_agents: int, group_size: int) -> None:
    idx = joint_action_indices(num_agents, group_size, "align")
    assert idx.dtype == torch.int64 and idx.shape == (group_size, num_agents)
    for k in range(group_size):
        assert idx[k].tolist() == [k] * num_agents


@pytest.mark.parametrize("num_agents,group_size", [(1, 1), (1, 5), (2, 3), (3, 2), (3, 4), (5, 2)])
def test_cross_is_the_cartesian_product_in_itertools_order(
    num_agents: int, group_size: int
) -> None:
    idx = joint_action_indices(num_agents, group_size, "cross")
    want = list(itertools.product(range(group_size), repeat=num_agents))
    assert idx.dtype == torch.int64
    assert [tuple(row) for row in idx.tolist()] == want


def test_cross_refuses_more_than_the_limit_and_points_to_align() -> None:
    assert 4**6 == MAX_CROSS_JOINT_ACTIONS
    assert joint_action_indices(6, 4, "cross").shape == (4096, 6)
    with pytest.raises(ValueError, match=r"2\*\*13 = 8192.*mode='align'"):
        joint_action_indices(13, 2, "cross")


def test_bad_mode_and_sizes_are_rejected_with_the_value() -> None:
    with pytest.raises(ValueError, match=r"unknown joint mode 'product'.*'align', 'cross'"):
        joint_action_indices(2, 2, "product")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_agents must be a positive integer, got 0"):
        joint_action_indices(0, 2, "align")
    with pytest.raises(ValueError, match="group_size must be a positive integer, got 2.0"):
        joint_action_indices(2, 2.0, "cross")  # type: ignore[arg-type]


def test_align_credit_copies_the_joint_returns_to_every_agent() -> None:
    joint_returns = torch.randn(3, 4, dtype=torch.float64)
    out = credit_completions(joint_returns, joint_action_indices(3, 4, "align"), 4)
    assert out.shape == (3, 3, 4)
    for a in range(3):
        torch.testing.assert_close(out[a], joint_returns, rtol=0, atol=0)


@PROPS
@given(
    num_agents=st.integers(1, 3),
    group_size=st.integers(1, 4),
    num_prompts=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_cross_credit_matches_loop_reference(
    num_agents: int, group_size: int, num_prompts: int, seed: int
) -> None:
    idx = joint_action_indices(num_agents, group_size, "cross")
    gen = torch.Generator().manual_seed(seed)
    joint_returns = torch.randn(num_prompts, idx.shape[0], generator=gen, dtype=torch.float64)
    got = credit_completions(joint_returns, idx, group_size)
    torch.testing.assert_close(got, loop_credit(joint_returns, idx, group_size), **TOL)


@PROPS
@given(data=st.data(), num_agents=st.integers(1, 3), group_size=st.integers(1, 4))
def test_credit_of_any_covering_index_matches_loop_reference(
    data: st.DataObject, num_agents: int, group_size: int
) -> None:
    extra = data.draw(st.integers(0, 5))
    rows = [[g] * num_agents for g in range(group_size)]  # every completion appears
    rows += [
        data.draw(
            st.lists(st.integers(0, group_size - 1), min_size=num_agents, max_size=num_agents)
        )
        for _ in range(extra)
    ]
    rows = data.draw(st.permutations(rows))
    idx = torch.tensor(rows)
    joint_returns = torch.arange(2 * len(rows), dtype=torch.float64).reshape(2, -1) ** 1.5
    got = credit_completions(joint_returns, idx, group_size)
    torch.testing.assert_close(got, loop_credit(joint_returns, idx, group_size), **TOL)


def test_cross_credit_gradient_weights_each_joint_action_by_a_over_g_to_a_minus_one() -> None:
    a, g = 3, 2
    joint_returns = torch.randn(2, g**a, requires_grad=True)
    credit_completions(joint_returns, joint_action_indices(a, g, "cross"), g).sum().backward()
    assert joint_returns.grad is not None
    torch.testing.assert_close(joint_returns.grad, torch.full((2, g**a), a / g ** (a - 1)))


def test_two_agent_cross_credit_by_hand() -> None:
    # Agent 0 picks the row, agent 1 the column of a 2x2 payoff per prompt.
    joint_returns = torch.tensor([[1.0, 0.0, 0.0, 3.0]])
    out = credit_completions(joint_returns, joint_action_indices(2, 2, "cross"), 2)
    torch.testing.assert_close(out[0, 0], torch.tensor([0.5, 1.5]))
    torch.testing.assert_close(out[1, 0], torch.tensor([0.5, 1.5]))
    adv = compute_advantages(out[0], estimator="grpo", scale="none")
    torch.testing.assert_close(adv, torch.tensor([[-0.5, 0.5]]))
    # GRPO's own convention divides by the group std (0.5 here)
    torch.testing.assert_close(
        compute_advantages(out[0], estimator="grpo"), torch.tensor([[-1.0, 1.0]]), atol=1e-5, rtol=0
    )


def test_credit_rejects_bad_inputs_with_the_reason() -> None:
    idx = joint_action_indices(2, 2, "cross")
    with pytest.raises(ValueError, match="K = 3 joint actions but joint_index has 4 rows"):
        credit_completions(torch.zeros(1, 3), idx, 2)
    with pytest.raises(ValueError, match=r"values must lie in \[0, 2\)"):
        credit_completions(torch.zeros(1, 4), idx + 1, 2)
    with pytest.raises(ValueError, match="completion 1 of agent 1 is in no joint action"):
        credit_completions(torch.zeros(1, 2), torch.tensor([[0, 0], [1, 0]]), 2)
    with pytest.raises(ValueError, match=r"joint_returns must be \[P, K\]"):
        credit_completions(torch.zeros(4), idx, 2)
    with pytest.raises(ValueError, match="floating point"):
        credit_completions(torch.zeros(1, 4, dtype=torch.long), idx, 2)
