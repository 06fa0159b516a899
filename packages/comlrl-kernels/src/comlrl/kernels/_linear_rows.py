"""linear_rows: ``F.linear`` for a few rows of float32 on CPU, at memory speed.

A decode step of an LLM is a chain of linears over a few rows (one token per sequence):
each reads its whole weight once and does ``2 * rows`` FLOPs per weight element, so its
time is the weight's bytes over the memory bandwidth. torch's float32 GEMM (MKL here)
streams the weight at 4-11 GB/s for 1-4 rows on the build machine, where a streaming
``x.sum()`` reads ~26 GB/s; the C++ kernel (``csrc/cpu_linear.cpp``) reads each weight
row once into registers and multiplies it with every row of ``x`` (see
``benchmarks/bench_linear_rows.py`` and the package README for the measured speeds).
Above :data:`MAX_ROWS` rows torch's blocked GEMM is as fast or faster, so those calls
stay on ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _dispatch as dispatch

__all__ = ["MAX_ROWS", "FewRowsLinear", "linear_rows", "linear_rows_unsupported"]

#: Most rows the C++ kernel takes; more go to ``F.linear``. Measured with
#: ``benchmarks/bench_linear_rows.py`` (one thread, float32, the SmolLM2-135M shapes
#: 960x576, 3072x576, 576x1536, 49152x576; load ~10 on 2 cores): the kernel is 1.7-2.5x
#: torch at 1 row, 0.85-3.3x at 4 rows, 0.67-1.24x at 8 and 0.44-1.07x at 12-16 rows.
MAX_ROWS = 4


def _check_shapes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear_rows: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit; "
            f"expected x [..., K] and weight [N, K]"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(
            f"linear_rows: bias {tuple(bias.shape)} does not fit weight "
            f"{tuple(weight.shape)}; expected bias [N] = [{weight.shape[0]}]"
        )


def linear_rows_unsupported(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> str | None:
    """Why the C++ kernel cannot take this call (``None`` when it can).

    The kernel takes float32 CPU tensors, ``1 <= rows <= MAX_ROWS`` (rows = the product
    of ``x``'s leading dimensions), ``K >= 1``, ``N >= 1``, a weight whose rows are
    contiguous (unit inner stride; any row stride >= K), and no autograd graph (it has no
    backward). ``x`` and ``bias`` of any layout are accepted (copied when needed: they are
    small).
    """
    tensors = [x, weight] if bias is None else [x, weight, bias]
    if any(t.dtype != torch.float32 for t in tensors):
        return f"dtypes {[str(t.dtype) for t in tensors]}: the kernel is float32 only"
    if any(t.device.type != "cpu" for t in tensors):
        return f"devices {[str(t.device) for t in tensors]}: the kernel runs on CPU tensors"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "an input requires grad: the kernel has no backward (F.linear serves)"
    n, k = weight.shape
    rows = x.numel() // k if k else 0
    if k == 0 or n == 0 or rows == 0:
        return f"empty operands (rows={rows}, K={k}, N={n})"
    if rows > MAX_ROWS:
        return f"{rows} rows > MAX_ROWS={MAX_ROWS}: torch's GEMM is as fast from there on"
    if weight.stride(1) != 1 or (n > 1 and weight.stride(0) < k):
        return (
            f"weight strides {weight.stride()}: the kernel needs contiguous weight rows "
            f"(unit inner stride); pass weight.contiguous() once and reuse it"
        )
    return None


def linear_rows(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``y = x @ weight.T + bias`` (``F.linear``), in C++ for a few float32 CPU rows.

    Args:
        x: ``[..., K]`` float32; its leading dimensions hold R rows. Any strides.
        weight: ``[N, K]`` float32, rows contiguous (unit inner stride) for the kernel.
        bias: ``[N]`` float32, or None.

    Returns:
        ``[..., N]`` float32, a new contiguous tensor. From the kernel the values equal
        ``F.linear``'s to rounding, not bit for bit (another summation order; each output
        is within ``gamma_{K+1} * (sum_i |x_i w_i| + |b|)`` of the exact value,
        ``gamma_n = n u / (1 - n u)``, ``u = 2**-24``, as for any float32 sum).

    Calls the kernel cannot take (:func:`linear_rows_unsupported`: other dtypes or
    devices, more than :data:`MAX_ROWS` rows, inputs that need a gradient, weights with
    a non-unit inner stride) go to ``F.linear`` under the ``auto`` backend; forced to
    ``cpu`` (``use_backend("cpu")`` / ``COMLRL_KERNELS_BACKEND=cpu``) they raise
    :class:`~comlrl.kernels.BackendUnavailableError` with the reason. Threads: the output
    columns are split over ``torch.get_num_threads()`` threads when each gets >= 2M
    weight elements (the LM head of a 135M model, not its layers).

    Raises:
        ValueError: ``x``, ``weight`` and ``bias`` shapes do not fit (any backend).
    """
    _check_shapes(x, weight, bias)
    backend = dispatch.select("linear_rows", x.device, linear_rows_unsupported(x, weight, bias))
    if backend != "cpu":  # torch, or cuda (no CUDA kernel for this op: F.linear is cuBLAS)
        return F.linear(x, weight, bias)

    def native() -> torch.Tensor:
        n, k = weight.shape
        x2 = x.reshape(-1, k)
        rows = x2.shape[0]
        if x2.stride(1) != 1 or (rows > 1 and x2.stride(0) < k):
            x2 = x2.contiguous()
        b = None if bias is None else bias.contiguous()
        y = torch.empty(rows, n, dtype=torch.float32)
        dispatch.cpu_module().linear_rows(
            x2.data_ptr(),
            rows,
            k,
            x2.stride(0) if rows > 1 else k,
            weight.data_ptr(),
            n,
            weight.stride(0) if n > 1 else k,
            0 if b is None else b.data_ptr(),
            y.data_ptr(),
            dispatch.num_threads(),
        )
        return y.view(*x.shape[:-1], n)

    return dispatch.run("linear_rows", backend, native, lambda: F.linear(x, weight, bias))[0]


class FewRowsLinear:
    """``F.linear(x, weight, bias)`` with the weight checked once: for decode loops.

    :func:`linear_rows` checks every operand and asks the dispatcher on each call, which
    costs several microseconds: over the ~120 linears of a decode step that is more than
    the kernel saves on small weights. Here the weight and bias are checked, and the
    backend picked (:func:`~comlrl.kernels.use_backend` / ``COMLRL_KERNELS_BACKEND`` as
    they are now), when the object is made; a call only checks ``x``.

    Args:
        weight: ``[N, K]``; the kernel serves when it is float32 on CPU with unit inner
            stride (see :func:`linear_rows_unsupported`), else every call is ``F.linear``.
        bias: ``[N]`` or None.

    Calling it with ``x [R, K]`` returns ``[R, N]``: from the kernel when :attr:`native`
    and ``x`` is a float32 CPU matrix of ``1 <= R <= MAX_ROWS`` rows and no gradient is
    being recorded for it or the weight, else from ``F.linear`` (same values to rounding:
    see :func:`linear_rows`).

    Raises:
        ValueError: ``weight`` and ``bias`` shapes do not fit.
        BackendUnavailableError: the ``cpu`` backend is forced and the weight cannot go
            to the kernel.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if weight.dim() != 2:
            raise ValueError(f"FewRowsLinear: weight must be [N, K], got {tuple(weight.shape)}")
        _check_shapes(weight.new_empty(1, weight.shape[1]), weight, bias)
        self.weight = weight
        self.bias = None if bias is None else bias.contiguous()
        with torch.no_grad():  # the weight's own requires_grad is checked per call
            reason = linear_rows_unsupported(weight.new_empty(1, weight.shape[1]), weight, bias)
        #: whether calls can go to the C++ kernel (else every call is ``F.linear``).
        self.native = dispatch.select("linear_rows", weight.device, reason) == "cpu"
        self._n, self._k = int(weight.shape[0]), int(weight.shape[1])
        self._w_stride = int(weight.stride(0)) if self._n > 1 else self._k

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [R, K]`` -> ``[R, N]`` (see the class docstring)."""
        rows = x.shape[0] if x.dim() == 2 else 0
        if (
            not self.native
            or not 1 <= rows <= MAX_ROWS
            or x.dtype != torch.float32
            or x.device.type != "cpu"
            or x.shape[1] != self._k
            or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        ):
            return F.linear(x, self.weight, self.bias)
        if not x.is_contiguous():
            x = x.contiguous()
        y = torch.empty(rows, self._n, dtype=torch.float32)
        b = self.bias
        dispatch.cpu_module().linear_rows(
            x.data_ptr(),
            rows,
            self._k,
            self._k,
            self.weight.data_ptr(),
            self._n,
            self._w_stride,
            0 if b is None else b.data_ptr(),
            y.data_ptr(),
            dispatch.num_threads(),
        )
        return y
