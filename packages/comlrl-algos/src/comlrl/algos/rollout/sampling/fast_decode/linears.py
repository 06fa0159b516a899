"""The linears of :class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder`'s step.

Each projection of a decode step is applied either as ``F.linear(x, weight, bias)`` or,
for big float32 weights on CPU with few rows, through :class:`comlrl.kernels.FewRowsLinear`
(a C++ GEMV that reads the weight at memory speed, where torch's float32 GEMM reads it at
a half to a fifth of that on the build machine; see ``docs/benchmarks.md``, "A real chat
LLM on CPU"). Small weights stay on ``F.linear``, so the built-in tiny models decode
exactly as before. A projection with LoRA adapters adds their low-rank delta
(:class:`~comlrl.algos.rollout.sampling.fast_decode.lora.LoraDelta`, :class:`AdaptedLinear`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import torch
import torch.nn.functional as F
from comlrl.algos.rollout.sampling.fast_decode.lora import LoraDelta, base_linear
from comlrl.kernels import FewRowsLinear
from comlrl.kernels._linear_rows import MAX_ROWS
from torch import nn

__all__ = [
    "FUSE_MAX_ELEMENTS",
    "KERNEL_MIN_ELEMENTS",
    "AdaptedLinear",
    "Linear",
    "PlainLinear",
    "adapted",
    "apply_linear",
    "apply_linears",
    "as_linear",
    "fused",
]

#: Projections are fused (q|k|v and gate|up concatenated once per ``start``) only when the
#: copies stay this small; fusing saves a few small ops per layer, which matters only for
#: small models, and would double those weights' memory for big ones.
FUSE_MAX_ELEMENTS = 1 << 24

#: CPU float32 weights of at least this many elements (1 MiB) go through
#: :class:`comlrl.kernels.FewRowsLinear` (a C++ few-row GEMV streaming the weight at
#: memory speed) when a step has at most ``MAX_ROWS`` rows; smaller ones stay on
#: ``F.linear``, whose per-call cost is lower and whose results the built-in tiny models'
#: runs were recorded with. Measured with one thread: the kernel is 0.2-0.6x ``F.linear``
#: for 192x64 to 256x256 weights and 1.0-1.6x from 512x512 (1 to 4 rows).
KERNEL_MIN_ELEMENTS = 1 << 18

#: A plain linear as the step applies it: ``(weight, bias)`` for ``F.linear``, or the kernel.
PlainLinear: TypeAlias = tuple[torch.Tensor, torch.Tensor | None] | FewRowsLinear


@dataclass
class AdaptedLinear:
    """A linear with LoRA adapters: ``base(x)`` plus the adapters' delta, summed in the
    adapters' dtype and rounded to the base's (peft's order)."""

    base: PlainLinear
    delta: LoraDelta


#: A linear as the step applies it.
Linear: TypeAlias = PlainLinear | AdaptedLinear


def fused(mods: list[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One ``(weight, bias)`` computing the given linears' outputs side by side (the
    plain linears under LoRA layers)."""
    lins = [base_linear(m) for m in mods]
    bias = None
    if any(m.bias is not None for m in lins):
        bias = torch.cat(
            [m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in lins]
        )
    return torch.cat([m.weight for m in lins]), bias


def as_linear(weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> PlainLinear:
    """The kernel for a big CPU float32 weight at few rows, else ``(weight, bias)``."""
    if (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.numel() >= KERNEL_MIN_ELEMENTS
        and rows <= MAX_ROWS
    ):
        op = FewRowsLinear(weight, bias)
        if op.native:
            return op
    return (weight, bias)


def adapted(base: PlainLinear, delta: LoraDelta | None) -> Linear:
    """``base`` with the adapters' ``delta`` added, or ``base`` alone."""
    return base if delta is None else AdaptedLinear(base, delta)


def apply_linear(x: torch.Tensor, lin: Linear) -> torch.Tensor:
    if isinstance(lin, tuple):
        return F.linear(x, *lin)
    if isinstance(lin, AdaptedLinear):
        y = apply_linear(x, lin.base)
        delta = lin.delta(x)
        if delta.dtype == y.dtype:
            return y + delta
        return (y.to(delta.dtype) + delta).to(y.dtype)
    return lin(x)


def apply_linears(x: torch.Tensor, parts: list[Linear]) -> torch.Tensor:
    if len(parts) == 1:
        return apply_linear(x, parts[0])
    return torch.cat([apply_linear(x, lin) for lin in parts], dim=-1)
