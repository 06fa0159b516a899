"""CUDA-only checks: 64-bit offsets, the current stream, devices, CUDA-specific contracts.

Every test here is marked ``cuda`` (skipped without a GPU and the compiled ``_cuda``
module) and forces the CUDA backend, so a failing kernel raises instead of falling back.
"""

from __future__ import annotations

import pytest
import torch
from comlrl.kernels import group_advantages, token_logprobs, use_backend
from comlrl.kernels._reference import group_advantages_reference, token_logprobs_reference
from comlrl.kernels._token_logprobs import token_logprobs_backward, token_logprobs_forward

pytestmark = pytest.mark.cuda

IGNORE = -100


def test_offsets_beyond_2_pow_31_elements() -> None:
    """N * V > 2**31 (byte offsets > 2**32): rows past the int32 range must read and write
    their own elements. V is odd so rows start at every 16-byte phase (vector and scalar
    paths), and the last row is ignored (zero gradient written past 2**31)."""
    if torch.cuda.mem_get_info()[0] < 10 * 2**30:
        pytest.skip("needs ~10 GiB of free GPU memory")
    vocab = 32771
    n = 2**31 // vocab + 16
    assert n * vocab > 2**31
    torch.manual_seed(0)
    x = torch.randn(n, vocab, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, vocab, (n,), device="cuda")
    targets[-1] = IGNORE
    rows = torch.tensor([0, 1, *range(n - 9, n)])
    assert int(rows[2]) * vocab > 2**31
    saved = x[rows.cuda()].cpu()
    g_lp = torch.randn(n, device="cuda")
    g_ent = torch.randn(n, device="cuda")
    with use_backend("cuda"):
        logp, lse, ent, used = token_logprobs_forward("cuda", x, targets, 0.8, True, IGNORE)
        assert used == "cuda" and ent is not None
        grad = token_logprobs_backward(
            "cuda", x, targets, 0.8, IGNORE, lse, g_lp, g_ent, ent, inplace=True
        )
    assert grad.data_ptr() == x.data_ptr()
    torch.cuda.synchronize()

    ref_in = saved.double().requires_grad_()
    t = targets[rows.cuda()].cpu()
    ref_lp, ref_ent = token_logprobs_reference(
        ref_in, t, temperature=0.8, return_entropy=True, ignore_index=IGNORE
    )
    loss = (ref_lp * g_lp[rows.cuda()].cpu().double()).sum()
    loss = loss + (ref_ent * g_ent[rows.cuda()].cpu().double()).sum()
    (ref_grad,) = torch.autograd.grad(loss, ref_in)
    idx = rows.cuda()
    torch.testing.assert_close(logp[idx].cpu().double(), ref_lp.detach(), atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(ent[idx].cpu().double(), ref_ent.detach(), atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(grad[idx].cpu().double(), ref_grad, atol=1e-5, rtol=1e-2)
    assert torch.count_nonzero(grad[-1]).item() == 0


def test_kernels_run_on_the_current_stream() -> None:
    """Inputs are written on a side stream after a GPU sleep; a kernel launched on any other
    stream (e.g. the legacy default stream, which torch's streams do not wait for) would read
    the zeros that were there before."""
    torch.manual_seed(1)
    n, vocab, sleep = 64, 4096, 100_000_000
    src = torch.randn(n, vocab, device="cuda")
    targets = torch.randint(0, vocab, (n,), device="cuda")
    g = torch.randn(n, device="cuda")
    rewards_src = torch.randn(64, device="cuda", dtype=torch.float64)
    ref_in = src.double().requires_grad_()
    ref_lp = token_logprobs_reference(ref_in, targets)
    assert isinstance(ref_lp, torch.Tensor)
    (ref_lp * g.double()).sum().backward()
    ref_adv = group_advantages_reference(rewards_src, group_size=8, scale="group")

    x = torch.zeros(n, vocab, device="cuda")
    gg = torch.zeros(n, device="cuda")
    r = torch.zeros(64, device="cuda", dtype=torch.float64)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), use_backend("cuda"):
        torch.cuda._sleep(sleep)
        x.copy_(src)
        leaf = x.requires_grad_()
        lp = token_logprobs(leaf, targets)
        torch.cuda._sleep(sleep)
        gg.copy_(g)
        lp.backward(gg)
        torch.cuda._sleep(sleep)
        r.copy_(rewards_src)
        adv = group_advantages(r, group_size=8, scale="group")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    torch.testing.assert_close(lp.double(), ref_lp.detach(), atol=3e-5, rtol=1e-5)
    assert leaf.grad is not None
    torch.testing.assert_close(leaf.grad.double(), ref_in.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(adv, ref_adv, atol=1e-9, rtol=1e-9)


def test_out_of_range_targets_give_nan_rows_on_cuda() -> None:
    """Documented CUDA contract: no exception (no host sync), NaN for that row only."""
    logits = torch.randn(4, 10, device="cuda")
    targets = torch.tensor([1, 10, -1, IGNORE], device="cuda")
    with use_backend("cuda"):
        lp = token_logprobs(logits, targets, ignore_index=IGNORE).cpu()
    assert torch.isfinite(lp[0]) and lp[3].item() == 0.0
    assert torch.isnan(lp[1]) and torch.isnan(lp[2])


def test_many_rows() -> None:
    """More rows than SMs x resident blocks; every row must be reduced independently."""
    torch.manual_seed(2)
    x = (torch.randn(5000, 515, device="cuda") * 4).to(torch.bfloat16)
    targets = torch.randint(0, 515, (5000,), device="cuda")
    targets[::7] = IGNORE
    with use_backend("cuda"):
        lp, ent = token_logprobs(x, targets, return_entropy=True, ignore_index=IGNORE)
    ref_lp, ref_ent = token_logprobs_reference(
        x.double(), targets, return_entropy=True, ignore_index=IGNORE
    )
    torch.testing.assert_close(lp.double(), ref_lp, atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, atol=5e-5, rtol=1e-5)


def test_tensors_on_a_non_current_device() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 1)
    x = torch.randn(8, 300, device=dev, requires_grad=True)
    targets = torch.randint(0, 300, (8,), device=dev)
    with use_backend("cuda"):
        lp = token_logprobs(x, targets)
        lp.sum().backward()
        adv = group_advantages(torch.arange(8.0, device=dev), group_size=4)
    assert torch.cuda.current_device() == 0
    ref_in = x.detach().double().requires_grad_()
    ref = token_logprobs_reference(ref_in, targets)
    assert isinstance(ref, torch.Tensor)
    ref.sum().backward()
    torch.testing.assert_close(lp.double(), ref.detach(), atol=3e-5, rtol=1e-5)
    assert x.grad is not None
    torch.testing.assert_close(x.grad.double(), ref_in.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(adv.cpu(), torch.tensor([-1.5, -0.5, 0.5, 1.5] * 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nan_among_masked_logits_poisons_the_row(dtype: torch.dtype) -> None:
    """A NaN whose 128-bit vector is otherwise -inf must not be dropped (the reference's
    logsumexp is NaN for that row); other rows are unaffected."""
    logits = torch.randn(2, 64, device="cuda").to(dtype)
    logits[0, :16] = float("-inf")
    logits[0, 1] = float("nan")
    targets = torch.tensor([20, 3], device="cuda")
    with use_backend("cuda"):
        lp, ent = token_logprobs(logits, targets, return_entropy=True)
    ref_lp, ref_ent = token_logprobs_reference(logits.double(), targets, return_entropy=True)
    assert torch.isnan(ref_lp[0]) and torch.isnan(lp[0]) and torch.isnan(ent[0])
    torch.testing.assert_close(lp[1].double(), ref_lp[1], atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(ent[1].double(), ref_ent[1], atol=5e-5, rtol=1e-5)


def test_linear_weight_grad_accumulates_bf16_chunks_in_float32() -> None:
    """The bf16 weight gradient is added into the float32 accumulator without a rounded
    bf16 product per chunk: the result matches float64 to float32 accuracy (a bf16
    intermediate would be off by ~1e-2 here), and the accumulator is updated in place."""
    from comlrl.kernels._linear_token_logprobs import _accumulate_weight_grad

    torch.manual_seed(3)
    v, c, h = 4099, 64, 96
    acc = torch.randn(v, h, device="cuda")
    gl = torch.randn(c, v, device="cuda").to(torch.bfloat16)
    hid = torch.randn(c, h, device="cuda").to(torch.bfloat16)
    expected = acc.double() + gl.double().t() @ hid.double()
    ptr = acc.data_ptr()
    _accumulate_weight_grad(acc, gl, hid)
    assert acc.data_ptr() == ptr and acc.dtype == torch.float32
    # float32 sums of 64 products of magnitude ~1: error ~64 * 6e-8 * |terms| << 1e-4.
    torch.testing.assert_close(acc.double(), expected, atol=1e-4, rtol=1e-5)


def test_forward_matches_float64_on_wide_logit_ranges() -> None:
    """The base-2 (EX2) forward and backward against float64 for logits spread over
    [-60, 60] at temperature 0.7, with -inf entries (masked vocabulary) in some rows."""
    torch.manual_seed(4)
    n, vocab = 48, 50257
    x = (torch.rand(n, vocab, device="cuda") * 120 - 60).to(torch.float32)
    x[::5, 1000:1200] = float("-inf")
    targets = torch.randint(0, 1000, (n,), device="cuda")
    g_lp, g_ent = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    ref_in = x.cpu().double().requires_grad_()
    ref_lp, ref_ent = token_logprobs_reference(
        ref_in, targets.cpu(), temperature=0.7, return_entropy=True, ignore_index=IGNORE
    )
    loss = (ref_lp * g_lp.cpu().double()).sum() + (ref_ent * g_ent.cpu().double()).sum()
    (ref_grad,) = torch.autograd.grad(loss, ref_in)
    with use_backend("cuda"):
        logp, lse, ent, used = token_logprobs_forward("cuda", x, targets, 0.7, True, IGNORE)
        grad = token_logprobs_backward(
            "cuda", x, targets, 0.7, IGNORE, lse, g_lp, g_ent, ent, inplace=False
        )
    assert used == "cuda"
    # |logits / T| up to ~86: float32 rounding of x / T is ~5e-6 absolute per element.
    torch.testing.assert_close(logp.cpu().double(), ref_lp.detach(), atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(ent.cpu().double(), ref_ent.detach(), atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(grad.cpu().double(), ref_grad, atol=1e-5, rtol=1e-3)
    assert torch.isfinite(grad).all()
