"""tree_returns: discounted returns down a rollout tree, against a hand-computed tree and a
slow recursive reference."""

from __future__ import annotations

import pytest
import torch
from comlrl.estimators.returns import tree_returns
from hypothesis import given, settings
from hypothesis import strategies as st

# Tolerance: float32 sums of at most a few dozen terms of magnitude <= 10 (round-off
# ~1e-6 relative); the reference runs in float64.
TOL = dict(atol=1e-5, rtol=1e-5)


def test_a_hand_computed_tree_with_discount_termination_and_pruning() -> None:
    # Turn 0: one node, two joint actions, both expanded.
    # Turn 1: node 0 (from j0): j0 ends the episode (done), j1 expanded;
    #         node 1 (from j1): j0 pruned by the branching limit, j1 expanded.
    # Turn 2: two leaves. gamma = 0.5.
    rewards = [
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[0.5, 1.0], [0.0, 0.2]]),
        torch.tensor([[1.0, 0.0], [0.4, 0.6]]),
    ]
    child = [torch.tensor([[0, 1]]), torch.tensor([[-1, 0], [-1, 1]]), torch.full((2, 2), -1)]
    terminal = [
        torch.tensor([[False, False]]),
        torch.tensor([[True, False], [False, False]]),
        torch.ones(2, 2, dtype=torch.bool),
    ]
    got = tree_returns(rewards, child, terminal, gamma=0.5)
    # leaves: V = 0.5 and 0.5
    torch.testing.assert_close(got[2], rewards[2])
    # node 0: 0.5 ends at turn 1 of 3, held for the skipped turn: 0.5 * (1 + 0.5) = 0.75;
    #         1.0 + 0.5 * 0.5 = 1.25 -> V = 1.0
    # node 1: pruned 0.0 + 0.5 * 0.5 (its expanded sibling's future) = 0.25; 0.2 + 0.25 = 0.45 -> V = 0.35
    torch.testing.assert_close(got[1], torch.tensor([[0.75, 1.25], [0.25, 0.45]]))
    # root: 1 + 0.5 * 1.0 = 1.5; 0 + 0.5 * 0.35 = 0.175
    torch.testing.assert_close(got[0], torch.tensor([[1.5, 0.175]]))


def test_an_early_success_is_not_pushed_below_a_sibling_fixed_next_turn() -> None:
    # Issue 20's example: two turns, G = 2. Joint action 0 succeeds at once (1.0) and ends
    # the episode; joint action 1 scores 0.2 and is fixed next turn (1.0 for both of its
    # children). Without holding, returns were [1.0, 1.2] and the success had GRPO
    # advantage -1. Held for the turn it skips: [2.0, 1.2], advantage +1.
    from comlrl.estimators.advantages import compute_advantages

    rewards = [torch.tensor([[1.0, 0.2]]), torch.tensor([[1.0, 1.0]])]
    child = [torch.tensor([[-1, 0]]), torch.full((1, 2), -1)]
    terminal = [torch.tensor([[True, False]]), torch.ones(1, 2, dtype=torch.bool)]
    got = tree_returns(rewards, child, terminal, gamma=1.0)
    torch.testing.assert_close(got[0], torch.tensor([[2.0, 1.2]]))
    assert compute_advantages(got[0], estimator="grpo")[0, 0].item() >= 0
    for gamma in (0.5, 0.9, 1.0):  # held under discount: 1 + gamma >= 0.2 + gamma * 1.0
        got = tree_returns(rewards, child, terminal, gamma=gamma)
        torch.testing.assert_close(got[0], torch.tensor([[1.0 + gamma, 0.2 + gamma]]))
        for name in ("grpo", "rloo", "remax", "reinforce"):
            adv = compute_advantages(got[0], estimator=name)[0]
            assert adv[0].item() >= adv[1].item(), (gamma, name)


def test_a_tree_that_stopped_early_holds_its_rewards_for_the_turn_limit() -> None:
    # every episode ended at turn 0 of a 3-turn limit: the tree has one turn
    rewards = [torch.tensor([[1.0, 0.5]])]
    child = [torch.full((1, 2), -1)]
    terminal = [torch.ones(1, 2, dtype=torch.bool)]
    got = tree_returns(rewards, child, terminal, gamma=0.5, num_turns=3)
    torch.testing.assert_close(got[0], torch.tensor([[1.75, 0.875]]))
    torch.testing.assert_close(tree_returns(rewards, child, terminal, 0.5)[0], rewards[0])
    with pytest.raises(ValueError, match="num_turns=0 but the tree has 1 turns"):
        tree_returns(rewards, child, terminal, num_turns=0)


def test_gamma_zero_gives_the_rewards_and_gamma_one_the_undiscounted_sum() -> None:
    rewards = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 5.0], [7.0, 9.0]])]
    child = [torch.tensor([[0, 1]]), torch.full((2, 2), -1)]
    terminal = [torch.zeros(1, 2, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool)]
    torch.testing.assert_close(tree_returns(rewards, child, terminal, 0.0)[0], rewards[0])
    torch.testing.assert_close(
        tree_returns(rewards, child, terminal, 1.0)[0], torch.tensor([[5.0, 10.0]])
    )


def test_bad_trees_are_rejected_with_the_reason() -> None:
    r = [torch.zeros(1, 2)]
    with pytest.raises(ValueError, match="gamma must be in"):
        tree_returns(r, [torch.full((1, 2), -1)], [torch.ones(1, 2, dtype=torch.bool)], 1.5)
    with pytest.raises(ValueError, match="last turn"):
        tree_returns(r, [torch.tensor([[0, -1]])], [torch.zeros(1, 2, dtype=torch.bool)])
    with pytest.raises(ValueError, match="terminal and expanded"):
        tree_returns(
            [torch.zeros(1, 2), torch.zeros(1, 2)],
            [torch.tensor([[0, -1]]), torch.full((1, 2), -1)],
            [torch.tensor([[True, False]]), torch.ones(1, 2, dtype=torch.bool)],
        )
    with pytest.raises(ValueError, match="finite"):
        tree_returns(
            [torch.tensor([[float("nan"), 0.0]])],
            [torch.full((1, 2), -1)],
            [torch.ones(1, 2, dtype=torch.bool)],
        )
    with pytest.raises(ValueError, match="one tensor per turn"):
        tree_returns(r, [], [])


def _reference(rewards, child, terminal, gamma, hold=True):  # type: ignore[no-untyped-def]
    """Slow recursion over nodes, in float64 Python numbers (``hold=False``: a terminal
    joint action's return is its reward, CoMLRL 1.4.3's ``compute_returns``)."""
    memo: dict[tuple[int, int], float] = {}

    def value(t: int, n: int) -> float:
        if (t, n) not in memo:
            k = len(rewards[t][n])
            memo[(t, n)] = sum(ret(t, n, j) for j in range(k)) / k
        return memo[(t, n)]

    def ret(t: int, n: int, j: int) -> float:
        r = float(rewards[t][n][j])
        c = int(child[t][n][j])
        if c >= 0:
            return r + gamma * value(t + 1, c)
        if terminal[t][n][j]:  # held for the turns the episode skips
            return r * sum(gamma**i for i in range(len(rewards) - t)) if hold else r
        futures = [value(t + 1, int(c2)) for c2 in child[t][n] if int(c2) >= 0]
        return r + gamma * (sum(futures) / len(futures) if futures else 0.0)

    return [
        [[ret(t, n, j) for j in range(len(rewards[t][n]))] for n in range(len(rewards[t]))]
        for t in range(len(rewards))
    ]


@st.composite
def trees(draw):  # type: ignore[no-untyped-def]
    num_turns = draw(st.integers(1, 4))
    k = draw(st.integers(1, 3))
    nodes = draw(st.integers(1, 3))
    rewards, child, terminal = [], [], []
    for t in range(num_turns):
        last = t == num_turns - 1
        r = draw(
            st.lists(
                st.lists(st.floats(-5, 5, allow_nan=False), min_size=k, max_size=k),
                min_size=nodes,
                max_size=nodes,
            )
        )
        states = [
            [
                ("terminal" if last else draw(st.sampled_from(["terminal", "expanded", "pruned"])))
                for _ in range(k)
            ]
            for _ in range(nodes)
        ]
        c, next_nodes = [], 0
        for row in states:
            c.append([])
            for s in row:
                if s == "expanded":
                    c[-1].append(next_nodes)
                    next_nodes += 1
                else:
                    c[-1].append(-1)
        rewards.append(torch.tensor(r, dtype=torch.float32))
        child.append(torch.tensor(c, dtype=torch.int64))
        terminal.append(torch.tensor([[s == "terminal" for s in row] for row in states]))
        if next_nodes == 0:
            if not last:  # the tree ends here: nothing was expanded
                break
        nodes = next_nodes
    gamma = draw(st.floats(0, 1))
    return rewards, child, terminal, gamma


@settings(max_examples=200, deadline=None)
@given(trees())
def test_tree_returns_equal_a_slow_recursive_reference(tree) -> None:  # type: ignore[no-untyped-def]
    rewards, child, terminal, gamma = tree
    got = tree_returns(rewards, child, terminal, gamma)
    want = _reference(rewards, child, terminal, gamma)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, torch.tensor(w, dtype=torch.float32), **TOL)


@settings(max_examples=200, deadline=None)
@given(trees())
def test_unheld_returns_count_an_early_end_once(tree) -> None:  # type: ignore[no-untyped-def]
    """hold_terminal=False: a terminal joint action's return is its reward, the rest as
    before; with gamma = 1 on a full tree this is CoMLRL 1.4.3's undiscounted return."""
    rewards, child, terminal, gamma = tree
    got = tree_returns(rewards, child, terminal, gamma, hold_terminal=False)
    want = _reference(rewards, child, terminal, gamma, hold=False)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, torch.tensor(w, dtype=torch.float32), **TOL)


def test_an_early_end_counted_once_is_the_plain_sum_of_1_4_3() -> None:
    # the example above, unheld: the first-turn success keeps 1.0, below the sibling fixed
    # next turn (0.2 + 1.0): what CoMLRL 1.4.3 trains on
    rewards = [torch.tensor([[1.0, 0.2]]), torch.tensor([[1.0]])]
    child = [torch.tensor([[-1, 0]]), torch.tensor([[-1]])]
    terminal = [torch.tensor([[True, False]]), torch.tensor([[True]])]
    got = tree_returns(rewards, child, terminal, 1.0, hold_terminal=False)
    torch.testing.assert_close(got[0], torch.tensor([[1.0, 1.2]]))
