"""linear_token_logprobs: chunked lm_head + log-probs against the materialized reference."""

from __future__ import annotations

import pytest
import torch
from comlrl.kernels import linear_token_logprobs, use_backend
from comlrl.kernels._linear_token_logprobs import default_chunk_size
from comlrl.kernels._reference import linear_token_logprobs_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

TOL = {
    # float32: matmul + float32 log-sum-exp; bfloat16: the logits themselves are bf16.
    torch.float32: {"out": dict(atol=5e-5, rtol=1e-5), "grad": dict(atol=5e-5, rtol=1e-4)},
    torch.bfloat16: {"out": dict(atol=5e-2, rtol=1e-2), "grad": dict(atol=5e-2, rtol=3e-2)},
}


def check(
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    n: int,
    h: int,
    v: int,
    chunk: int | None,
    temperature: float = 1.0,
    ignore: tuple[int, ...] = (),
    seed: int = 0,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64) / h**0.5
    targets = torch.randint(0, v, (n,), generator=gen)
    for i in ignore:
        targets[i] = -100
    g = torch.randn(n, generator=gen, dtype=torch.float64)

    hr, wr = hidden.to(dtype).double().requires_grad_(), weight.to(dtype).double().requires_grad_()
    ref = linear_token_logprobs_reference(hr, wr, targets, temperature=temperature)
    ref_gh, ref_gw = torch.autograd.grad((ref * g).sum(), (hr, wr))

    hd = hidden.to(device=device, dtype=dtype).requires_grad_()
    wd = weight.to(device=device, dtype=dtype).requires_grad_()
    with use_backend(backend):
        out = linear_token_logprobs(
            hd, wd, targets.to(device), temperature=temperature, chunk_size=chunk
        )
    assert out.dtype == torch.float32 and out.shape == (n,)
    gh, gw = torch.autograd.grad((out * g.to(device, torch.float32)).sum(), (hd, wd))
    assert gh.dtype == dtype and gw.dtype == dtype
    tol = TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), ref.detach(), **tol["out"])
    torch.testing.assert_close(gh.cpu().double(), ref_gh, **tol["grad"])
    torch.testing.assert_close(gw.cpu().double(), ref_gw, **tol["grad"])
    for i in ignore:
        assert out[i].item() == 0.0 and torch.count_nonzero(gh[i]).item() == 0


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("chunk", [1, 3, None, 1000])
def test_matches_materialized_reference(
    backend: str, device: torch.device, dtype: torch.dtype, chunk: int | None
) -> None:
    check(backend, device, dtype, 13, 16, 97, chunk, temperature=0.8, ignore=(2, 12))


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 20),
    h=st.integers(1, 24),
    v=st.integers(1, 200),
    chunk=st.one_of(st.none(), st.integers(1, 25)),
    temperature=st.floats(0.5, 2.0),
    seed=st.integers(0, 2**16),
)
def test_property_matches_reference(
    backend: str,
    device: torch.device,
    n: int,
    h: int,
    v: int,
    chunk: int | None,
    temperature: float,
    seed: int,
) -> None:
    check(backend, device, torch.float32, n, h, v, chunk, temperature=temperature, seed=seed)


def test_frozen_weight_gets_no_gradient(backend: str, device: torch.device) -> None:
    hidden = torch.randn(5, 8, device=device, requires_grad=True)
    weight = torch.randn(11, 8, device=device)
    with use_backend(backend):
        out = linear_token_logprobs(hidden, weight, torch.randint(0, 11, (5,), device=device))
    out.sum().backward()
    assert hidden.grad is not None and weight.grad is None


@pytest.mark.parametrize(
    "n,h,v,expected",
    [
        (16384, 896, 151936, 1024),  # N / ceil(V/H) = 128, raised to the 1024-row floor
        (65536, 3584, 151936, 1024),  # 1543 -> 2048, capped: fp32 chunk < 1 GiB -> 1024
        (100000, 4096, 32000, 8192),  # 12500 -> 16384, capped at 2^30 / (4 V) -> 8192
        (3, 8, 5, 3),
        (1, 1, 1, 1),
    ],
)
def test_default_chunk_size_bounds_rows_and_chunk_memory(
    n: int, h: int, v: int, expected: int
) -> None:
    chunk = default_chunk_size(n, h, v)
    assert chunk == expected
    assert chunk * v * 4 <= 2**30 or chunk == 1


@pytest.mark.parametrize(
    "shapes, match",
    [
        (((4, 8), (10, 7), (4,)), "hidden size"),
        (((4, 8), (10, 8), (3,)), "targets"),
        (((4,), (10, 8), (4,)), r"\[N, H\]"),
    ],
)
def test_invalid_shapes_raise_value_error(shapes: tuple, match: str) -> None:
    h, w, t = shapes
    with pytest.raises(ValueError, match=match):
        linear_token_logprobs(torch.randn(*h), torch.randn(*w), torch.zeros(*t, dtype=torch.long))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_cuda_vocabulary_chunked_backward(dtype: torch.dtype) -> None:
    """On CUDA the backward walks column blocks of the vocabulary (chunk 8 of 64 rows over
    V=1000 gives 8 blocks of 128 columns, the last one partial): targets land in every
    block and rows are ignored. Then ignore_index equals a block's width (chunk 7 of 16
    rows over V=300: blocks [0, 192) and [192, 300)), which must not turn the rows whose
    target lies in the other block into ignored rows."""
    check("cuda", torch.device("cuda"), dtype, 64, 48, 1000, 8, temperature=0.7, ignore=(0, 33))
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(16, 32, generator=gen, dtype=torch.float64)
    weight = torch.randn(300, 32, generator=gen, dtype=torch.float64) / 32**0.5
    targets = torch.randint(0, 300, (16,), generator=gen)
    targets[3] = 192  # == ignore_index: this row is ignored, the others are not
    hr, wr = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = linear_token_logprobs_reference(hr, wr, targets)
    hd = hidden.float().cuda().requires_grad_()
    wd = weight.float().cuda().requires_grad_()
    with use_backend("cuda"):
        out = linear_token_logprobs(hd, wd, targets.cuda(), chunk_size=7, ignore_index=192)
    gh, gw = torch.autograd.grad(out.sum(), (hd, wd))
    keep = targets != 192
    assert bool((targets > 192).any())  # rows whose target is outside the first block
    tol = TOL[torch.float32]
    torch.testing.assert_close(out.cpu().double()[keep], ref.detach()[keep], **tol["out"])
    assert out[3].item() == 0.0 and torch.count_nonzero(gh[3]).item() == 0
    ref_keep_gh, ref_keep_gw = torch.autograd.grad((ref * keep).sum(), (hr, wr))
    torch.testing.assert_close(gh.cpu().double(), ref_keep_gh, **tol["grad"])
    torch.testing.assert_close(gw.cpu().double(), ref_keep_gw, **tol["grad"])


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 24),
    h=st.integers(1, 16),
    v=st.integers(1, 400),
    chunk=st.integers(1, 30),
    ignore_index=st.sampled_from([-100, 64, 128]),
    seed=st.integers(0, 2**16),
)
def test_vocabulary_chunked_backward_matches_reference(
    n: int, h: int, v: int, chunk: int, ignore_index: int, seed: int
) -> None:
    """The CUDA path's column-block backward, run on CPU through the torch reference (the
    same contract: a target outside the block adds no one-hot term), equals the gradient
    of the materialized reference for any block layout, including an ``ignore_index``
    equal to a block's width (64, 128: blocks are multiples of 64 columns)."""
    from comlrl.kernels._linear_token_logprobs import _backward_vocab_chunks

    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64) / h**0.5
    targets = torch.randint(0, v, (n,), generator=gen)
    targets[torch.rand(n, generator=gen) < 0.2] = ignore_index
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    hr, wr = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = linear_token_logprobs_reference(hr, wr, targets, ignore_index=ignore_index)
    ref_gh, ref_gw = torch.autograd.grad((ref * g).sum(), (hr, wr))
    h32, w32 = hidden.float(), weight.float()
    lse = torch.logsumexp(h32 @ w32.t(), dim=1)
    lse = torch.where(targets == ignore_index, 0.0, lse)
    gh, gw = _backward_vocab_chunks(
        h32, w32, targets, lse, g.float(), 1.0, ignore_index, chunk, True, True, "torch"
    )
    assert gh is not None and gw is not None
    tol = TOL[torch.float32]["grad"]
    torch.testing.assert_close(gh.double(), ref_gh, **tol)
    torch.testing.assert_close(gw.double(), ref_gw, **tol)
