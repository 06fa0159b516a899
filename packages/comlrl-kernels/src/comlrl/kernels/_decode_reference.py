"""Pure-torch specification of :class:`comlrl.kernels.DecodeStep` (one decode step of a
Llama-family LM over a caller-owned KV cache; layouts in ``_decode_step``'s docstring).

Written per row and per head for clarity, in float64 when given float64 tensors (the
tests use that as the exact value). Touvron et al. 2023 (Llama), Qwen2 technical report
2024: per layer ``h += o(attn(rope(q(n1(h))), rope(k(n1(h))), v(n1(h))))`` and
``h += down(silu(gate(n2(h))) * up(n2(h)))``, ``n(x) = w * x / sqrt(mean(x^2) + eps)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._decode_step import DecodeLayerWeights

__all__ = ["decode_step_reference"]


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _lin(x: torch.Tensor, lin: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    return F.linear(x, lin[0].to(x.dtype), None if lin[1] is None else lin[1].to(x.dtype))


def decode_step_reference(
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
    prefix_keys: Sequence[torch.Tensor],
    prefix_values: Sequence[torch.Tensor],
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    prefix_bias: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    tokens: torch.Tensor,
    slot: int,
) -> torch.Tensor:
    """Logits ``[B, V]`` of feeding ``tokens [B]`` at completion slot ``slot``; writes the
    slot's keys/values into ``keys``/``values`` (in their dtype). Computes in the dtype
    of ``embed``."""
    dt = embed.dtype
    p, hkv, g, d, _ = keys[0].shape
    rep = num_heads // num_kv_heads
    half = d // 2
    h = embed[tokens]  # [B, H]
    for i, layer in enumerate(layers):
        x = _norm(h, layer.norm1.to(dt), layer.eps1)
        q = _lin(x, layer.q).view(-1, num_heads, d)
        k = _lin(x, layer.k).view(-1, num_kv_heads, d)
        v = _lin(x, layer.v).view(-1, num_kv_heads, d)
        c = cos[:, slot, None, :].to(dt)
        s_ = sin[:, slot, None, :].to(dt)
        q = q * c + q.roll(half, dims=-1) * s_
        k = k * c + k.roll(half, dims=-1) * s_
        att = torch.empty_like(q)
        for r in range(p * g):
            pi, gi = divmod(r, g)
            keys[i][pi, :, gi, :, slot] = k[r].to(keys[i].dtype)
            values[i][pi, :, gi, slot, :] = v[r].to(values[i].dtype)
            for hq in range(num_heads):
                kh = hq // rep
                kk = torch.cat([prefix_keys[i][pi, kh].T, keys[i][pi, kh, gi, :, : slot + 1].T]).to(
                    dt
                )  # [S + slot + 1, D]
                vv = torch.cat([prefix_values[i][pi, kh], values[i][pi, kh, gi, : slot + 1]]).to(dt)
                bias = torch.cat([prefix_bias[pi].to(dt), torch.zeros(slot + 1, dtype=dt)])
                w = torch.softmax(kk @ q[r, hq] * scaling + bias, dim=-1)
                att[r, hq] = w @ vv
        h = h + _lin(att.reshape(h.shape[0], -1), layer.o)
        x = _norm(h, layer.norm2.to(dt), layer.eps2)
        h = h + _lin(F.silu(_lin(x, layer.gate)) * _lin(x, layer.up), layer.down)
    return F.linear(_norm(h, final_norm.to(dt), final_eps), lm_head.to(dt))
