"""token_logprobs: every present backend against the float64 torch reference."""

from __future__ import annotations

import pytest
import torch
from comlrl.kernels import BackendUnavailableError, token_logprobs, use_backend
from comlrl.kernels._reference import token_logprobs_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Tolerances against a float64 reference computed from the same (rounded) logits.
# logp/entropy are accumulated in float32 whatever the input dtype, so they are
# float32-accurate; the gradient is rounded once to the logits dtype (bf16: 8 bits).
TOL = {
    torch.float32: {"out": dict(atol=3e-5, rtol=1e-5), "grad": dict(atol=1e-5, rtol=1e-4)},
    torch.float16: {"out": dict(atol=5e-5, rtol=1e-5), "grad": dict(atol=1e-4, rtol=2e-3)},
    torch.bfloat16: {"out": dict(atol=5e-5, rtol=1e-5), "grad": dict(atol=1e-5, rtol=1e-2)},
}
DTYPES = list(TOL)
IGNORE = -100


def check_against_reference(
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    n: int,
    v: int,
    *,
    temperature: float = 1.0,
    entropy: bool = True,
    ignore_rows: tuple[int, ...] = (),
    row_pad: int = 0,
    col_offset: int = 0,
    scale: float = 3.0,
    seed: int = 0,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    wide = (torch.randn(n, col_offset + v + row_pad, generator=gen) * scale).to(dtype)
    targets = torch.randint(0, v, (n,), generator=gen)
    for i in ignore_rows:
        targets[i] = IGNORE
    g_logp = torch.randn(n, generator=gen)
    g_ent = torch.randn(n, generator=gen)

    ref_in = wide[:, col_offset : col_offset + v].double().requires_grad_()
    ref_lp, ref_ent = token_logprobs_reference(
        ref_in, targets, temperature=temperature, return_entropy=True, ignore_index=IGNORE
    )
    ref_loss = (ref_lp * g_logp).sum() + ((ref_ent * g_ent).sum() if entropy else 0.0)
    (ref_grad,) = torch.autograd.grad(ref_loss, ref_in)

    # rows strided if row_pad or col_offset > 0; col_offset also misaligns the first row
    x = wide.to(device)[:, col_offset : col_offset + v].detach().requires_grad_()
    base = x.detach().clone()
    with use_backend(backend):
        out = token_logprobs(
            x,
            targets.to(device),
            temperature=temperature,
            return_entropy=entropy,
            ignore_index=IGNORE,
        )
    lp, ent = out if entropy else (out, None)
    assert lp.dtype == torch.float32 and lp.shape == (n,)
    loss = (lp * g_logp.to(device)).sum()
    if ent is not None:
        assert ent.dtype == torch.float32 and ent.shape == (n,)
        loss = loss + (ent * g_ent.to(device)).sum()
    loss.backward()
    assert x.grad is not None and x.grad.dtype == dtype

    tol = TOL[dtype]
    torch.testing.assert_close(lp.cpu().double(), ref_lp.detach(), **tol["out"])
    if ent is not None:
        torch.testing.assert_close(ent.cpu().double(), ref_ent.detach(), **tol["out"])
    # Gradient: p = exp(z - lse) is evaluated in float32 with z = x / T and lse both of
    # magnitude up to zmax, so (z - lse) carries ~4 ulp(zmax) of absolute error, i.e. p a
    # relative error of ~4 * 2**-24 * zmax; each gradient element is |g| / T * p times
    # that (times |z - lse + H| <= zmax + 1 more for the entropy term). With large logits
    # and a small temperature (zmax ~ 75) this exceeds the flat 1e-5 (hypothesis found
    # V=1, T=0.3, scale 9: error 1.08e-5 where the exact gradient is 0).
    zmax = float(wide.double().abs().max()) / temperature
    gmax = float(g_logp.abs().max()) + (float(g_ent.abs().max()) * (zmax + 1) if entropy else 0)
    grad_tol = dict(tol["grad"])
    grad_tol["atol"] = max(grad_tol["atol"], 4 * 2.0**-24 * zmax * gmax / temperature)
    torch.testing.assert_close(x.grad.cpu().double(), ref_grad, **grad_tol)
    for i in ignore_rows:
        assert lp[i].item() == 0.0
        assert torch.count_nonzero(x.grad[i]).item() == 0
    assert torch.equal(x.detach(), base), "the backward modified the logits"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,v", [(1, 1), (1, 3), (4, 257), (3, 1031), (33, 64), (2, 8)])
def test_matches_reference_on_odd_shapes(
    backend: str, device: torch.device, dtype: torch.dtype, n: int, v: int
) -> None:
    check_against_reference(backend, device, dtype, n, v, temperature=0.7)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_baseline_instruction_set_matches_reference(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """The C++ row kernels are built twice (baseline and AVX2); cover the baseline too."""
    from comlrl.kernels import _dispatch

    if _dispatch._cpu is None:
        pytest.skip("_cpu module not built")
    monkeypatch.setenv("COMLRL_KERNELS_CPU_ISA", "base")
    assert _dispatch._cpu.isa() == "base"
    check_against_reference(
        "cpu", torch.device("cpu"), dtype, 5, 3001, temperature=0.6, ignore_rows=(2,), row_pad=3
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_reference_on_qwen_vocab_151936(
    backend: str, device: torch.device, dtype: torch.dtype
) -> None:
    check_against_reference(backend, device, dtype, 2, 151936, temperature=0.9, ignore_rows=())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row_pad", [1, 37])
def test_strided_rows_from_a_wider_tensor(
    backend: str, device: torch.device, dtype: torch.dtype, row_pad: int
) -> None:
    check_against_reference(backend, device, dtype, 5, 300, row_pad=row_pad, temperature=1.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("col_offset", [1, 3])
def test_misaligned_row_starts(
    backend: str, device: torch.device, dtype: torch.dtype, col_offset: int
) -> None:
    """Rows starting off a 16-byte boundary (base pointer and row stride both odd):
    the vectorized CUDA path must fall back (or peel) without reading out of the row."""
    check_against_reference(
        backend,
        device,
        dtype,
        9,
        1031,
        col_offset=col_offset,
        row_pad=2,
        temperature=0.8,
        ignore_rows=(4,),
    )


@pytest.mark.parametrize("temperature", [0.25, 1.0, 3.0])
def test_temperature_is_applied_before_softmax(
    backend: str, device: torch.device, temperature: float
) -> None:
    check_against_reference(backend, device, torch.float32, 6, 129, temperature=temperature)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ignored_targets_give_zero_logp_and_zero_gradient(
    backend: str, device: torch.device, dtype: torch.dtype
) -> None:
    check_against_reference(backend, device, dtype, 6, 100, ignore_rows=(0, 3, 5))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_logp_only_gradient_matches(backend: str, device: torch.device, dtype: torch.dtype) -> None:
    check_against_reference(backend, device, dtype, 9, 77, entropy=False, temperature=1.5)


def test_there_is_no_in_place_backward() -> None:
    """``inplace_backward`` is gone: its kernel does the out-of-place backward's memory
    traffic, so it saved one [N, V] buffer at no speed gain while destroying logits that
    another op may have saved for its own backward (the fused linear_token_logprobs saves
    the memory without that hazard)."""
    logits = torch.randn(2, 5, requires_grad=True)
    with pytest.raises(TypeError, match="inplace_backward"):
        token_logprobs(logits, torch.tensor([0, 1]), inplace_backward=True)  # type: ignore[call-overload]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradient_of_non_leaf_logits_leaves_them_as_they_were(
    backend: str, device: torch.device, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(4, 50, generator=gen).to(device=device, dtype=dtype)
    leaf = base.clone().requires_grad_()
    logits = leaf * 1.0  # non-leaf, as logits from an lm_head are
    logits.retain_grad()
    with use_backend(backend):
        token_logprobs(logits, torch.tensor([1, 2, IGNORE, 4], device=device)).sum().backward()
    assert logits.grad is not None and torch.count_nonzero(logits.grad[2]).item() == 0
    torch.testing.assert_close(logits.detach(), base, atol=0, rtol=0)
    torch.testing.assert_close(leaf.grad, logits.grad, atol=0, rtol=0)


def test_forward_saves_per_row_lse_not_an_n_by_v_float32_tensor(
    backend: str, device: torch.device
) -> None:
    logits = torch.randn(8, 1000, device=device, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 1000, (8,), device=device)
    with use_backend(backend):
        logp = token_logprobs(logits, targets)
    saved = [t for t in logp.grad_fn.saved_tensors if t is not None]
    big = [t for t in saved if t.numel() >= 8 * 1000]
    assert len(big) == 1 and big[0].dtype == torch.bfloat16, [(t.dtype, t.shape) for t in saved]
    assert any(t.dtype == torch.float32 and t.shape == (8,) for t in saved)


def test_masked_vocab_entries_at_minus_infinity(backend: str, device: torch.device) -> None:
    logits = torch.randn(3, 40, dtype=torch.float64)
    logits[:, 10:30] = float("-inf")
    targets = torch.tensor([0, 5, 35])
    ref = logits.clone().requires_grad_()
    ref_lp, ref_ent = token_logprobs_reference(ref, targets, return_entropy=True)
    (ref_lp.sum() + ref_ent.sum()).backward()
    x = logits.float().to(device).requires_grad_()
    with use_backend(backend):
        lp, ent = token_logprobs(x, targets.to(device), return_entropy=True)
    (lp.sum() + ent.sum()).backward()
    torch.testing.assert_close(lp.cpu().double(), ref_lp.detach(), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent.cpu().double(), ref_ent.detach(), atol=2e-5, rtol=1e-5)
    assert torch.isfinite(x.grad).all()
    torch.testing.assert_close(x.grad.cpu().double(), ref.grad, atol=1e-5, rtol=1e-4)


def test_nan_in_an_otherwise_masked_block_poisons_only_its_row(
    backend: str, device: torch.device
) -> None:
    """A NaN hidden among -inf entries (a whole block/vector otherwise masked) is not dropped."""
    logits = torch.randn(2, 4100, dtype=torch.float32)
    logits[0, :2100] = float("-inf")  # covers at least one full block of every backend
    logits[0, 7] = float("nan")
    targets = torch.tensor([3000, 3])
    with use_backend(backend):
        lp = token_logprobs(logits.to(device), targets.to(device))
    ref = token_logprobs_reference(logits.double(), targets)
    assert torch.isnan(ref[0]) and torch.isnan(lp[0].cpu())
    torch.testing.assert_close(lp[1].cpu().double(), ref[1], atol=2e-5, rtol=1e-5)


def test_extreme_logit_magnitudes_stay_finite(backend: str, device: torch.device) -> None:
    logits = torch.tensor([[1e4, -1e4, 0.0, 3e4], [-5e4, -5e4 + 1.0, -5e4 + 2.0, -5e4]])
    targets = torch.tensor([1, 2])
    ref_lp, ref_ent = token_logprobs_reference(logits.double(), targets, return_entropy=True)
    with use_backend(backend):
        lp, ent = token_logprobs(logits.to(device), targets.to(device), return_entropy=True)
    # |logits| ~ 5e4: one float32 ulp is 0.004, so logp is only float32-accurate to ~2e-3.
    torch.testing.assert_close(lp.cpu().double(), ref_lp, atol=5e-3, rtol=1e-6)
    torch.testing.assert_close(ent.cpu().double(), ref_ent, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["torch", "cpu"])
@pytest.mark.parametrize("bad", [-1, 10, 1000])
def test_out_of_range_target_raises_with_its_index(name: str, bad: int) -> None:
    from comlrl.kernels import _dispatch

    if name == "cpu" and _dispatch._cpu is None:
        pytest.skip("_cpu module not built")
    logits = torch.randn(3, 10)
    targets = torch.tensor([1, bad, 2])
    with use_backend(name), pytest.raises(ValueError, match=r"targets\[1\] = " + str(bad)):
        token_logprobs(logits, targets)


def test_gradcheck_reference_in_float64() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.tensor([0, 6, IGNORE, 3])

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = token_logprobs_reference(x, targets, temperature=0.8, return_entropy=True)
        assert isinstance(out, tuple)
        return out

    assert torch.autograd.gradcheck(f, (logits,))


def test_gradcheck_autograd_function_in_float64() -> None:
    """The hand-written backward (torch backend serves float64) against finite differences."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 9, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.tensor([0, 8, IGNORE, 3, 4])

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = token_logprobs(x, targets, temperature=1.7, return_entropy=True)
        assert isinstance(out, tuple)
        return out

    assert torch.autograd.gradcheck(f, (logits,))


def test_float64_logits_use_the_reference_under_auto_and_refuse_a_forced_cpu() -> None:
    logits = torch.randn(2, 5, dtype=torch.float64)
    targets = torch.tensor([1, 2])
    out = token_logprobs(logits, targets)
    assert out.dtype == torch.float64
    from comlrl.kernels import _dispatch

    if _dispatch._cpu is not None:
        with use_backend("cpu"), pytest.raises(BackendUnavailableError, match="float64"):
            token_logprobs(logits, targets)


def test_column_strided_logits_are_copied_to_contiguous(backend: str, device: torch.device) -> None:
    base = torch.randn(50, 6, device=device)
    logits = base.t()  # [6, 50], stride (1, 6)
    targets = torch.randint(0, 50, (6,), device=device)
    with use_backend(backend):
        lp = token_logprobs(logits, targets)
    ref = token_logprobs_reference(logits.cpu().double(), targets.cpu())
    torch.testing.assert_close(lp.cpu().double(), ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(logits=torch.randn(3), targets=torch.zeros(3, dtype=torch.long)), "N, V"),
        (dict(logits=torch.randn(3, 4), targets=torch.zeros(2, dtype=torch.long)), "targets"),
        (dict(logits=torch.randn(3, 4), targets=torch.zeros(3)), "integer"),
        (
            dict(
                logits=torch.randn(3, 4), targets=torch.zeros(3, dtype=torch.long), temperature=0.0
            ),
            "temperature",
        ),
    ],
)
def test_invalid_arguments_raise_value_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        token_logprobs(**kwargs)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 6),
    v=st.integers(1, 300),
    dtype=st.sampled_from(DTYPES),
    temperature=st.floats(0.3, 3.0),
    scale=st.floats(0.1, 20.0),
    entropy=st.booleans(),
    ignore_first=st.booleans(),
    row_pad=st.sampled_from([0, 3]),
    seed=st.integers(0, 2**16),
)
def test_property_matches_reference(
    backend: str,
    device: torch.device,
    n: int,
    v: int,
    dtype: torch.dtype,
    temperature: float,
    scale: float,
    entropy: bool,
    ignore_first: bool,
    row_pad: int,
    seed: int,
) -> None:
    check_against_reference(
        backend,
        device,
        dtype,
        n,
        v,
        temperature=temperature,
        entropy=entropy,
        ignore_rows=(0,) if ignore_first else (),
        row_pad=row_pad,
        scale=scale,
        seed=seed,
    )


def test_ignored_rows_with_large_logits_get_exactly_zero_gradient(
    backend: str, device: torch.device
) -> None:
    """Regression: an ignored row's logits must not leak inf/NaN into its zero gradient."""
    logits = torch.full((2, 44), 100.0, device=device)
    logits[:, 0] = 120.0
    logits.requires_grad_()
    targets = torch.tensor([IGNORE, 3], device=device)
    with use_backend(backend):
        lp = token_logprobs(logits, targets, temperature=0.3125)
    lp.sum().backward()
    assert torch.count_nonzero(logits.grad[0]).item() == 0
    assert torch.isfinite(logits.grad).all()


def test_broadcast_rows_give_the_reference_gradient(backend: str, device: torch.device) -> None:
    row = torch.randn(1, 30, device=device)
    logits = row.expand(4, 30)  # stride (0, 1): rows share memory
    targets = torch.tensor([0, 1, 2, 3], device=device)
    leaf = logits.detach().requires_grad_()
    with use_backend(backend):
        lp = token_logprobs(leaf, targets)
    lp.sum().backward()
    ref_in = logits.double().contiguous().requires_grad_()
    token_logprobs_reference(
        ref_in, targets.cpu() if device.type == "cpu" else targets
    ).sum().backward()
    torch.testing.assert_close(leaf.grad.cpu().double(), ref_in.grad.cpu(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(row.expand(4, 30), logits)  # the caller's storage is untouched
