"""The pieces of :class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder`'s Python step
per decoder layer: :class:`DecodeLayer` (weights and KV cache) and :func:`rms_norm`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from comlrl.algos.rollout.sampling.fast_decode.linears import Linear

__all__ = ["DecodeLayer", "rms_norm"]


@dataclass
class DecodeLayer:
    """One decoder layer's weights as :class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder`
    reads them (norms, fused or separate linears) and its KV cache for the current batch
    (``P`` prompts, ``Hkv`` key/value heads, ``D`` head size, ``S`` prefix length, ``G``
    completions per prompt, ``T`` completion slots; float in the model's dtype)."""

    norm1: torch.Tensor
    eps1: float
    qkv: list[Linear]  # one fused or three separate
    o: Linear
    norm2: torch.Tensor
    eps2: float
    gate_up: list[Linear]  # one fused or two separate
    down: Linear
    prefix_keys: torch.Tensor | None = None  # [P, Hkv, D, S] (keys stored transposed)
    prefix_values: torch.Tensor | None = None  # [P, Hkv, S, D]
    keys: torch.Tensor | None = None  # [P, Hkv, G, D, T] completion keys (transposed)
    values: torch.Tensor | None = None  # [P, Hkv, G, T, D]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` in float32, cast back like ``transformers``.

    For float32 inputs and weights this is one ``F.rms_norm`` call: the same operations
    in the same order (``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``, ``mul``), bit for
    bit (tested), without a Python round trip per operation, which is most of a decode
    step's cost for small models. Other dtypes take the explicit float32 path.
    """
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)
