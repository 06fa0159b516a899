"""Completion masks, KL estimators and the policy loss against hand-written loops."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from comlrl.estimators.kl import kl_penalty
from comlrl.estimators.losses import completion_mask, policy_loss
from hypothesis import given, settings
from hypothesis import strategies as st

PROPS = settings(max_examples=40, deadline=None)
TOL: dict[str, Any] = {"rtol": 1e-10, "atol": 1e-12}  # float64 throughout unless stated
REDUCTIONS = ("seq_mean_token_mean", "token_mean", "seq_sum")


# --- completion_mask -----------------------------------------------------------------


def test_mask_keeps_tokens_through_the_first_eos_only() -> None:
    ids = torch.tensor([[5, 6, 2, 7, 2], [2, 5, 5, 5, 5], [5, 6, 7, 8, 9]])
    want = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(completion_mask(ids, 2), want)


def test_mask_accepts_several_eos_ids() -> None:
    ids = torch.tensor([[5, 1, 2, 7], [5, 6, 2, 1]])
    want = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(completion_mask(ids, [1, 2]), want)


def test_mask_drops_padding_but_keeps_a_first_eos_equal_to_pad() -> None:
    ids = torch.tensor([[5, 6, 0, 0], [5, 9, 6, 7]])
    want = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(
        completion_mask(ids, 9, pad_token_id=0),
        torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.bool),
    )
    assert torch.equal(completion_mask(ids, 3, pad_token_id=0), want)
    # GPT-2 style: pad == eos. The first EOS counts, the padding after it does not.
    ids = torch.tensor([[5, 6, 50256, 50256], [50256, 50256, 50256, 50256]])
    want = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(completion_mask(ids, 50256, pad_token_id=50256), want)


@PROPS
@given(rows=st.lists(st.lists(st.integers(0, 4), min_size=6, max_size=6), min_size=1, max_size=5))
def test_mask_matches_a_loop_reference(rows: list[list[int]]) -> None:
    ids = torch.tensor(rows)
    want = []
    for row in rows:
        seen_eos = False
        out = []
        for tok in row:
            out.append(not seen_eos and (tok != 0 or tok in (3, 4)))
            seen_eos = seen_eos or tok in (3, 4)
        want.append(out)
    assert completion_mask(ids, (3, 4), pad_token_id=0).tolist() == want


def test_mask_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"integer tensor \[B, L\]"):
        completion_mask(torch.zeros(2, 3), 1)
    with pytest.raises(ValueError, match="eos_token_ids is empty"):
        completion_mask(torch.zeros(2, 3, dtype=torch.long), [])


# --- kl_penalty ----------------------------------------------------------------------


def test_kl_estimators_match_their_formulas() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 5
    ref = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 5
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), logp - ref, **TOL)
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), 0.5 * (logp - ref) ** 2, **TOL)
    d = ref - logp
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.exp(d) - d - 1, **TOL)
    torch.testing.assert_close(kl_penalty(logp, ref), torch.exp(d) - d - 1, **TOL)


@PROPS
@given(
    logp=st.floats(-30, 0, width=32),
    ref=st.floats(-30, 0, width=32),
)
def test_k2_and_k3_are_never_negative_and_zero_when_equal(logp: float, ref: float) -> None:
    a = torch.tensor([logp, logp])
    b = torch.tensor([ref, logp])
    for est in ("k2", "k3"):
        kl = kl_penalty(a, b, est)  # type: ignore[arg-type]
        assert bool((kl >= 0).all()), (est, kl)
        assert kl[1].item() == 0.0


def test_k1_and_k3_are_unbiased_estimates_of_the_exact_kl() -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), 0)
    exact = (p * (p.log() - q.log())).sum()
    samples = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, ref = p.log()[samples], q.log()[samples]
    for est in ("k1", "k3"):
        values = kl_penalty(logp, ref, est)  # type: ignore[arg-type]
        stderr = values.std() / math.sqrt(values.numel())
        assert abs(values.mean() - exact) < 5 * stderr, est


def _expected_gradient(estimator: str, logits: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``E_{x~pi}[grad k(x)]`` exactly: every outcome ``x`` of the categorical weighted by
    ``pi(x)`` (held fixed, as sampling is), its estimator differentiated in ``logits``."""
    logits = logits.detach().requires_grad_(True)
    logp = torch.log_softmax(logits, 0)
    weights = logp.exp().detach()
    values = kl_penalty(logp, ref, estimator)  # type: ignore[arg-type]
    (grad,) = torch.autograd.grad((weights * values).sum(), logits)
    return grad


@pytest.mark.parametrize("seed", range(5))
def test_kl_estimators_expected_gradients_follow_the_stated_kl(seed: int) -> None:
    # Exact enumeration over a 6-outcome categorical (Schulman 2020): as a loss term,
    # k1's expected gradient is 0, k2's is grad KL(pi || ref), k3's is grad KL(ref || pi).
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, generator=gen, dtype=torch.float64)
    ref = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), 0)

    def kl_grad(forward: bool) -> torch.Tensor:
        x = logits.clone().requires_grad_(True)
        logp = torch.log_softmax(x, 0)
        if forward:  # KL(pi || ref)
            kl = (logp.exp() * (logp - ref)).sum()
        else:  # KL(ref || pi)
            kl = (ref.exp() * (ref - logp)).sum()
        (grad,) = torch.autograd.grad(kl, x)
        return grad

    forward, reverse = kl_grad(True), kl_grad(False)
    assert not torch.allclose(forward, reverse, atol=1e-3)  # the two directions differ here
    torch.testing.assert_close(
        _expected_gradient("k1", logits, ref), torch.zeros(6, dtype=torch.float64), **TOL
    )
    torch.testing.assert_close(_expected_gradient("k2", logits, ref), forward, **TOL)
    torch.testing.assert_close(_expected_gradient("k3", logits, ref), reverse, **TOL)


def test_policy_loss_refuses_k1_as_a_loss_term_and_says_to_use_the_reward() -> None:
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    ref = torch.full((2, 3), -1.5)
    with pytest.raises(ValueError, match=r"kl_estimator='k1' with kl_coef=0.1.*reward.*'k3'"):
        policy_loss(logp, torch.ones(2), mask, ref_logprobs=ref, kl_coef=0.1, kl_estimator="k1")
    # as a metric (kl_coef = 0) k1 is fine: its value is an unbiased KL estimate
    _, metrics = policy_loss(logp, torch.ones(2), mask, ref_logprobs=ref, kl_estimator="k1")
    assert metrics["kl"] == pytest.approx(0.5)


def test_kl_rejects_unknown_estimator_and_shape_mismatch() -> None:
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'.*'k3'"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same shape"):
        kl_penalty(torch.zeros(2), torch.zeros(3))


# --- policy_loss: reference loop -------------------------------------------------------


def loop_loss(
    logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    old: torch.Tensor | None,
    clip: tuple[float, float] | None,
    ref: torch.Tensor | None,
    kl_coef: float,
    reduction: str,
    max_len: int | None,
) -> float:
    b, length = logp.shape
    seq_terms, all_terms = [], []
    for i in range(b):
        terms = []
        for t in range(length):
            if not mask[i, t]:
                continue
            a = float(adv[i] if adv.dim() == 1 else adv[i, t])
            lp = float(logp[i, t])
            if old is None:
                term = -a * lp
            else:
                r = math.exp(lp - float(old[i, t]))
                if clip is None:
                    term = -r * a
                else:
                    rc = min(max(r, 1 - clip[0]), 1 + clip[1])
                    term = -min(r * a, rc * a)
            if ref is not None and kl_coef:
                d = float(ref[i, t]) - lp
                term += kl_coef * (math.exp(d) - d - 1)
            terms.append(term)
        seq_terms.append(terms)
        all_terms.extend(terms)
    if reduction == "seq_mean_token_mean":
        return sum(sum(ts) / len(ts) if ts else 0.0 for ts in seq_terms) / b
    if reduction == "token_mean":
        return sum(all_terms) / len(all_terms) if all_terms else 0.0
    constant = max_len if max_len is not None else length
    return sum(sum(ts) / constant for ts in seq_terms) / b


@PROPS
@given(
    b=st.integers(1, 4),
    length=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    reduction=st.sampled_from(REDUCTIONS),
    variant=st.sampled_from(("on_policy", "ratio", "clip", "clip_higher")),
    per_token_adv=st.booleans(),
    kl_coef=st.sampled_from((0.0, 0.1)),
    extra_len=st.sampled_from((None, 0, 3)),
)
def test_policy_loss_matches_loop_reference(
    b: int,
    length: int,
    seed: int,
    reduction: str,
    variant: str,
    per_token_adv: bool,
    kl_coef: float,
    extra_len: int | None,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    logp = -torch.rand(b, length, generator=gen, dtype=f64) * 3
    old = logp + 0.4 * torch.randn(b, length, generator=gen, dtype=f64)
    ref = logp + 0.4 * torch.randn(b, length, generator=gen, dtype=f64)
    adv_shape = (b, length) if per_token_adv else (b,)
    adv = torch.randn(adv_shape, generator=gen, dtype=f64)
    mask = torch.rand(b, length, generator=gen) < 0.7
    mask[0] = False  # always one empty sequence
    clip = {"clip": (0.2, 0.2), "clip_higher": (0.2, 0.28)}.get(variant)
    max_len = None if extra_len is None else length + extra_len
    if reduction == "seq_sum" and max_len is None:
        max_len = length  # seq_sum needs its constant (N6)
    loss, metrics = policy_loss(
        logp,
        adv,
        mask,
        old_logprobs=None if variant == "on_policy" else old,
        clip_ratio=clip if variant != "clip" else 0.2,
        ref_logprobs=ref,
        kl_coef=kl_coef,
        reduction=reduction,  # type: ignore[arg-type]
        max_completion_length=max_len,
    )
    want = loop_loss(
        logp,
        adv,
        mask,
        old=None if variant == "on_policy" else old,
        clip=clip,
        ref=ref,
        kl_coef=kl_coef,
        reduction=reduction,
        max_len=max_len,
    )
    assert loss.dtype == f64 and loss.shape == ()
    torch.testing.assert_close(loss, torch.tensor(want, dtype=f64), **TOL)
    assert metrics["loss"] == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert metrics["num_tokens"] == int(mask.sum())


# --- policy_loss: gradients ------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("off_policy", [False, True])
def test_masked_tokens_get_exactly_zero_gradient_even_with_garbage(
    reduction: str, off_policy: bool
) -> None:
    gen = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    logp = -torch.rand(3, 4, generator=gen)
    logp[~mask] = torch.tensor([-math.inf, math.nan, math.inf, -math.inf, math.nan, 0.0, 1.0])
    logp.requires_grad_(True)
    old = torch.where(mask, logp.detach() + 0.1, math.nan)
    ref = torch.where(mask, logp.detach() - 0.1, -math.inf)
    # Per-token advantages carry garbage on masked tokens too.
    adv = torch.where(mask, torch.tensor([[1.0], [-2.0], [5.0]]), math.nan)
    loss, metrics = policy_loss(
        logp,
        adv,
        mask,
        old_logprobs=old if off_policy else None,
        clip_ratio=0.2 if off_policy else None,
        ref_logprobs=ref,
        kl_coef=0.05,
        reduction=reduction,  # type: ignore[arg-type]
        max_completion_length=4,
    )
    loss.backward()
    assert logp.grad is not None
    assert torch.isfinite(loss)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert bool((logp.grad[~mask] == 0).all())
    assert bool((logp.grad[mask] != 0).all())


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_masked_batch_gives_zero_loss_and_gradient(reduction: str) -> None:
    logp = torch.full((2, 3), math.nan, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss, metrics = policy_loss(
        logp,
        torch.ones(2),
        mask,
        old_logprobs=torch.zeros(2, 3),
        clip_ratio=0.2,
        reduction=reduction,  # type: ignore[arg-type]
        max_completion_length=3,
    )
    loss.backward()
    assert loss.item() == 0.0 and metrics["num_tokens"] == 0.0
    assert logp.grad is not None and bool((logp.grad == 0).all())
    assert metrics["ratio_mean"] == 1.0 and metrics["clip_fraction"] == 0.0


def test_empty_batch_gives_zero_loss() -> None:
    for reduction in REDUCTIONS:
        loss, metrics = policy_loss(
            torch.zeros(0, 4),
            torch.zeros(0),
            torch.zeros(0, 4, dtype=torch.bool),
            old_logprobs=torch.zeros(0, 4),
            clip_ratio=0.2,
            reduction=reduction,  # type: ignore[arg-type]
            max_completion_length=4,
        )
        assert loss.item() == 0.0 and metrics["num_tokens"] == 0.0


def test_ppo_clip_zeroes_gradient_only_where_the_clipped_term_is_active() -> None:
    eps = 0.2
    old = torch.zeros(1, 6, dtype=torch.float64)
    ratios = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.1, 0.9]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0, -1.0]], dtype=torch.float64)
    logp = ratios.log().requires_grad_(True)
    loss, metrics = policy_loss(
        logp,
        adv,
        torch.ones(1, 6, dtype=torch.bool),
        old_logprobs=old,
        clip_ratio=eps,
        reduction="token_mean",
    )
    loss.backward()
    assert logp.grad is not None
    grad = logp.grad[0]
    # r > 1+eps with A > 0, and r < 1-eps with A < 0: clipped, no gradient.
    assert grad[0].item() == 0.0 and grad[2].item() == 0.0
    # Elsewhere d(-r A)/d logp = -r A / num_tokens.
    for t in (1, 3, 4, 5):
        want = -ratios[0, t].item() * adv[0, t].item() / 6
        assert grad[t].item() == pytest.approx(want, rel=1e-12)
    assert metrics["clip_fraction"] == pytest.approx(2 / 6)
    assert metrics["clip_fraction_high"] == pytest.approx(1 / 6)
    assert metrics["clip_fraction_low"] == pytest.approx(1 / 6)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["ratio_min"] == pytest.approx(0.5)


def test_clip_higher_uses_separate_low_and_high_bounds() -> None:
    ratios = torch.tensor([[1.25, 1.30, 0.85, 0.75]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    logp = ratios.log().requires_grad_(True)
    loss, _ = policy_loss(
        logp,
        adv,
        torch.ones(1, 4, dtype=torch.bool),
        old_logprobs=torch.zeros(1, 4, dtype=torch.float64),
        clip_ratio=(0.2, 0.28),
        reduction="token_mean",
    )
    loss.backward()
    assert logp.grad is not None
    assert [g != 0 for g in logp.grad[0].tolist()] == [True, False, True, False]


def test_on_policy_gradient_equals_ratio_gradient_at_ratio_one() -> None:
    gen = torch.Generator().manual_seed(5)
    base = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 5, generator=gen) < 0.8
    grads = []
    for old in (None, base.clone()):
        logp = base.clone().requires_grad_(True)
        loss, _ = policy_loss(logp, adv, mask, old_logprobs=old, clip_ratio=0.2)
        loss.backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1], **TOL)


def test_seq_sum_divides_by_the_constant_not_the_sequence_length() -> None:
    logp = torch.full((2, 4), -1.0)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0])
    loss, _ = policy_loss(logp, adv, mask, reduction="seq_sum", max_completion_length=8)
    assert loss.item() == pytest.approx((1 / 8 + 4 / 8) / 2)
    loss, _ = policy_loss(logp, adv, mask, reduction="seq_sum", max_completion_length=4)
    assert loss.item() == pytest.approx((1 / 4 + 4 / 4) / 2)
    loss, _ = policy_loss(logp, adv, mask, reduction="seq_mean_token_mean")
    assert loss.item() == pytest.approx(1.0)
    loss, _ = policy_loss(logp, adv, mask, reduction="token_mean")
    assert loss.item() == pytest.approx(1.0)


def test_seq_sum_bounds_the_valid_tokens_not_the_padded_width() -> None:
    """A completion with tool calls is padded wider than the budget C of the model's tokens
    by the (masked) observation tokens inside it: C bounds the valid tokens, as sampling
    did, and the loss is the same as without the masked positions."""
    logp = torch.full((2, 6), -1.0)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0])
    loss, _ = policy_loss(logp, adv, mask, reduction="seq_sum", max_completion_length=4)
    assert loss.item() == pytest.approx((4 / 4 + 1 / 4) / 2)
    packed = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    same, _ = policy_loss(logp[:, :4], adv, packed, reduction="seq_sum", max_completion_length=4)
    torch.testing.assert_close(loss, same, rtol=0, atol=0)
    with pytest.raises(ValueError, match="max_completion_length=3 but a completion has 4 valid"):
        policy_loss(logp, adv, mask, reduction="seq_sum", max_completion_length=3)


def test_kl_term_adds_coef_times_token_mean_kl_and_reports_it() -> None:
    gen = torch.Generator().manual_seed(7)
    logp = -torch.rand(2, 3, generator=gen, dtype=torch.float64)
    ref = logp - 0.3
    mask = torch.ones(2, 3, dtype=torch.bool)
    adv = torch.tensor([0.5, -0.5], dtype=torch.float64)
    plain, m0 = policy_loss(logp, adv, mask, ref_logprobs=ref, reduction="token_mean")
    with_kl, m1 = policy_loss(
        logp, adv, mask, ref_logprobs=ref, kl_coef=0.1, kl_estimator="k2", reduction="token_mean"
    )
    assert m0["kl"] == pytest.approx(math.expm1(-0.3) + 0.3)  # k3 by default
    assert m1["kl"] == pytest.approx(0.5 * 0.09)
    assert (with_kl - plain).item() == pytest.approx(0.1 * 0.5 * 0.09)
    assert "kl" not in policy_loss(logp, adv, mask)[1]


def test_low_precision_logprobs_are_reduced_in_float32() -> None:
    logp = torch.full((2, 3), -0.5, dtype=torch.bfloat16, requires_grad=True)
    loss, _ = policy_loss(logp, torch.ones(2), torch.ones(2, 3, dtype=torch.bool))
    assert loss.dtype == torch.float32
    loss.backward()
    assert logp.grad is not None and logp.grad.dtype == torch.bfloat16


def test_seq_sum_without_its_constant_is_refused() -> None:
    """N6: without max_completion_length, seq_sum divided each call by its own padded
    length L, so two turns (or micro-batches) of one update padded to other lengths got
    other weights: the same completion's gradient changed with its neighbours' lengths."""
    logp = torch.full((1, 2), -1.0)
    short, padded = torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 5, dtype=torch.bool)
    padded[0, 2:] = False
    with pytest.raises(ValueError, match="seq_sum. divides by the generation budget"):
        policy_loss(logp, torch.ones(1), short, reduction="seq_sum")
    # with the constant, padding does not change the loss of the same completion
    a, _ = policy_loss(logp, torch.ones(1), short, reduction="seq_sum", max_completion_length=8)
    b, _ = policy_loss(
        torch.full((1, 5), -1.0), torch.ones(1), padded, reduction="seq_sum",
        max_completion_length=8,
    )  # fmt: skip
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_policy_loss_rejects_bad_arguments_with_the_value() -> None:
    logp, mask, adv = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), torch.zeros(2)
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_logprobs"):
        policy_loss(logp, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="unknown reduction 'mean'"):
        policy_loss(logp, adv, mask, reduction="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="low=1.5"):
        policy_loss(logp, adv, mask, old_logprobs=logp, clip_ratio=1.5)
    with pytest.raises(ValueError, match=r"\(low, high\) pair"):
        policy_loss(logp, adv, mask, old_logprobs=logp, clip_ratio=(0.1, 0.2, 0.3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_completion_length=2 but a completion has 3 valid"):
        policy_loss(logp, adv, mask, reduction="seq_sum", max_completion_length=2)
    with pytest.raises(ValueError, match="max_completion_length must be an integer >= 1"):
        policy_loss(logp, adv, mask, reduction="seq_sum", max_completion_length=0)
    with pytest.raises(ValueError, match=r"advantages must be \[B\] = \[2\]"):
        policy_loss(logp, torch.zeros(3), mask)
    with pytest.raises(ValueError, match="mask must have the shape"):
        policy_loss(logp, adv, mask[:, :2])
    with pytest.raises(ValueError, match="floating tensor"):
        policy_loss(torch.zeros(2, 3, dtype=torch.long), adv, mask)


def test_dr_grpo_needs_seq_sum_for_a_length_free_token_gradient() -> None:
    """N7: Dr. GRPO (Liu et al. 2025) is the unscaled advantage *and* a constant
    normaliser. With ``seq_sum`` every valid token's gradient is ``-A / (C * B)`` whatever
    its completion's length; the default per-sequence mean gives ``-A / (n_i * B)``."""
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0])
    grads = {}
    for reduction in ("seq_sum", "seq_mean_token_mean"):
        logp = torch.full((2, 4), -1.0, requires_grad=True)
        loss, _ = policy_loss(logp, adv, mask, reduction=reduction, max_completion_length=8)  # type: ignore[arg-type]
        loss.backward()
        assert logp.grad is not None
        grads[reduction] = logp.grad[mask]
    torch.testing.assert_close(grads["seq_sum"], torch.full((5,), -1 / 16), rtol=0, atol=0)
    assert grads["seq_mean_token_mean"][0] == -1 / 2 and grads["seq_mean_token_mean"][1] == -1 / 8


# --- metrics on the device -------------------------------------------------------------


@PROPS
@given(
    seed=st.integers(0, 2**16),
    reduction=st.sampled_from(REDUCTIONS),
    clip=st.sampled_from([None, 0.2]),
    with_ref=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_device_metrics_are_the_host_metrics_as_tensors(
    seed: int, reduction: str, clip: float | None, with_ref: bool, dtype: torch.dtype
) -> None:
    """``sync=False`` returns the same values (float64 0-dim tensors, not yet read back),
    and the same loss."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(3, 5, generator=g, dtype=dtype)
    old = logp + 0.3 * torch.randn(3, 5, generator=g, dtype=dtype)
    ref = logp + 0.2 * torch.randn(3, 5, generator=g, dtype=dtype)
    mask = torch.rand(3, 5, generator=g) > 0.3
    adv = torch.randn(3, generator=g, dtype=dtype)
    kw: dict[str, Any] = dict(
        old_logprobs=old,
        clip_ratio=clip,
        ref_logprobs=ref if with_ref else None,
        reduction=reduction,
        max_completion_length=5,
    )
    loss, host = policy_loss(logp, adv, mask, **kw)
    dev_loss, dev = policy_loss(logp, adv, mask, sync=False, **kw)
    assert torch.equal(loss, dev_loss)
    assert set(host) == set(dev)
    for key, value in dev.items():
        assert value.dim() == 0 and value.dtype == torch.float64
        assert float(value) == host[key], key
