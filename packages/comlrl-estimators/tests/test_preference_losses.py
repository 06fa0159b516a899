"""DPO, multi-agent DPO, Bradley-Terry and SFT losses; reward-gap pairing.

Tolerances: the hand-computed values are exact in float64 up to rounding of a few
transcendental calls, so 1e-12 absolute; float32 paths use 1e-6 (a few ulps of O(1)
values).
"""

from __future__ import annotations

import math

import pytest
import torch
from comlrl.estimators.preference_losses import (
    bradley_terry_loss,
    dpo_loss,
    multi_agent_dpo_loss,
    select_preference_pairs,
    sft_nll,
)
from hypothesis import given, settings
from hypothesis import strategies as st

F64 = dict(dtype=torch.float64)


def _t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, **F64)


def test_dpo_loss_matches_a_hand_computed_pair() -> None:
    # h = (-1 - -2) - (-3 - -2) = 2; beta h = 1; -log sigmoid(1) = log(1 + e^-1).
    loss, m = dpo_loss(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0), beta=0.5)
    assert abs(float(loss) - math.log1p(math.exp(-1.0))) < 1e-12
    assert m["margin"] == pytest.approx(2.0, abs=1e-12)
    assert m["accuracy"] == 1.0
    assert m["chosen_reward"] == pytest.approx(0.5, abs=1e-12)
    assert m["rejected_reward"] == pytest.approx(-0.5, abs=1e-12)


def test_dpo_gradient_is_minus_beta_sigmoid_of_minus_beta_margin() -> None:
    chosen = _t(-1.0, -4.0).requires_grad_()
    rejected = _t(-3.0, -2.0).requires_grad_()
    loss, _ = dpo_loss(chosen, rejected, _t(-2.0, -2.0), _t(-2.0, -2.0), beta=0.5)
    loss.backward()
    h = torch.tensor([2.0, -2.0], **F64)
    expected = -0.5 * torch.sigmoid(-0.5 * h) / 2  # mean over 2 pairs
    torch.testing.assert_close(chosen.grad, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(rejected.grad, -expected, atol=1e-12, rtol=0)


def test_dpo_label_smoothing_and_ipo_match_their_formulas() -> None:
    args = (_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0))
    smooth, _ = dpo_loss(*args, beta=0.5, label_smoothing=0.1)
    expected = 0.9 * math.log1p(math.exp(-1.0)) + 0.1 * math.log1p(math.exp(1.0))
    assert abs(float(smooth) - expected) < 1e-12
    ipo, _ = dpo_loss(*args, beta=0.5, loss_type="ipo")  # (h - 1/(2 beta))^2 = (2 - 1)^2
    assert abs(float(ipo) - 1.0) < 1e-12


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(beta=0.0), "beta must be > 0"),
        (dict(loss_type="hinge"), "unknown loss_type"),
        (dict(label_smoothing=0.5), "label_smoothing must be in"),
        (dict(label_smoothing=0.1, loss_type="ipo"), "sigmoid' only"),
    ],
)
def test_dpo_loss_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dpo_loss(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0), **kwargs)


def test_dpo_loss_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="ref_rejected_logps has shape"):
        dpo_loss(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.0, 1.0))


finite = st.floats(-50.0, 50.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(finite, finite, finite, finite), min_size=1, max_size=6),
    st.floats(0.01, 5.0),
)
def test_dpo_loss_properties(rows: list, beta: float) -> None:
    c, r, rc, rr = (torch.tensor(col, **F64) for col in zip(*rows, strict=True))
    loss, _ = dpo_loss(c, r, rc, rr, beta=beta)
    swapped, _ = dpo_loss(r, c, rr, rc, beta=beta)
    h = (c - rc) - (r - rr)
    # -log s(x) - -log s(-x) = -x: swapping chosen and rejected flips the margin.
    torch.testing.assert_close(loss - swapped, -(beta * h).mean(), atol=1e-9, rtol=1e-9)
    assert float(loss) >= 0.0
    same, _ = dpo_loss(c, r, c, r, beta=beta)  # policy == reference: log 2
    assert abs(float(same) - math.log(2.0)) < 1e-12


def _agents(
    num_agents: int, pairs: int
) -> tuple[list[torch.nn.Linear], torch.Tensor, torch.Tensor]:
    """Per agent a tiny linear 'policy' giving a sequence log-prob per completion feature."""
    gen = torch.Generator().manual_seed(0)
    models = [torch.nn.Linear(3, 1, dtype=torch.float64) for _ in range(num_agents)]
    feats_c = torch.randn(num_agents, pairs, 3, generator=gen, **F64)
    feats_r = torch.randn(num_agents, pairs, 3, generator=gen, **F64)
    return models, feats_c, feats_r


def _logps(models: list[torch.nn.Linear], feats: torch.Tensor) -> torch.Tensor:
    return torch.stack(
        [-torch.nn.functional.softplus(m(feats[a]).squeeze(-1)) for a, m in enumerate(models)]
    )


def test_madpo_agent_loss_sends_no_gradient_to_the_other_agents() -> None:
    models, fc, fr = _agents(3, 5)
    chosen, rejected = _logps(models, fc), _logps(models, fr)
    ref_c, ref_r = chosen.detach() - 0.3, rejected.detach() + 0.2
    losses, _ = multi_agent_dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.7)
    losses[1].backward()
    assert models[1].weight.grad is not None and float(models[1].weight.grad.abs().sum()) > 0
    for a in (0, 2):  # autograd may visit them through the stacked [A, P] rows: zeros then
        for p in models[a].parameters():
            assert p.grad is None or not p.grad.any(), f"agent {a} got gradient {p.grad}"


def test_madpo_losses_equal_the_joint_dpo_loss_and_its_own_gradient() -> None:
    models, fc, fr = _agents(2, 4)
    chosen, rejected = _logps(models, fc), _logps(models, fr)
    ref_c, ref_r = chosen.detach() * 0.9, rejected.detach() * 1.1
    losses, m = multi_agent_dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.5)
    joint, jm = dpo_loss(chosen.sum(0), rejected.sum(0), ref_c.sum(0), ref_r.sum(0), beta=0.5)
    torch.testing.assert_close(losses, joint.detach().expand(2), atol=1e-12, rtol=0)
    assert m["margin"] == pytest.approx(jm["margin"], abs=1e-12)
    # Summing the agents' losses gives every agent the joint loss's gradient w.r.t. its
    # own parameters (the detached terms only stop cross-agent flow).
    losses.sum().backward()
    mine = [mod.weight.grad.clone() for mod in models]
    for mod in models:
        mod.weight.grad = None
    chosen, rejected = _logps(models, fc), _logps(models, fr)
    joint, _ = dpo_loss(chosen.sum(0), rejected.sum(0), ref_c.sum(0), ref_r.sum(0), beta=0.5)
    joint.backward()
    for a, mod in enumerate(models):
        torch.testing.assert_close(mine[a], mod.weight.grad, atol=1e-12, rtol=0)


def test_madpo_rejects_a_flat_tensor() -> None:
    with pytest.raises(ValueError, match=r"\[A, P\]"):
        multi_agent_dpo_loss(_t(1.0), _t(1.0), _t(1.0), _t(1.0))


def test_bradley_terry_loss_value() -> None:
    loss, m = bradley_terry_loss(_t(2.0, 0.0), _t(1.0, 1.0))
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0))) / 2
    assert abs(float(loss) - expected) < 1e-12
    assert m["accuracy"] == 0.5 and m["score_gap"] == pytest.approx(0.0, abs=1e-12)


def test_sft_nll_is_the_token_mean_over_the_mask() -> None:
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert float(sft_nll(logp, mask)) == pytest.approx(2.0, abs=1e-6)
    with pytest.raises(ValueError, match="selects no token"):
        sft_nll(logp, torch.zeros_like(mask))


def test_pairing_takes_the_largest_gap_above_the_threshold() -> None:
    rewards = torch.tensor([[0.0, 1.0, 0.5], [1.0, 1.0, 1.0], [0.2, 0.0, 0.3]])
    prompt, chosen, rejected = select_preference_pairs(rewards, min_gap=0.25)
    assert prompt.tolist() == [0, 2] and chosen.tolist() == [1, 2] and rejected.tolist() == [0, 1]
    prompt, chosen, rejected = select_preference_pairs(rewards, min_gap=0.0, pairs_per_prompt=2)
    assert list(zip(prompt.tolist(), chosen.tolist(), rejected.tolist(), strict=True)) == [
        (0, 1, 0),
        (0, 1, 2),
        (2, 2, 1),
        (2, 0, 1),
    ]
    with pytest.raises(ValueError, match="NaN or inf"):
        select_preference_pairs(torch.tensor([[0.0, float("nan")]]))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]), min_size=2, max_size=5),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([0.0, 0.3, 1.0]),
)
def test_pairing_properties(rows: list, min_gap: float) -> None:
    k = min(len(r) for r in rows)
    rewards = torch.tensor([r[:k] for r in rows])
    prompt, chosen, rejected = select_preference_pairs(rewards, min_gap=min_gap)
    for n in range(rewards.shape[0]):
        gap = float(rewards[n].max() - rewards[n].min())
        picked = (prompt == n).nonzero().flatten().tolist()
        assert len(picked) == (1 if gap > 0 and gap >= min_gap else 0)
        for i in picked:
            assert float(rewards[n, chosen[i]] - rewards[n, rejected[i]]) == pytest.approx(gap)
