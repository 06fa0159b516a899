"""linear_token_logprobs: lm_head matmul fused with token_logprobs, chunked over tokens.

Only one chunk of logits ([chunk, V]) exists at a time, in the forward and again in the
backward (where it is recomputed and then overwritten in place by its gradient).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import _dispatch as dispatch
from ._token_logprobs import _unsupported, token_logprobs_backward, token_logprobs_forward

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
    if gl.dtype == torch.float32:
        grad_w.addmm_(gl.t(), h)
        return
    if gl.is_cuda:
        try:
            torch.addmm(grad_w, gl.t(), h, out_dtype=torch.float32, out=grad_w)
            return
        except (RuntimeError, TypeError, NotImplementedError):  # older torch: no out_dtype
            pass
    grad_w.add_(gl.t() @ h)


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
        gw = grad_w.to(weight.dtype) if grad_w is not None else None
        return grad_h, gw, None, None, None, None, None


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
        returned in the weight's dtype. Peak extra memory: one [chunk, V] logits chunk plus
        the float32 [V, H] weight-gradient accumulator (and, for low-precision weights on
        CPU, one [V, H] product per chunk; on CUDA the product is written in float32
        straight into the accumulator).

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
    backend = dispatch.select("linear_token_logprobs", hidden.device, _unsupported(probe))
    return _LinearTokenLogprobs.apply(  # type: ignore[no-any-return, no-untyped-call]
        hidden,
        weight,
        targets,
        temperature,
        int(ignore_index),
        max(1, min(chunk, max(n, 1))),
        backend,
    )
