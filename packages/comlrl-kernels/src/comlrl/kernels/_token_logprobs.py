"""token_logprobs: per-token log-probabilities (and entropy) from logits, with autograd.

The forward keeps only the per-row log-sum-exp (float32 [N]); the backward recomputes
softmax from it, so a float32 [N, V] tensor is never created by the native backends.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch

from . import _dispatch as dispatch
from . import _reference as ref

__all__ = [
    "token_logprobs",
    "token_logprobs_backward",
    "token_logprobs_forward",
    "token_logprobs_unsupported",
]

_NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def token_logprobs_unsupported(logits: torch.Tensor) -> str | None:
    """Why the native kernels cannot take ``logits`` (a dtype other than float32, float16 or
    bfloat16), or ``None`` when they can; the dispatcher then uses the torch reference."""
    if logits.dtype not in _NATIVE_DTYPES:
        return f"logits dtype {logits.dtype} (native kernels take float32, float16, bfloat16)"
    return None


def token_logprobs_forward(
    backend: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    want_entropy: bool,
    ignore_index: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, str]:
    """Run the forward on ``backend``: (logp, lse, entropy or None, backend used).

    ``logits`` [N, V] with unit inner stride; ``targets`` [N] contiguous int64.
    """
    n, vocab = logits.shape
    dev = logits.device

    def alloc() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        logp = torch.empty(n, dtype=torch.float32, device=dev)
        lse = torch.empty(n, dtype=torch.float32, device=dev)
        ent = torch.empty(n, dtype=torch.float32, device=dev) if want_entropy else None
        return logp, lse, ent

    def native() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        logp, lse, ent = alloc()
        common = (
            logits.data_ptr(),
            dispatch.DTYPE_CODES[logits.dtype],
            n,
            vocab,
            logits.stride(0),
            targets.data_ptr(),
            int(ignore_index),
            float(temperature),
            logp.data_ptr(),
            lse.data_ptr(),
            ent.data_ptr() if ent is not None else 0,
        )
        if backend == "cpu":
            dispatch.cpu_module().token_logprobs_forward(*common, dispatch.num_threads())
        else:
            dispatch.cuda_module().token_logprobs_forward(
                *common,
                dev.index if dev.index is not None else torch.cuda.current_device(),
                dispatch.cuda_stream(dev),
            )
        return logp, lse, ent

    def reference() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return ref.token_logprobs_stats(logits, targets, temperature, want_entropy, ignore_index)

    (logp, lse, ent), used = dispatch.run("token_logprobs", backend, native, reference)
    return logp, lse, ent, used


def token_logprobs_backward(
    backend: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    ignore_index: int,
    lse: torch.Tensor,
    g_logp: torch.Tensor,
    g_entropy: torch.Tensor | None,
    entropy: torch.Tensor | None,
    inplace: bool,
) -> torch.Tensor:
    """Gradient w.r.t. ``logits`` in the logits dtype; written into ``logits`` if ``inplace``
    (for callers that own the logits and never read them again: the fused
    :func:`~comlrl.kernels.linear_token_logprobs` overwrites the chunk of logits it
    recomputed)."""
    n, vocab = logits.shape
    dev = logits.device
    g_logp = g_logp.to(lse.dtype).contiguous()
    if g_entropy is not None:
        g_entropy = g_entropy.to(lse.dtype).contiguous()
    out = logits if inplace else torch.empty((n, vocab), dtype=logits.dtype, device=dev)

    def native() -> torch.Tensor:
        common = (
            logits.data_ptr(),
            dispatch.DTYPE_CODES[logits.dtype],
            n,
            vocab,
            logits.stride(0),
            targets.data_ptr(),
            int(ignore_index),
            float(temperature),
            lse.data_ptr(),
            g_logp.data_ptr(),
            g_entropy.data_ptr() if g_entropy is not None else 0,
            entropy.data_ptr() if (entropy is not None and g_entropy is not None) else 0,
            out.data_ptr(),
            out.stride(0),
        )
        if backend == "cpu":
            dispatch.cpu_module().token_logprobs_backward(*common, dispatch.num_threads())
        else:
            dispatch.cuda_module().token_logprobs_backward(
                *common,
                dev.index if dev.index is not None else torch.cuda.current_device(),
                dispatch.cuda_stream(dev),
            )
        return out

    def reference() -> torch.Tensor:
        return ref.token_logprobs_grad(
            logits, targets, temperature, ignore_index, lse, g_logp, g_entropy, entropy, out
        )

    grad, _ = dispatch.run("token_logprobs", backend, native, reference)
    return grad


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        want_entropy: bool,
        ignore_index: int,
        backend: str,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        logp, lse, ent, used = token_logprobs_forward(
            backend, logits, targets, temperature, want_entropy, ignore_index
        )
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.config = (temperature, ignore_index, used)
        if want_entropy:
            assert ent is not None
            return logp, ent
        return logp

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, targets, lse, ent = ctx.saved_tensors
        temperature, ignore_index, backend = ctx.config
        grad = None
        if ctx.needs_input_grad[0]:
            g_entropy = grads[1] if len(grads) > 1 else None
            grad = token_logprobs_backward(
                backend,
                logits,
                targets,
                temperature,
                ignore_index,
                lse,
                grads[0],
                g_entropy,
                ent,
                False,
            )
        return grad, None, None, None, None, None


@overload
def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = ...,
    return_entropy: Literal[False] = ...,
    ignore_index: int = ...,
) -> torch.Tensor: ...


@overload
def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = ...,
    return_entropy: Literal[True],
    ignore_index: int = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = ...,
    return_entropy: bool = ...,
    ignore_index: int = ...,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    ignore_index: int = -100,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each target token under ``softmax(logits / temperature)``.

    Args:
        logits: [N, V] float32, float16 or bfloat16 (float64 is served by the torch
            reference). Rows may have any stride (e.g. a slice of a wider tensor); a
            non-unit stride along V is copied to contiguous first.
        targets: [N] int64 token ids in [0, V), or ``ignore_index``.
        temperature: positive; applied in float32 as ``z = logits / temperature``.
        return_entropy: also return the entropy ``H = -sum_v p_v log p_v`` of each row.
        ignore_index: rows with this target get logp 0, entropy 0 and zero gradient.

    Returns:
        logp [N] float32, or (logp [N], entropy [N]) float32 when ``return_entropy``.
        Differentiable w.r.t. ``logits``:
        ``d logp_i / d logits_ij = (onehot_ij - softmax(z_i)_j) / temperature``.

    Raises:
        ValueError: bad shapes/dtypes/temperature, or (CPU and torch backends) a target
            outside [0, V) that is not ``ignore_index``. On CUDA such a row gives NaN.
        BackendUnavailableError: a forced backend cannot serve the call.

    The forward saves only the per-row log-sum-exp (float32 [N]); the backward recomputes
    the softmax from it into a new [N, V] gradient in the logits dtype (the logits are left
    as they are). Accumulation is in float32 with 64-bit offsets. Less memory: the fused
    :func:`~comlrl.kernels.linear_token_logprobs` never holds the [N, V] logits whole.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating tensor, got {logits.dtype}")
    if targets.shape != logits.shape[:1]:
        raise ValueError(
            f"targets must be [N] = [{logits.shape[0]}], got shape {tuple(targets.shape)}"
        )
    if targets.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"targets must be an integer tensor (int64), got {targets.dtype}")
    if targets.device != logits.device:
        raise ValueError(f"targets are on {targets.device} but logits on {logits.device}")
    temperature = float(temperature)
    if not (temperature > 0.0 and temperature != float("inf")):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    if (logits.size(1) > 1 and logits.stride(1) != 1) or (
        logits.size(0) > 1 and logits.stride(0) < logits.size(1)
    ):  # non-unit inner stride, or overlapping/broadcast rows: copy
        logits = logits.contiguous()
    targets = targets.to(torch.int64).contiguous()
    backend = dispatch.select("token_logprobs", logits.device, token_logprobs_unsupported(logits))
    return _TokenLogprobs.apply(  # type: ignore[no-any-return, no-untyped-call]
        logits,
        targets,
        temperature,
        bool(return_entropy),
        int(ignore_index),
        backend,
    )
