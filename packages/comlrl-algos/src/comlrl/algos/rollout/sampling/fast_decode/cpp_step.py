"""The whole decode step in one C++ call, for :class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder`.

On CPU, :class:`FastDecoder`'s Python step is ~165 small tensor ops; for small models
(the built-in stories260k: dim 64, 5 layers) their dispatch overhead (~9 us each) is
nearly all of the step's ~1.4 ms. :class:`comlrl.kernels.DecodeStep` runs the same maths
as one C++ call over the model's own weights and the decoder's KV cache (same tensors,
written in place), so the Python step remains the fallback for everything else.

It serves when the model's parameters are float32 on the CPU, the step is the growing
(not fixed-shape / CUDA-graph) one, the rotary tables cover the whole head (no partial
rotary), and ``comlrl.kernels`` was built with it (:func:`native_unavailable` says why
not; ``COMLRL_KERNELS_BACKEND=torch`` also turns it off). Logits equal the Python
step's to float32 rounding (different summation order; tested on stories260k and random
tiny Llama/Qwen2 models, where greedy tokens are identical).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["NativeBatch", "choose_native", "native_step", "native_unavailable"]

try:  # comlrl-kernels builds that predate DecodeStep keep the Python step
    from comlrl.kernels import DecodeLayerWeights, DecodeStep, decode_step_unavailable
except ImportError as exc:  # pragma: no cover - depends on the installed build
    DecodeStep = None  # type: ignore[assignment,misc]
    _IMPORT_ERROR = f"comlrl.kernels has no DecodeStep ({exc})"
else:
    _IMPORT_ERROR = ""


def native_unavailable(model: Any, device: torch.device) -> str | None:
    """Why the C++ step cannot run ``model``'s decode on ``device`` (``None`` when it can).

    The model must already be one :class:`FastDecoder` supports
    (:func:`~comlrl.algos.rollout.sampling.fast_decode.support.unsupported_reason`).
    """
    if DecodeStep is None:
        return _IMPORT_ERROR
    if device.type != "cpu":
        return f"the batch is on {device}, the C++ step runs on CPU"
    bad = {str(p.dtype) for p in model.parameters() if p.dtype != torch.float32}
    if bad or any(p.device.type != "cpu" for p in model.parameters()):
        return f"parameters are {sorted(bad) or 'not all'} on CPU; the C++ step takes float32 CPU"
    return decode_step_unavailable()


def native_step(
    model: Any, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float
) -> Any:
    """A :class:`comlrl.kernels.DecodeStep` over ``model``'s weights (borrowed, not copied).

    Raises:
        ValueError: a weight the kernel cannot take (e.g. rows that are not contiguous).
    """
    assert DecodeStep is not None
    base = model.model

    def lin(m: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        return m.weight, m.bias

    layers = [
        DecodeLayerWeights(
            norm1=layer.input_layernorm.weight,
            eps1=float(layer.input_layernorm.variance_epsilon),
            q=lin(layer.self_attn.q_proj),
            k=lin(layer.self_attn.k_proj),
            v=lin(layer.self_attn.v_proj),
            o=lin(layer.self_attn.o_proj),
            norm2=layer.post_attention_layernorm.weight,
            eps2=float(layer.post_attention_layernorm.variance_epsilon),
            gate=lin(layer.mlp.gate_proj),
            up=lin(layer.mlp.up_proj),
            down=lin(layer.mlp.down_proj),
        )
        for layer in base.layers
    ]
    return DecodeStep(
        embed=base.embed_tokens.weight,
        layers=layers,
        final_norm=base.norm.weight,
        final_eps=float(base.norm.variance_epsilon),
        lm_head=model.lm_head.weight,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        scaling=scaling,
    )


def choose_native(decoder: Any, wanted: bool, rotary_dims: int) -> tuple[Any, str]:
    """``(DecodeStep or None, status)`` for a :class:`FastDecoder` about to start: the
    C++ step over its model when ``wanted`` (a growing-cache step was asked for) and
    possible; status ``"on"`` or ``"off: <why>"``."""
    if not wanted:
        return None, "off: native=False or a fixed-shape step"
    model = decoder.model
    reason = native_unavailable(model, next(model.parameters()).device)
    if reason is None and rotary_dims != decoder.head_dim:
        reason = f"partial rotary ({rotary_dims} of {decoder.head_dim} dims)"
    if reason is None:
        try:
            step = native_step(
                model, decoder.num_heads, decoder.num_kv_heads, decoder.head_dim, decoder.scaling
            )
        except ValueError as exc:
            reason = str(exc)
        else:
            return step, "on"
    return None, f"off: {reason}"


class NativeBatch:
    """A started :class:`comlrl.kernels.DecodeStep` over one batch's cache.

    Args:
        step: from :func:`native_step`.
        prefix_keys, prefix_values, keys, values: one tensor per layer, in
            :class:`FastDecoder`'s layout.
        prompt_bias: ``[P, S]`` additive attention bias of the prompts (``-inf`` on padding).
        cos, sin: ``[B, T, D]`` rotary tables (``rotate_half``'s sign folded into ``sin``).

    Raises:
        ValueError: a table does not cover the whole head (partial rotary), or a cache
            tensor has another layout.
    """

    def __init__(
        self,
        step: Any,
        *,
        prefix_keys: Sequence[torch.Tensor],
        prefix_values: Sequence[torch.Tensor],
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        prompt_bias: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> None:
        if cos.shape[-1] != step.head_dim:
            raise ValueError(
                f"rotary tables of width {cos.shape[-1]} for head_dim {step.head_dim} "
                f"(partial rotary): the C++ step rotates whole heads"
            )
        step.start(
            prefix_keys=prefix_keys,
            prefix_values=prefix_values,
            keys=keys,
            values=values,
            prefix_bias=prompt_bias.contiguous(),
            cos=cos.contiguous(),
            sin=sin.contiguous(),
        )
        self.step = step

    def __call__(self, tokens: torch.Tensor, slot: int) -> torch.Tensor:
        """Logits ``[B, V]`` float32 of feeding ``tokens [B]`` at completion slot ``slot``."""
        return self.step(tokens, slot)
