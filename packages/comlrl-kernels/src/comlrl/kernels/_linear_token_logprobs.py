"""linear_token_logprobs: lm_head matmul fused with token_logprobs, chunked over tokens.

Only one chunk of logits exists at a time: [chunk, V] rows in the forward; in the backward
(where it is recomputed and then overwritten in place by its gradient) [chunk, V] rows on
CPU, and on CUDA [N, V * chunk / N] columns, so the weight gradient of a column block is
one GEMM over all rows and only a float32 [N, H] accumulator (for the hidden gradient) is
kept instead of a float32 [V, H] one.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import _dispatch as dispatch
from ._token_logprobs import (
    token_logprobs_backward,
    token_logprobs_forward,
    token_logprobs_unsupported,
)

__all__ = ["default_chunk_size", "linear_token_logprobs"]


MIN_CHUNK_ROWS = 1024
MAX_CHUNK_LOGITS_BYTES = 1 << 30  # counted as float32


def default_chunk_size(n: int, hidden: int, vocab: int) -> int:
    """Rows per chunk.

    Start from N / ceil(V / H) (a chunk of logits about as large as the hidden states),
    raise it to at least 1024 rows (every chunk re-reads the whole [V, H] weight, so tiny
    chunks are bandwidth-bound), cap it so a float32 chunk of logits stays under 1 GiB,
    round to a power of two, and never exceed N.
    """
    pieces = max(1, math.ceil(vocab / max(1, hidden)))
    rows = max(1, math.ceil(n / pieces), MIN_CHUNK_ROWS)
    rows = 1 << (rows - 1).bit_length()
    cap = max(1, MAX_CHUNK_LOGITS_BYTES // (4 * max(1, vocab)))
    rows = min(rows, 1 << (cap.bit_length() - 1))
    return max(1, min(n, rows))


def _accumulate_weight_grad(grad_w: torch.Tensor, gl: torch.Tensor, h: torch.Tensor) -> None:
    """grad_w [V, H] float32 += gl.T [V, C] @ h [C, H], with no [V, H] temporary where
    the backend can: float32 inputs use addmm_; float16/bfloat16 inputs on CUDA use
    cuBLAS with a float32 output (``out_dtype``), so each chunk's product is accumulated
    in float32 without a rounded low-precision copy; elsewhere (CPU) one [V, H] product
    per chunk is formed and upcast as it is added."""
    if gl.dtype != torch.float32 and not gl.is_cuda:  # no float32-output GEMM on CPU
        grad_w.add_(gl.t() @ h)
        return
    _accumulate_into_float32(grad_w, gl.t(), h)


class _LinearTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        ignore_index: int,
        chunk: int,
        backend: str,
    ) -> torch.Tensor:
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        used = backend
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            logits = hidden[s:e] @ weight.t()
            lp, ls, _, used = token_logprobs_forward(
                backend, logits, targets[s:e], temperature, False, ignore_index
            )
            logp[s:e] = lp
            lse[s:e] = ls
            del logits
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.config = (temperature, ignore_index, chunk, used)
        return logp

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors
        temperature, ignore_index, chunk, backend = ctx.config
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g = g.to(torch.float32).contiguous()
        if backend == "cuda":
            grad_h, grad_w = _backward_vocab_chunks(
                hidden,
                weight,
                targets,
                lse,
                g,
                temperature,
                ignore_index,
                chunk,
                need_h,
                need_w,
                "cuda",
            )
        else:
            grad_h, grad_w = _backward_row_chunks(
                hidden,
                weight,
                targets,
                lse,
                g,
                temperature,
                ignore_index,
                chunk,
                backend,
                need_h,
                need_w,
            )
        return grad_h, grad_w, None, None, None, None, None


def _backward_row_chunks(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    g: torch.Tensor,
    temperature: float,
    ignore_index: int,
    chunk: int,
    backend: str,
    need_h: bool,
    need_w: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Backward over chunks of rows: recompute [chunk, V] logits, overwrite them with their
    gradient, then grad_h[rows] = gl @ W and grad_W += gl.T @ h (float32 accumulator)."""
    n = hidden.shape[0]
    grad_h = torch.empty_like(hidden) if need_h else None
    grad_w = (
        torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
    )
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        h = hidden[s:e]
        logits = h @ weight.t()
        gl = token_logprobs_backward(
            backend,
            logits,
            targets[s:e],
            temperature,
            ignore_index,
            lse[s:e],
            g[s:e],
            None,
            None,
            True,
        )
        if grad_h is not None:
            torch.mm(gl, weight, out=grad_h[s:e])
        if grad_w is not None:  # float32 accumulation across chunks
            _accumulate_weight_grad(grad_w, gl, h)
        del logits, gl
    return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None)


def _backward_vocab_chunks(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    g: torch.Tensor,
    temperature: float,
    ignore_index: int,
    chunk: int,
    need_h: bool,
    need_w: bool,
    backend: str,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """CUDA backward over chunks of the vocabulary (the saved log-sum-exp makes every
    column's softmax known without the others): for columns [a, b), recompute the [N, b-a]
    logits, overwrite them with their gradient, write grad_W[a:b] = gl.T @ h in one GEMM
    over all N rows (no [V, H] accumulator), and add gl @ W[a:b] into a float32 [N, H]
    accumulator for grad_h. The chunk holds about as many logits as ``chunk`` full rows.

    Uses the contract of the CUDA kernel and of the torch reference (``backend``; tests run
    this path on CPU through it) that a target outside [0, b-a) that is not
    ``ignore_index`` adds no one-hot term to its row.
    """
    n, vocab = hidden.shape[0], weight.shape[0]
    cols = -(-chunk * vocab // max(1, n))
    cols = max(64, -(-cols // 64) * 64)  # whole 16-byte vectors per row: aligned loads
    grad_h = (
        torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
    )
    grad_w = torch.empty_like(weight) if need_w else None
    ignored = targets == ignore_index
    for a in range(0, vocab, cols):
        b = min(vocab, a + cols)
        outside = b - a if ignore_index != b - a else b - a + 1
        local = torch.where((targets >= a) & (targets < b), targets - a, outside)
        local = torch.where(ignored, targets, local)
        logits = hidden @ weight[a:b].t()  # [N, b - a]
        gl = token_logprobs_backward(
            backend, logits, local, temperature, ignore_index, lse, g, None, None, True
        )
        if grad_w is not None:
            torch.mm(gl.t(), hidden, out=grad_w[a:b])
        if grad_h is not None:
            _accumulate_into_float32(grad_h, gl, weight[a:b])
        del logits, gl
    return (grad_h.to(hidden.dtype) if grad_h is not None else None), grad_w


def _accumulate_into_float32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc (float32) += a @ b, accumulated by cuBLAS in float32 for low-precision inputs."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
        return
    try:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    except (RuntimeError, TypeError, NotImplementedError):  # older torch: no out_dtype
        acc.add_(a @ b)


def linear_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Token log-probs of ``targets`` under ``softmax(hidden @ weight.T / temperature)``
    without materializing the full [N, V] logits.

    Args:
        hidden: [N, H] final hidden states (float32/float16/bfloat16).
        weight: [V, H] lm_head weight, same dtype and device as ``hidden``.
        targets: [N] int64 token ids, or ``ignore_index`` (logp 0, zero gradient).
        temperature: positive, applied in float32.
        chunk_size: rows of logits computed at once; default :func:`default_chunk_size`
            (at least 1024 rows, a float32 chunk under 1 GiB). Smaller chunks use less
            memory but re-read the weight more often.
        ignore_index: see ``targets``.

    Returns:
        logp [N] float32, differentiable w.r.t. ``hidden`` and ``weight``. The backward
        recomputes each chunk of logits; the weight gradient is accumulated in float32 and
        returned in the weight's dtype. Peak extra memory in the backward: on CUDA one
        chunk of about ``chunk_size * V`` logits (taken as columns of all rows) plus a float32
        [N, H] accumulator for the hidden gradient; on CPU one [chunk, V] logits chunk plus
        a float32 [V, H] weight-gradient accumulator (and, for low-precision weights, one
        [V, H] product per chunk).

    Raises:
        ValueError: bad shapes, dtypes, devices, temperature or chunk_size.
    """
    if hidden.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H]; got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden size mismatch: hidden is [N, {hidden.shape[1]}] but weight is "
            f"[V, {weight.shape[1]}]"
        )
    if hidden.dtype != weight.dtype or hidden.device != weight.device:
        raise ValueError(
            f"hidden ({hidden.dtype}, {hidden.device}) and weight ({weight.dtype}, "
            f"{weight.device}) must share dtype and device"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"targets must be [N] = [{hidden.shape[0]}], got shape {tuple(targets.shape)}"
        )
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"targets must be an integer tensor (int64), got {targets.dtype}")
    temperature = float(temperature)
    if not (temperature > 0.0 and temperature != float("inf")):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    n = hidden.shape[0]
    if chunk_size is None:
        chunk = default_chunk_size(n, hidden.shape[1], weight.shape[0])
    else:
        chunk = int(chunk_size)
        if chunk < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    targets = targets.to(device=hidden.device, dtype=torch.int64).contiguous()
    probe = torch.empty(0, dtype=hidden.dtype)
    backend = dispatch.select(
        "linear_token_logprobs", hidden.device, token_logprobs_unsupported(probe)
    )
    return _LinearTokenLogprobs.apply(  # type: ignore[no-any-return, no-untyped-call]
        hidden,
        weight,
        targets,
        temperature,
        int(ignore_index),
        max(1, min(chunk, max(n, 1))),
        backend,
    )
