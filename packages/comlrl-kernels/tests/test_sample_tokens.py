"""sample_tokens (csrc/cpu_sample.cpp) against a float64 reference of the sampling rule.

The reference is the rule of ``comlrl.algos``' ``filtered_scores``/``sample_next`` written
in float64: temperature, top-k (ties with the k-th score kept), top-p (drop a token when
the renormalised mass before it, in (score desc, index asc) order, reaches ``top_p``),
inverse-CDF draw with ``right=True``, and the full tempered log-softmax at the drawn
token. Uniforms are placed at the middle of a chosen token's CDF interval, so the drawn
token is decided by the rule, not by float rounding; a second test draws uniforms at
random (boundary hits have probability ~1e-6 per draw at these vocabulary sizes).
"""

from __future__ import annotations

import pytest
import torch
from comlrl.kernels import BackendUnavailableError, sample_tokens, sample_tokens_unavailable
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(
    sample_tokens_unavailable() is not None, reason=f"C++ sampler: {sample_tokens_unavailable()}"
)


def kept_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """``[B, V]`` float64 renormalised sampling distribution after the filters."""
    s = logits.double() / temperature
    b, v = s.shape
    if 0 < top_k < v:
        kth = torch.topk(s, top_k, dim=-1).values[:, -1:]
        s = s.masked_fill(s < kth, float("-inf"))
    if top_p < 1.0:
        for r in range(b):
            order = sorted(range(v), key=lambda i: (-s[r, i].item(), i))
            p = s[r].softmax(-1)
            mass = 0.0
            for i in order:
                if mass >= top_p:
                    s[r, i] = float("-inf")
                mass += p[i].item()
    return s.softmax(-1)


def full_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    return (logits.double() / temperature).log_softmax(-1).gather(-1, tokens[:, None])[:, 0]


settings_ = settings(max_examples=60, deadline=None)


@settings_
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.integers(1, 6),
    v=st.integers(1, 300),
    temperature=st.sampled_from([1.0, 0.7, 1.3]),
    top_k=st.sampled_from([0, 1, 2, 5, 50]),
    top_p=st.sampled_from([1.0, 0.95, 0.8, 0.3, 0.01]),
    integer_logits=st.booleans(),
    pick=st.floats(0.0, 1.0),
)
def test_matches_float64_rule_at_interval_midpoints(
    seed: int,
    b: int,
    v: int,
    temperature: float,
    top_k: int,
    top_p: float,
    integer_logits: bool,
    pick: float,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    if integer_logits:  # many exact ties: exercises top-k ties
        logits = torch.randint(-3, 4, (b, v), generator=gen).float()
        top_p = 1.0  # tie order inside top-p is an implementation detail of torch.sort
    else:
        logits = torch.randn(b, v, generator=gen) * 3
    probs = kept_probs(logits, temperature, top_k, top_p)
    cdf = probs.cumsum(-1)
    expected = torch.empty(b, dtype=torch.int64)
    u = torch.empty(b, dtype=torch.float32)
    for r in range(b):
        support = (probs[r] > 0).nonzero()[:, 0]
        tok = int(support[min(int(pick * len(support)), len(support) - 1)])
        lo = cdf[r, tok - 1].item() if tok > 0 else 0.0
        expected[r] = tok
        u[r] = (lo + cdf[r, tok].item()) / 2 / cdf[r, -1].item()
    done = torch.zeros(b, dtype=torch.bool)
    tokens, logp, all_done = sample_tokens(
        logits,
        u,
        done,
        torch.tensor([], dtype=torch.int64),
        pad_id=0,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    assert torch.equal(tokens, expected)
    # float32 exponentials (~2 ulp) and blocked sums: the error is a few float32 ulps of
    # the tempered logits' range (|s| <= ~15 here), far below 1e-4.
    torch.testing.assert_close(
        logp.double(), full_logp(logits, tokens, temperature), atol=1e-4, rtol=0
    )
    assert not all_done and not done.any()


@settings_
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.integers(1, 8),
    v=st.integers(2, 500),
    top_p=st.sampled_from([1.0, 0.9, 0.5]),
    top_k=st.sampled_from([0, 10]),
)
def test_random_uniforms_draw_inside_the_kept_interval(
    seed: int, b: int, v: int, top_p: float, top_k: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, v, generator=gen) * 2
    u = torch.rand(b, generator=gen)
    tokens, _, _ = sample_tokens(
        logits,
        u,
        torch.zeros(b, dtype=torch.bool),
        torch.tensor([], dtype=torch.int64),
        pad_id=0,
        top_k=top_k,
        top_p=top_p,
    )
    probs = kept_probs(logits, 1.0, top_k, top_p)
    cdf = probs.cumsum(-1) / probs.sum(-1, keepdim=True)
    ref = torch.searchsorted(cdf, u.double()[:, None], right=True)[:, 0].clamp(max=v - 1)
    assert torch.equal(tokens, ref)
    assert bool((probs.gather(-1, tokens[:, None]) > 0).all())


def test_done_rows_get_pad_and_eos_ends_rows() -> None:
    # Row 0 draws token 2 (all mass there), an EOS; row 1 was done: pad, logp still that
    # of its draw; row 2 draws 1, not an EOS.
    logits = torch.full((3, 4), -30.0)
    logits[0, 2] = logits[1, 3] = logits[2, 1] = 10.0
    done = torch.tensor([False, True, False])
    eos = torch.tensor([2, 7])
    tokens, logp, all_done = sample_tokens(logits, torch.full((3, 1), 0.5), done, eos, pad_id=9)
    assert tokens.tolist() == [2, 9, 1]
    assert done.tolist() == [True, True, False]
    assert not all_done
    torch.testing.assert_close(logp, full_logp(logits, torch.tensor([2, 3, 1]), 1.0).float())
    logits[2] = -30.0
    logits[2, 2] = 10.0  # row 2 now draws EOS 2: every row is done
    tokens, _, all_done = sample_tokens(logits, torch.full((3,), 0.5), done, eos, pad_id=9)
    assert tokens.tolist() == [9, 9, 2] and all_done and bool(done.all())


def test_strided_rows_are_read_correctly() -> None:
    base = torch.randn(4, 20)
    base[:, 3] = 50.0  # column 3 of the view base[:, 2:12] is index 1
    tokens, _, _ = sample_tokens(
        base[:, 2:12],
        torch.rand(4),
        torch.zeros(4, dtype=torch.bool),
        torch.tensor([], dtype=torch.int64),
        pad_id=0,
    )
    assert tokens.tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"logits": torch.zeros(2, 3, dtype=torch.float64)}, "float32"),
        ({"logits": torch.zeros(3, 2).t()}, "contiguous"),
        ({"uniforms": torch.zeros(3)}, "uniforms has shape"),
        ({"done": torch.zeros(2, dtype=torch.int64)}, "done is torch.int64"),
        ({"temperature": 0.0}, "temperature must be > 0, got 0.0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
    ],
)
def test_bad_inputs_name_the_value(kwargs: dict, match: str) -> None:
    args: dict = {
        "logits": torch.zeros(2, 3),
        "uniforms": torch.zeros(2),
        "done": torch.zeros(2, dtype=torch.bool),
        "eos": torch.tensor([1]),
        "pad_id": 0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sample_tokens(**args)


def test_forced_torch_backend_reports_unavailable() -> None:
    from comlrl.kernels import use_backend

    with use_backend("torch"):
        assert sample_tokens_unavailable() is not None
        with pytest.raises(BackendUnavailableError, match="selects 'torch'"):
            sample_tokens(
                torch.zeros(1, 2),
                torch.zeros(1),
                torch.zeros(1, dtype=torch.bool),
                torch.tensor([0]),
                pad_id=0,
            )
