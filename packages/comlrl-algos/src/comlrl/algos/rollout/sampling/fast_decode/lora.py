"""LoRA adapters in the fast decode step, one adapter per block of rows.

A peft LoRA layer computes ``y = W x + b + s B A x`` (Hu et al. 2021, "LoRA: Low-Rank
Adaptation of Large Language Models", Eq. 3; ``s = alpha / r``), the low-rank part in the
adapter's dtype (float32 when peft kept the adapter in float32 over a bfloat16 base) and
the sum rounded back to the base's dtype. :class:`LoraDelta` computes ``s B A x`` for a
batch whose rows are split into ``n`` equal contiguous blocks, block ``i`` with adapter
``layout[i]``: two batched matmuls (``bmm``) over the stacked adapters, whatever ``n``,
so the agents that share one base decode in one batched step, each row through its own
adapter (:mod:`comlrl.algos.models.lora_policy`'s adapter layout). Projections that the
step fuses (q|k|v, gate|up) get one delta over the concatenated ``A`` matrices and a
block-diagonal ``B``: the same sums (the added terms are exact zeros).

:func:`lora_reason` says whether a layer is one the step can read (vanilla LoRA on a
plain ``nn.Linear``, not merged, no DoRA or other variants, no bias on ``B``, dropout off).

Named axes: ``B`` rows, ``n`` adapter blocks, ``R`` stacked rank, ``in``/``out`` features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["LoraDelta", "base_linear", "is_lora_layer", "lora_delta", "lora_reason"]


def is_lora_layer(m: Any) -> bool:
    """Whether ``m`` is a peft LoRA layer (duck-typed: ``base_layer``, ``lora_A``, ``lora_B``)."""
    return all(hasattr(m, k) for k in ("base_layer", "lora_A", "lora_B", "scaling"))


def base_linear(m: Any) -> Any:
    """The ``nn.Linear`` under a LoRA layer, or ``m`` itself."""
    return m.base_layer if is_lora_layer(m) else m


def lora_reason(m: Any, layout: Sequence[str] | None) -> str | None:
    """Why the fast step cannot apply LoRA layer ``m`` for the adapters ``layout`` (``None``
    when it can)."""
    if layout is None:
        return "LoRA layers on a model without an adapter layout (a bare peft model)"
    if type(m.base_layer) is not nn.Linear:
        return f"a LoRA layer over a {type(m.base_layer).__name__}, not a plain nn.Linear"
    if getattr(m, "merged", False) or getattr(m, "disable_adapters", False):
        return "a LoRA layer with merged or disabled adapters"
    if getattr(m, "fan_in_fan_out", False):
        return "a LoRA layer with fan_in_fan_out"
    variants = getattr(m, "lora_variant", {}) or {}
    for name in layout:
        if name not in m.lora_A:
            continue  # this adapter does not target the layer: no delta there
        if name in variants or getattr(m, "use_dora", {}).get(name, False):
            return f"adapter {name!r} is a LoRA variant (DoRA, ...), not vanilla LoRA"
        if getattr(m.lora_B[name], "bias", None) is not None:
            return f"adapter {name!r} has a bias on B"
        drop = m.lora_dropout[name]
        if not isinstance(drop, nn.Identity) and drop.training:
            return f"adapter {name!r} has dropout on (train mode)"
    return None


@dataclass
class LoraDelta:
    """``s B A x`` for ``n`` equal blocks of rows, one adapter each.

    Attributes:
        a: ``[n, R, in]`` the blocks' stacked ``A`` matrices (float, the adapters' dtype).
        b: ``[n, out, R]`` their ``B`` matrices times ``s``, block-diagonal over fused parts.
    """

    a: torch.Tensor
    b: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, out]`` deltas of ``x [B, in]`` (``B`` a multiple of ``n``), in the
        adapters' dtype."""
        n = self.a.shape[0]
        xb = x.to(self.a.dtype).reshape(n, x.shape[0] // n, x.shape[-1])
        low = torch.bmm(xb, self.a.transpose(1, 2))
        return torch.bmm(low, self.b.transpose(1, 2)).reshape(x.shape[0], -1)


def lora_delta(parts: Sequence[Any], layout: Sequence[str] | None) -> LoraDelta | None:
    """The delta of the linears ``parts`` applied side by side (their outputs concatenated)
    for the adapter blocks ``layout``; ``None`` when no part has any of those adapters."""
    if layout is None:
        return None
    lora_parts = [m for m in parts if is_lora_layer(m)]
    if not any(name in m.lora_A for m in lora_parts for name in layout):
        return None
    ranks = [
        max((m.lora_A[name].weight.shape[0] for name in layout if name in m.lora_A), default=0)
        if is_lora_layer(m)
        else 0
        for m in parts
    ]
    ref = next(m.lora_A[name].weight for m in lora_parts for name in layout if name in m.lora_A)
    dtype, device = ref.dtype, ref.device
    outs = [base_linear(m).out_features for m in parts]
    in_features = base_linear(parts[0]).in_features
    n, total_r = len(layout), sum(ranks)
    a = torch.zeros(n, total_r, in_features, dtype=dtype, device=device)
    b = torch.zeros(n, sum(outs), total_r, dtype=dtype, device=device)
    with torch.no_grad():
        for i, name in enumerate(layout):
            r0 = o0 = 0
            for m, r, o in zip(parts, ranks, outs, strict=True):
                if is_lora_layer(m) and name in m.lora_A:
                    wa, wb = m.lora_A[name].weight, m.lora_B[name].weight  # [r, in], [out, r]
                    k = wa.shape[0]
                    a[i, r0 : r0 + k] = wa.to(dtype)
                    b[i, o0 : o0 + o, r0 : r0 + k] = wb.to(dtype) * float(m.scaling[name])
                r0 += r
                o0 += o
    return LoraDelta(a, b)
