"""DecodeStep: one whole decode step of a Llama-family LM in one C++ call (CPU, float32).

A decode step of a small model run from Python is a few hundred tensor ops of a few
microseconds of dispatch each: for the built-in stories260k model (dim 64, 5 layers,
~0.5 MFLOP per row) that overhead is nearly all of the ~1.4 ms a step takes.
:class:`DecodeStep` runs the step (embedding, per layer RMSNorm, q/k/v projections with
optional biases, rotary embedding, KV-cache append, grouped-query attention, o projection,
SwiGLU MLP; final norm and LM head) as one call into ``csrc/cpu_decode.cpp`` over the
model's own weight tensors and a KV cache the caller owns (written in place).

The cache layout is that of ``comlrl.algos``' ``FastDecoder`` (``B = P * G`` rows,
prompt-major; each prompt's prefix is shared by its ``G`` rows, keys stored transposed):

- ``prefix_keys [P, Hkv, D, S]``, ``prefix_values [P, Hkv, S, D]``: the prompt's keys
  (rotary applied) and values; ``prefix_bias [P, S]`` is added to the scaled scores
  (0 on tokens, ``-inf`` on left padding);
- ``keys [P, Hkv, G, D, T]``, ``values [P, Hkv, G, T, D]``: completion slot ``t`` is
  written by the step at slot ``t``, which attends to the prompt and slots ``0..t``;
- ``cos``, ``sin [B, T', D]``: the rotary tables of the positions fed at each slot, from
  the model's own rotary embedding (so any rope theta or scaling it implements), with
  ``rotate_half``'s sign folded into ``sin``: ``rope(x)_i = x_i cos_i + x_{(i + D/2) mod D}
  sin_i``.

The spec is :func:`comlrl.kernels._decode_reference.decode_step_reference`; the kernel equals it
to float32 rounding (another summation order and a polynomial ``exp``; tested within
``1e-5`` of the largest |logit|).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import _dispatch as dispatch

__all__ = ["DecodeLayerWeights", "DecodeStep", "decode_step_unavailable"]

#: A linear as ``(weight [N, K], bias [N] or None)``.
LinearWeights = tuple[torch.Tensor, "torch.Tensor | None"]


@dataclass(frozen=True)
class DecodeLayerWeights:
    """One decoder layer's tensors (float32, CPU; weights with unit inner stride).

    ``q [Hq*D, H]``, ``k``/``v [Hkv*D, H]``, ``o [H, Hq*D]``, ``gate``/``up [I, H]``,
    ``down [H, I]``, each as ``(weight, bias or None)``; ``norm1``/``norm2 [H]`` RMSNorm
    weights with their epsilons.
    """

    norm1: torch.Tensor
    eps1: float
    q: LinearWeights
    k: LinearWeights
    v: LinearWeights
    o: LinearWeights
    norm2: torch.Tensor
    eps2: float
    gate: LinearWeights
    up: LinearWeights
    down: LinearWeights


def decode_step_unavailable() -> str | None:
    """Why :class:`DecodeStep` cannot run here (``None`` when it can): the ``_cpu``
    extension is missing or predates it, or the ``torch`` backend is forced
    (``COMLRL_KERNELS_BACKEND=torch`` / ``use_backend("torch")``)."""
    try:
        backend = dispatch.select("decode_step", torch.device("cpu"))
    except dispatch.BackendUnavailableError as exc:
        return str(exc)
    if backend != "cpu":
        return f"backend {dispatch.requested_backend()!r} selects {backend!r}, not the C++ step"
    if not hasattr(dispatch.cpu_module(), "DecodeSession"):
        return "the _cpu extension was built without DecodeSession; reinstall comlrl-kernels"
    return None


def _check(t: torch.Tensor, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"DecodeStep: {name} must be a tensor, got {type(t).__name__}")
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise ValueError(
            f"DecodeStep: {name} is {t.dtype} on {t.device}; the C++ step takes float32 CPU "
            f"tensors (use the Python decode step for other dtypes and devices)"
        )
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"DecodeStep: {name} has shape {tuple(t.shape)}, expected {shape}")
    return t


def _rows_contiguous(t: torch.Tensor, name: str) -> int:
    """Row stride of a 2-D tensor whose rows are contiguous."""
    if t.stride(1) != 1 and t.shape[1] > 1:
        raise ValueError(
            f"DecodeStep: {name} has strides {t.stride()}; its rows must be contiguous "
            f"(pass .contiguous())"
        )
    return int(t.stride(0)) if t.shape[0] > 1 else int(t.shape[1])


def _contiguous(t: torch.Tensor, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    _check(t, name, shape)
    if not t.is_contiguous():
        raise ValueError(f"DecodeStep: {name} {tuple(t.shape)} must be contiguous")
    return t


class DecodeStep:
    """One decode step of a Llama-family causal LM as a single C++ call.

    Args:
        embed: ``[V, H]`` token embedding (rows contiguous).
        layers: the decoder layers, in order.
        final_norm: ``[H]`` final RMSNorm weight; ``final_eps`` its epsilon.
        lm_head: ``[V, H]`` LM head weight (tied or not; no bias).
        num_heads, num_kv_heads, head_dim: ``Hq``, ``Hkv`` (``Hq % Hkv == 0``), ``D`` (even).
        scaling: the softmax scale (``D ** -0.5`` for these models).

    The tensors are borrowed, not copied: keep them alive and unchanged in shape while the
    object is used. Models whose linears hold at most ``2**22`` weight elements in all get
    transposed copies of them at each :meth:`start` (their step is bound by arithmetic, and
    a transposed weight needs no horizontal sums): in-place weight updates (an optimizer
    step) are seen from the next :meth:`start` on. Bigger models stream the borrowed
    weights directly (the few-row GEMV of :func:`~comlrl.kernels.linear_rows`).

    Raises:
        ValueError: a tensor is not float32 on CPU, has the wrong shape, or its rows are
            not contiguous (the message names it).
        BackendUnavailableError: the C++ step is not available
            (:func:`decode_step_unavailable`).
    """

    def __init__(
        self,
        *,
        embed: torch.Tensor,
        layers: Sequence[DecodeLayerWeights],
        final_norm: torch.Tensor,
        final_eps: float,
        lm_head: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scaling: float,
    ) -> None:
        reason = decode_step_unavailable()
        if reason is not None:
            raise dispatch.BackendUnavailableError(f"DecodeStep: {reason}")
        if embed.dim() != 2:
            raise ValueError(f"DecodeStep: embed must be [V, H], got {tuple(embed.shape)}")
        vocab, hidden = int(embed.shape[0]), int(embed.shape[1])
        self.vocab, self.hidden = vocab, hidden
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        _check(embed, "embed")
        _check(final_norm, "final_norm", (hidden,))
        _check(lm_head, "lm_head", (vocab, hidden))
        keep: list[torch.Tensor] = [embed, final_norm.contiguous(), lm_head]
        cpu = dispatch.cpu_module()
        self._session = cpu.DecodeSession(
            hidden,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab,
            float(scaling),
            embed.data_ptr(),
            _rows_contiguous(embed, "embed"),
            keep[1].data_ptr(),
            float(final_eps),
            self._linear((lm_head, None), "lm_head", keep),
        )
        for i, layer in enumerate(layers):
            n1 = _check(layer.norm1, f"layers[{i}].norm1", (hidden,)).contiguous()
            n2 = _check(layer.norm2, f"layers[{i}].norm2", (hidden,)).contiguous()
            keep += [n1, n2]
            linears = [
                self._linear(getattr(layer, name), f"layers[{i}].{name}", keep)
                for name in ("q", "k", "v", "o", "gate", "up", "down")
            ]
            self._session.add_layer(
                n1.data_ptr(), float(layer.eps1), n2.data_ptr(), float(layer.eps2), linears
            )
        self.num_layers = len(layers)
        self._keep = keep
        self._batch: list[torch.Tensor] = []
        self._rows = 0

    @staticmethod
    def _linear(
        lin: LinearWeights, name: str, keep: list[torch.Tensor]
    ) -> tuple[int, int, int, int, int]:
        weight, bias = lin
        _check(weight, f"{name} weight")
        if weight.dim() != 2:
            raise ValueError(f"DecodeStep: {name} weight must be [N, K], got {tuple(weight.shape)}")
        n, k = int(weight.shape[0]), int(weight.shape[1])
        stride = _rows_contiguous(weight, f"{name} weight")
        keep.append(weight)
        b = 0
        if bias is not None:
            bias = _check(bias, f"{name} bias", (n,)).contiguous()
            keep.append(bias)
            b = bias.data_ptr()
        return (weight.data_ptr(), stride, b, n, k)

    def start(
        self,
        *,
        prefix_keys: Sequence[torch.Tensor],
        prefix_values: Sequence[torch.Tensor],
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        prefix_bias: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> None:
        """Take a batch's KV cache (one tensor of each kind per layer, layouts in the
        module docstring) and rotary tables; all float32, CPU, contiguous.

        Raises:
            ValueError: a tensor has the wrong shape, dtype, device or layout (named).
        """
        if not keys or keys[0].dim() != 5:
            raise ValueError(
                "DecodeStep.start: keys must be [P, Hkv, G, D, T] tensors, one per layer"
            )
        p, hkv, g, d, t = (int(x) for x in keys[0].shape)
        if (hkv, d) != (self.num_kv_heads, self.head_dim):
            raise ValueError(
                f"DecodeStep.start: keys[0] has shape {tuple(keys[0].shape)}; expected Hkv="
                f"{self.num_kv_heads}, D={self.head_dim} in [P, Hkv, G, D, T]"
            )
        if p < 1 or g < 1 or t < 1:
            raise ValueError(f"DecodeStep.start: empty cache {tuple(keys[0].shape)}")
        s = int(prefix_bias.shape[-1]) if prefix_bias.dim() == 2 else -1
        if s < 1:
            raise ValueError(
                f"DecodeStep.start: prefix_bias must be [P, S], got {tuple(prefix_bias.shape)}"
            )
        counts = {len(prefix_keys), len(prefix_values), len(keys), len(values)}
        if counts != {self.num_layers}:
            raise ValueError(
                f"DecodeStep.start: {sorted(counts)} cache tensors per kind for "
                f"{self.num_layers} layers"
            )
        b = p * g
        batch = [_contiguous(prefix_bias, "prefix_bias", (p, s))]
        if cos.dim() != 3:
            raise ValueError(f"DecodeStep.start: cos must be [B, T, D], got {tuple(cos.shape)}")
        rope_steps = int(cos.shape[1])
        batch += [
            _contiguous(cos, "cos", (b, rope_steps, d)),
            _contiguous(sin, "sin", (b, rope_steps, d)),
        ]
        caches = []
        for i in range(self.num_layers):
            parts = [
                _contiguous(prefix_keys[i], f"prefix_keys[{i}]", (p, hkv, d, s)),
                _contiguous(prefix_values[i], f"prefix_values[{i}]", (p, hkv, s, d)),
                _contiguous(keys[i], f"keys[{i}]", (p, hkv, g, d, t)),
                _contiguous(values[i], f"values[{i}]", (p, hkv, g, t, d)),
            ]
            batch += parts
            caches.append([x.data_ptr() for x in parts])
        self._session.start(
            p, g, s, t, prefix_bias.data_ptr(), cos.data_ptr(), sin.data_ptr(), rope_steps, caches
        )
        self._batch = batch  # keep the buffers alive while the session points at them
        self._rows = b

    def __call__(
        self, tokens: torch.Tensor, slot: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Feed ``tokens [B]`` (int64, CPU) at completion slot ``slot``; return logits
        ``[B, V]`` float32 (written into ``out`` when given: ``[B, V]`` float32 with
        contiguous rows).

        Raises:
            ValueError: wrong tokens dtype/device/shape, a token outside ``[0, V)``, a slot
                outside the cache, or :meth:`start` not called.
        """
        if not self._batch:
            raise ValueError("DecodeStep: call start() before stepping")
        if (
            tokens.dtype != torch.int64
            or tokens.device.type != "cpu"
            or tokens.shape != (self._rows,)
        ):
            raise ValueError(
                f"DecodeStep: tokens must be int64 [B] = [{self._rows}] on CPU, got "
                f"{tokens.dtype} {tuple(tokens.shape)} on {tokens.device}"
            )
        if not tokens.is_contiguous():
            tokens = tokens.contiguous()
        if out is None:
            out = torch.empty(self._rows, self.vocab, dtype=torch.float32)
        else:
            _check(out, "out", (self._rows, self.vocab))
        stride = _rows_contiguous(out, "out")
        self._session.step(
            tokens.data_ptr(), self._rows, int(slot), out.data_ptr(), stride, dispatch.num_threads()
        )
        return out
