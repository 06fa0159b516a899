"""sequence_kl: the reference KL of each completion, summed over its tokens, for the KL
reward penalty (KL in the reward; CoMLRL 1.4.3's reference_kl_coef)."""

from __future__ import annotations

import math

import pytest
import torch
from comlrl.estimators.kl_reward import sequence_kl
from hypothesis import given, settings
from hypothesis import strategies as st

# float32 sums of at most 6 terms of magnitude < e^4: round-off far below 1e-5 relative;
# the reference runs in float64 Python numbers.
TOL = dict(atol=1e-5, rtol=1e-5)


def _loop(logp, ref, mask, estimator):  # type: ignore[no-untyped-def]
    out = []
    for row_p, row_r, row_m in zip(logp.tolist(), ref.tolist(), mask.tolist(), strict=True):
        total = 0.0
        for p, r, m in zip(row_p, row_r, row_m, strict=True):
            if not m:
                continue
            d = r - p  # log(pi_ref / pi)
            total += {"k1": -d, "k2": 0.5 * d * d, "k3": math.exp(d) - d - 1.0}[estimator]
        out.append(total)
    return torch.tensor(out, dtype=torch.float32)


@st.composite
def batches(draw):  # type: ignore[no-untyped-def]
    b, length = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    logp = st.floats(-4, 0, allow_nan=False)
    p = torch.tensor(
        draw(st.lists(st.lists(logp, min_size=length, max_size=length), min_size=b, max_size=b))
    )
    r = torch.tensor(
        draw(st.lists(st.lists(logp, min_size=length, max_size=length), min_size=b, max_size=b))
    )
    m = torch.tensor(
        draw(
            st.lists(
                st.lists(st.booleans(), min_size=length, max_size=length), min_size=b, max_size=b
            )
        )
    )
    return p, r, m


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from(["k1", "k2", "k3"]))
def test_sequence_kl_sums_the_estimator_over_valid_tokens_as_a_loop_does(batch, estimator) -> None:  # type: ignore[no-untyped-def]
    logp, ref, mask = batch
    got = sequence_kl(logp, ref, mask, estimator)
    torch.testing.assert_close(got, _loop(logp, ref, mask, estimator), **TOL)


@settings(max_examples=100, deadline=None)
@given(batches())
def test_k3_is_never_negative_and_zero_for_the_reference_itself(batch) -> None:  # type: ignore[no-untyped-def]
    logp, ref, mask = batch
    assert bool((sequence_kl(logp, ref, mask) >= 0).all())
    torch.testing.assert_close(sequence_kl(logp, logp, mask), torch.zeros(logp.shape[0]))


def test_the_penalty_is_held_fixed_and_ignores_masked_positions() -> None:
    logp = torch.tensor([[-1.0, -0.5, float("-inf")]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.5, 0.0]])
    mask = torch.tensor([[True, True, False]])
    kl = sequence_kl(logp, ref, mask)
    assert not kl.requires_grad  # a reward: no gradient through it
    torch.testing.assert_close(kl, torch.tensor([math.exp(-0.5) + 0.5 - 1.0]))


def test_bad_shapes_and_estimators_are_refused() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one \\[B, L\\] shape"):
        sequence_kl(x, torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        sequence_kl(x, x, torch.ones(2, 3, dtype=torch.bool), "k4")  # type: ignore[arg-type]
