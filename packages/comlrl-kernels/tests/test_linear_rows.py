"""linear_rows against F.linear: error bound, edge shapes, layouts, and where it falls back.

The reference is ``F.linear`` in float64 on the same float32 inputs. The kernel sums in
another order than BLAS, so the check is the textbook bound for a float32 inner product
in any order (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5):
``|y - y_exact| <= gamma_{K+1} * (sum_i |x_i w_i| + |b|)``, ``gamma_n = n u / (1 - n u)``,
``u = 2**-24`` (K products and the bias add; an FMA rounds less, never more). The
float64 reference itself is off by ~K * 2**-53 relative, covered by a 1% margin.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from comlrl.kernels import (
    BackendUnavailableError,
    FewRowsLinear,
    _dispatch,
    linear_rows,
    use_backend,
)
from comlrl.kernels._linear_rows import MAX_ROWS, linear_rows_unsupported
from hypothesis import given, settings
from hypothesis import strategies as st

needs_cpu = pytest.mark.skipif(_dispatch._cpu is None, reason="_cpu module not built")
# COMLRL_KERNELS_CPU_ISA: every build this CPU runs (base, avx2, avx512) and the automatic pick
ISAS = ["auto", *(_dispatch._cpu.isas() if _dispatch._cpu is not None else [])]
U = 2.0**-24


class Spy:
    """Stands in for the _cpu module and counts the calls that reach it."""

    def __init__(self, real: object) -> None:
        self.real, self.calls = real, 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls += 1
            return getattr(self.real, name)(*args, **kwargs)

        return call


def assert_within_bound(
    y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
) -> None:
    """``y`` is within the float32 inner-product error bound of the exact float64 value."""
    k = w.shape[1]
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    mag = F.linear(x.double().abs(), w.double().abs(), None if b is None else b.double().abs())
    gamma = (k + 1) * U / (1 - (k + 1) * U)
    bound = 1.01 * gamma * mag + 1e-35  # 1e-35: products that underflow to subnormals
    err = (y.double() - exact).abs()
    worst = int((err - bound).argmax()) if err.numel() else 0
    assert bool((err <= bound).all()), (
        f"max error over bound at flat index {worst}: "
        f"{err.flatten()[worst].item():.3g} > {bound.flatten()[worst].item():.3g}"
    )


def operands(
    rows: int, k: int, n: int, bias: bool, seed: int, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * scale
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    return x, w, b


@needs_cpu
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, MAX_ROWS),
    k=st.integers(1, 200),
    n=st.integers(1, 40),
    bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    log_scale=st.integers(-20, 20),
    isa=st.sampled_from(ISAS),
)
def test_kernel_is_within_the_float32_sum_bound_of_the_exact_result(
    rows: int, k: int, n: int, bias: bool, seed: int, log_scale: int, isa: str
) -> None:
    x, w, b = operands(rows, k, n, bias, seed, 2.0**log_scale)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMLRL_KERNELS_CPU_ISA", isa)
        with use_backend("cpu"):
            y = linear_rows(x, w, b)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    assert_within_bound(y, x, w, b)


@needs_cpu
@pytest.mark.parametrize(
    "k", [1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 127, 129, 576]
)
@pytest.mark.parametrize("bias", [False, True])
def test_edge_shapes_every_row_count(monkeypatch: pytest.MonkeyPatch, k: int, bias: bool) -> None:
    # K around the vector widths and unrolled steps (4/8/16 lanes, x1/x2/x4), N around
    # the weight-row tiles (2/3/4, the next tile prefetched from 2 tiles on), rows
    # 1..MAX_ROWS around the row tile (4), on each instruction-set build.
    for isa in ISAS:
        monkeypatch.setenv("COMLRL_KERNELS_CPU_ISA", isa)
        for n in (1, 2, 3, 4, 5, 7, 8, 9, 13):
            for rows in range(1, MAX_ROWS + 1):
                x, w, b = operands(rows, k, n, bias, seed=rows * 1000 + k * 10 + n)
                with use_backend("cpu"):
                    y = linear_rows(x, w, b)
                assert_within_bound(y, x, w, b)


@needs_cpu
def test_isas_lists_the_builds_this_cpu_runs_and_the_override_picks_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    isas = _dispatch._cpu.isas()
    assert isas[0] == "base" and set(isas) <= {"base", "avx2", "avx512"}
    monkeypatch.delenv("COMLRL_KERNELS_CPU_ISA", raising=False)
    assert _dispatch._cpu.isa() == isas[-1]  # the widest one by default
    for isa in isas:
        monkeypatch.setenv("COMLRL_KERNELS_CPU_ISA", isa)
        assert _dispatch._cpu.isa() == isa


@needs_cpu
def test_an_unknown_or_unrunnable_isa_override_raises_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMLRL_KERNELS_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="COMLRL_KERNELS_CPU_ISA=sse9 is not one of"):
        _dispatch._cpu.isa()
    missing = [i for i in ("avx2", "avx512") if i not in _dispatch._cpu.isas()]
    if missing:
        monkeypatch.setenv("COMLRL_KERNELS_CPU_ISA", missing[-1])
        with pytest.raises(RuntimeError, match=f"={missing[-1]}: this build or CPU cannot"):
            _dispatch._cpu.isa()


@needs_cpu
def test_leading_dimensions_are_rows() -> None:
    x, w, b = operands(4, 40, 11, True, seed=1)
    with use_backend("cpu"):
        y = linear_rows(x.view(2, 2, 40), w, b)
    assert y.shape == (2, 2, 11)
    assert_within_bound(y.view(4, 11), x, w, b)


@needs_cpu
def test_strided_layouts_are_served_by_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(_dispatch._cpu)
    monkeypatch.setattr(_dispatch, "cpu_module", lambda: spy)
    g = torch.Generator().manual_seed(2)
    wide = torch.randn(4, 70, generator=g)
    x = wide[:, 3:53]  # row stride 70, unit inner stride
    xt = torch.randn(50, 4, generator=g).t()  # inner stride 4: copied
    w_all = torch.randn(18, 60, generator=g)
    w = w_all[::2, 5:55]  # every other row: row stride 120
    b_all = torch.randn(18, generator=g)
    b = b_all[::2]  # strided bias: copied
    with use_backend("cpu"):
        for xi in (x, xt):
            assert_within_bound(linear_rows(xi, w, b), xi, w, b)
    assert spy.calls == 2


@needs_cpu
def test_threads_split_columns_without_changing_results() -> None:
    # 2 threads need >= 2 x 2M weight elements; each column is computed the same way.
    x, w, b = operands(3, 256, 16500, True, seed=3)
    assert b is not None
    outs = []
    for threads in (1, 2):
        y = torch.empty(3, 16500)
        _dispatch.cpu_module().linear_rows(
            x.data_ptr(), 3, 256, 256, w.data_ptr(), 16500, 256, b.data_ptr(), y.data_ptr(), threads
        )
        outs.append(y)
    assert torch.equal(outs[0], outs[1])
    assert_within_bound(outs[1], x, w, b)


@pytest.mark.parametrize(
    "case, why",
    [
        ("float64", "float32 only"),
        ("too_many_rows", "MAX_ROWS"),
        ("requires_grad", "no backward"),
        ("weight_transposed", "unit inner stride"),
        ("empty", "empty operands"),
    ],
)
def test_unsupported_calls_fall_back_to_f_linear(
    monkeypatch: pytest.MonkeyPatch, case: str, why: str
) -> None:
    x, w, b = operands(4, 24, 10, True, seed=4)
    if case == "float64":
        x, w, b = x.double(), w.double(), b.double()  # type: ignore[union-attr]
    elif case == "too_many_rows":
        x = torch.randn(MAX_ROWS + 1, 24)
    elif case == "requires_grad":
        w.requires_grad_(True)
    elif case == "weight_transposed":
        w = w.t().contiguous().t()
    elif case == "empty":
        x = x[:0]
    reason = linear_rows_unsupported(x, w, b)
    assert reason is not None and why in reason
    spy = Spy(_dispatch._cpu)
    monkeypatch.setattr(_dispatch, "cpu_module", lambda: spy)
    y = linear_rows(x, w, b)
    assert spy.calls == 0
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=0, atol=0)
    if case == "requires_grad":
        y.sum().backward()
        assert w.grad is not None
    if _dispatch._cpu is not None:
        with use_backend("cpu"), pytest.raises(BackendUnavailableError, match=why):
            linear_rows(x, w, b)


@needs_cpu
def test_auto_uses_the_kernel_for_supported_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(_dispatch._cpu)
    monkeypatch.setattr(_dispatch, "cpu_module", lambda: spy)
    x, w, b = operands(2, 24, 10, False, seed=5)
    with torch.no_grad():
        w.requires_grad_(True)  # no graph is recorded under no_grad: the kernel serves
        linear_rows(x, w, b)
    assert spy.calls == 1
    with use_backend("torch"):
        linear_rows(x, w.detach(), b)
    assert spy.calls == 1


def test_mismatched_shapes_raise_value_error_naming_them() -> None:
    with pytest.raises(ValueError, match=r"x \(2, 5\) and weight \(3, 4\)"):
        linear_rows(torch.randn(2, 5), torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"bias \(4,\)"):
        linear_rows(torch.randn(2, 4), torch.randn(3, 4), torch.randn(4))


@needs_cpu
def test_few_rows_linear_serves_supported_calls_from_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = Spy(_dispatch._cpu)
    monkeypatch.setattr(_dispatch, "cpu_module", lambda: spy)
    x, w, b = operands(3, 33, 7, True, seed=6)
    op = FewRowsLinear(w, b)
    assert op.native
    assert_within_bound(op(x), x, w, b)
    assert_within_bound(op(x.t().contiguous().t()), x, w, b)  # copied, then the kernel
    assert spy.calls == 2
    # more rows, another dtype, a gradient to record: F.linear, exactly
    for xi in (torch.randn(MAX_ROWS + 1, 33), x.double()):
        wi, bi = (w.double(), b.double()) if xi.dtype == torch.float64 else (w, b)  # type: ignore[union-attr]
        torch.testing.assert_close(FewRowsLinear(wi, bi)(xi), F.linear(xi, wi, bi), rtol=0, atol=0)
    xg = x.clone().requires_grad_(True)
    op(xg).sum().backward()
    assert xg.grad is not None
    assert spy.calls == 2


@needs_cpu
def test_few_rows_linear_takes_the_backend_in_force_when_made() -> None:
    x, w, _ = operands(2, 16, 4, False, seed=7)
    with use_backend("torch"):
        op = FewRowsLinear(w)
    assert not op.native
    torch.testing.assert_close(op(x), F.linear(x, w), rtol=0, atol=0)
    with use_backend("cpu"), pytest.raises(BackendUnavailableError, match="unit inner stride"):
        FewRowsLinear(w.t().contiguous().t())
