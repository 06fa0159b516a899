"""sample_tokens: one token per row from float32 CPU logits in one C++ call.

A decode loop's per-token sampling from Python (tempered softmax, cumulative sum, a
binary search, the log-prob gather, EOS bookkeeping) is about a dozen small tensor ops of
a few microseconds of dispatch each; for small models that is several times the decode
step itself. :func:`sample_tokens` does all of it in ``csrc/cpu_sample.cpp``.

The spec is ``comlrl.algos``' ``filtered_scores``/``sample_next`` followed by the
tempered full-softmax log-prob (see the C++ file's header): temperature, top-k (ties with
the k-th score kept), top-p (a token is dropped when the renormalised mass before it,
in descending-score order, already reaches ``top_p``), and an inverse-CDF draw
(``searchsorted(cdf, u * cdf[-1], right=True)``) from uniforms the caller draws, so the
random streams are consumed exactly as by the Python path.
"""

from __future__ import annotations

import torch

from . import _dispatch as dispatch

__all__ = ["sample_tokens", "sample_tokens_unavailable"]


def sample_tokens_unavailable() -> str | None:
    """Why :func:`sample_tokens` cannot run here (``None`` when it can): the ``_cpu``
    extension is missing or predates it, or the ``torch`` backend is forced."""
    try:
        backend = dispatch.select("sample_tokens", torch.device("cpu"))
    except dispatch.BackendUnavailableError as exc:
        return str(exc)
    if backend != "cpu":
        return f"backend {dispatch.requested_backend()!r} selects {backend!r}, not the C++ sampler"
    if not hasattr(dispatch.cpu_module(), "sample_rows"):
        return "the _cpu extension was built without sample_rows; reinstall comlrl-kernels"
    return None


def _need(t: torch.Tensor, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"sample_tokens: {name} must be a tensor, got {type(t).__name__}")
    if t.dtype != dtype or t.device.type != "cpu":
        raise ValueError(
            f"sample_tokens: {name} is {t.dtype} on {t.device}; expected {dtype} on CPU"
        )
    if tuple(t.shape) != shape:
        raise ValueError(f"sample_tokens: {name} has shape {tuple(t.shape)}, expected {shape}")
    if not t.is_contiguous():
        raise ValueError(f"sample_tokens: {name} {tuple(t.shape)} must be contiguous")


def sample_tokens(
    logits: torch.Tensor,
    uniforms: torch.Tensor,
    done: torch.Tensor,
    eos: torch.Tensor,
    *,
    pad_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Sample one token per row, with its behaviour log-prob, and advance ``done``.

    Args:
        logits: ``[B, V]`` float32 on CPU, rows contiguous (any row stride).
        uniforms: ``[B]`` or ``[B, 1]`` float32 in ``[0, 1)``, one per row.
        done: ``[B]`` bool, contiguous; rows already finished. Updated in place: a row
            whose written token is in ``eos`` becomes done.
        eos: ``[E]`` int64 end-of-sequence ids (``E`` may be 0).
        pad_id: the token written on rows that were done before this step.
        temperature: ``> 0``; top_k: ``<= 0`` or ``>= V`` is off; top_p: in ``(0, 1]``.

    Returns:
        ``tokens [B]`` int64 (``pad_id`` on rows done before), ``logp [B]`` float32:
        ``log_softmax(logits / T)`` at the *drawn* token over the full vocabulary (also on
        rows done before, as the Python loop computes it), and whether all rows are done.

    Raises:
        ValueError: a tensor of the wrong dtype, device, shape or layout, or a sampling
            setting out of range (the message names it).
        BackendUnavailableError: the C++ sampler is not available
            (:func:`sample_tokens_unavailable`).
    """
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.device.type != "cpu":
        raise ValueError(
            f"sample_tokens: logits must be [B, V] float32 on CPU, got {tuple(logits.shape)} "
            f"{logits.dtype} on {logits.device}"
        )
    b, v = logits.shape
    if v < 1 or (logits.stride(1) != 1 and v > 1):
        raise ValueError(
            f"sample_tokens: logits {tuple(logits.shape)} with strides {logits.stride()}: rows must be contiguous and V >= 1"
        )
    if not temperature > 0:
        raise ValueError(f"sample_tokens: temperature must be > 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"sample_tokens: top_p must be in (0, 1], got {top_p}")
    uniforms = uniforms.reshape(b) if uniforms.numel() == b else uniforms
    _need(uniforms, "uniforms", torch.float32, (b,))
    _need(done, "done", torch.bool, (b,))
    _need(eos, "eos", torch.int64, (eos.numel(),))
    reason = sample_tokens_unavailable()
    if reason is not None:
        raise dispatch.BackendUnavailableError(f"sample_tokens: {reason}")
    tokens = torch.empty(b, dtype=torch.int64)
    logp = torch.empty(b, dtype=torch.float32)
    row_stride = int(logits.stride(0)) if b > 1 else v
    all_done = dispatch.cpu_module().sample_rows(
        logits.data_ptr(),
        b,
        v,
        row_stride,
        uniforms.data_ptr(),
        float(temperature),
        int(top_k),
        float(top_p),
        eos.data_ptr(),
        int(eos.numel()),
        int(pad_id),
        done.data_ptr(),
        tokens.data_ptr(),
        logp.data_ptr(),
    )
    return tokens, logp, bool(all_done)
