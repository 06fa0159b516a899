"""A lean decode step for Llama-family causal LMs (Llama, Qwen2, Mistral).

During sampling a Hugging Face ``model(...)`` call per new token spends most of its time
outside the maths for small and mid-sized models: module dispatch, mask construction,
cache bookkeeping and output objects cost about 2 ms per call on a CPU, which is more than
the arithmetic of a sub-10M-parameter model on a batch of 32 rows. :class:`FastDecoder`
runs the same decoder-layer maths (RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU MLP, LM head) directly on the model's own parameter tensors with a preallocated KV
cache, so a decode step is a few dozen tensor ops.

On a CPU with float32 weights the step runs as one C++ call instead
(:mod:`~comlrl.algos.rollout.sampling.fast_decode.cpp_step`: same maths on the same cache, ~10x
faster for small models); the Python step is the fallback and serves every other case.

It is used only for the one-token decode steps of :class:`comlrl.algos.rollout.agent.HFAgent`'s
native sampler; the prompt prefill, the training forward and the reference model all go
through the model's own ``forward``. :meth:`FastDecoder.for_model` accepts a model only
when every module on the decode path is a plain ``torch.nn`` building block of a known
architecture (no adapters, quantized linears, hooks or sliding windows); anything else
keeps the Hugging Face path. ``HFAgent`` also checks the first decode step of each agent
against the model's own forward and falls back if they disagree.

The fixed-shape step (``start(..., static=True)``, then :meth:`FastDecoder.static_step`)
keeps a zero-initialised cache of every future position and masks the positions not yet
written with ``-inf`` (the same softmax as the growing cache: ``exp(-inf) = 0``), and reads
its completion slot from a device tensor: every step has the same shapes and launches the
same kernels with no host synchronisation, so the whole decode step (with sampling) can be
captured once as a CUDA graph and replayed
(:class:`~comlrl.algos.rollout.sampling.decode_loop.StaticDecodeLoop`).

Maths (per layer, one new token per row, Touvron et al. 2023 / Qwen2 technical report):
``h += o(attn(rope(q(n1(h))), rope(k(n1(h))), v(n1(h))))`` and
``h += down(silu(gate(n2(h))) * up(n2(h)))``, with ``n(x) = w * x / sqrt(mean(x^2) + eps)``
computed in float32 and attention softmax in float32, matching ``transformers``' eager and
SDPA code paths to float rounding.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from comlrl.algos.rollout.sampling.fast_decode.cpp_step import (
    NativeBatch,
    choose_native,
)
from comlrl.algos.rollout.sampling.fast_decode.layers import DecodeLayer, rms_norm
from comlrl.algos.rollout.sampling.fast_decode.linears import (
    FUSE_MAX_ELEMENTS,
    Linear,
    adapted,
    apply_linear,
    apply_linears,
    as_linear,
    fused,
)
from comlrl.algos.rollout.sampling.fast_decode.lora import base_linear, is_lora_layer, lora_delta
from comlrl.algos.rollout.sampling.fast_decode.support import (
    adapter_layout,
    unsupported_reason,
)

__all__ = [
    "FastDecoder",
]


class FastDecoder:
    """One-token decode steps for a Llama-family ``transformers`` causal LM.

    Build it with :meth:`for_model` (``None`` when the model is not supported), call
    :meth:`start` with the prefill's KV cache, then :meth:`step` once per new token.
    The weights are read when :meth:`start` runs, so a decoder can be reused across
    optimizer steps (call :meth:`start` again for each batch).

    Args:
        model: a ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or ``MistralForCausalLM``
            (checked by :meth:`for_model`).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        cfg = model.config
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.num_heads)
        attn0 = model.model.layers[0].self_attn
        self.head_dim = int(attn0.head_dim)
        self.scaling = float(attn0.scaling)
        self.layers: list[DecodeLayer] = []
        self._length = 0
        self._native: NativeBatch | None = None
        #: ``"on"`` when :meth:`step` runs as one C++ call, else why not (set by :meth:`start`).
        self.native_status = "unstarted"

    # ------------------------------------------------------------------ support
    @classmethod
    def unsupported_reason(cls, model: Any, max_length: int | None = None) -> str | None:
        """Why :class:`FastDecoder` cannot run ``model`` (``None`` when it can):
        :func:`~comlrl.algos.rollout.sampling.fast_decode.support.unsupported_reason`."""
        return unsupported_reason(model, max_length)

    @classmethod
    def for_model(cls, model: Any, max_length: int | None = None) -> FastDecoder | None:
        """A decoder for ``model``, or ``None`` when :meth:`unsupported_reason` says no."""
        return None if cls.unsupported_reason(model, max_length) is not None else cls(model)

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def start(
        self,
        cache: Any,
        prompt_mask: torch.Tensor,
        group_size: int,
        positions: torch.Tensor,
        capacity: int,
        *,
        static: bool = False,
        native: bool = True,
    ) -> None:
        """Take the prefill's KV cache and get ready for :meth:`step`.

        Args:
            cache: the ``past_key_values`` of the prompt prefill over ``P`` prompts
                (a ``transformers`` ``DynamicCache``; layers with ``keys``/``values``
                ``[P, Hkv, S, D]``).
            prompt_mask: ``[P, S]`` attention mask of the prompts (1 = real token).
            group_size: ``G``; each prompt's cache is repeated for its ``G`` rows
                (``B = P * G``, prompt-major).
            positions: ``[B, T]`` int64 position ids of the ``T`` tokens that will be fed
                to :meth:`step`, in order.
            capacity: ``S + T``, the cache length to preallocate.
            static: run every step with the same tensor shapes (attention over all
                ``capacity`` positions, the unwritten ones masked; :meth:`static_step`);
                same logits to float rounding, a little more arithmetic.
            native: run each (growing-cache) step as one C++ call when the model is float32
                on CPU and the kernel is built (:attr:`native_status` says whether it does).

        Raises:
            ValueError: the cache does not have one layer per decoder layer.
        """
        model = self.model
        base = model.model
        layers = base.layers
        cache_layers = getattr(cache, "layers", None)
        if cache_layers is None or len(cache_layers) != len(layers):
            raise ValueError(
                "FastDecoder.start: the prefill cache does not match the model's layers"
            )
        static = bool(static)
        g = int(group_size)
        p, s = prompt_mask.shape
        # The fixed-shape step attends over every completion slot, so the slots not yet
        # written must hold finite numbers (zeros) for their masked scores to vanish.
        new_cache = torch.Tensor.new_zeros if static else torch.Tensor.new_empty
        # Rotary cos/sin for every future step at once: [B, T, D] each.
        dtype = cache_layers[0].keys.dtype
        cos, sin = base.rotary_emb(
            torch.empty(0, dtype=dtype, device=prompt_mask.device), positions
        )
        half = self.head_dim // 2
        # rotate_half(x) * sin == flip_halves(x) * [-sin_1, sin_2]: fold the sign into sin.
        self._cos = cos.to(dtype)
        self._sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).to(dtype)
        layout = adapter_layout(model)
        with_lora = any(
            is_lora_layer(m)
            for layer in layers
            for m in (*layer.self_attn.children(), *layer.mlp.children())
        )
        if with_lora:  # the C++ step reads plain weights only
            kernel, self.native_status = None, "off: LoRA adapters on the decode path"
        else:
            kernel, self.native_status = choose_native(self, native and not static, cos.shape[-1])
        rows = p * g
        if layout is not None and rows % len(layout):
            raise ValueError(
                f"FastDecoder.start: {rows} rows do not split into {len(layout)} adapter blocks"
            )
        self.layers = []
        for layer, cl in zip(layers, cache_layers):
            attn, mlp = layer.self_attn, layer.mlp
            projs = [attn.q_proj, attn.k_proj, attn.v_proj]
            gu = [mlp.gate_proj, mlp.up_proj]
            fuse = sum(base_linear(m).weight.numel() for m in projs + gu) <= FUSE_MAX_ELEMENTS
            qkv: list[Linear] = []  # the C++ step reads the modules' own weights
            gate_up: list[Linear] = []
            if kernel is None:
                qkv = _linears(projs, fuse, rows, layout)
                gate_up = _linears(gu, fuse, rows, layout)
            keys, values = cl.keys, cl.values  # [P, Hkv, S, D]
            steps = capacity - s
            self.layers.append(
                DecodeLayer(
                    norm1=layer.input_layernorm.weight,
                    eps1=float(layer.input_layernorm.variance_epsilon),
                    qkv=qkv,
                    o=_linears([attn.o_proj], False, rows, layout)[0],
                    norm2=layer.post_attention_layernorm.weight,
                    eps2=float(layer.post_attention_layernorm.variance_epsilon),
                    gate_up=gate_up,
                    down=_linears([mlp.down_proj], False, rows, layout)[0],
                    # The prompt part of the cache is kept once per prompt (its G rows attend
                    # to it together); only the completion part is per row.
                    prefix_keys=keys.transpose(-1, -2).contiguous(),
                    prefix_values=values.contiguous(),
                    keys=new_cache(keys, (p, self.num_kv_heads, g, self.head_dim, steps)),
                    values=new_cache(values, (p, self.num_kv_heads, g, steps, self.head_dim)),
                )
            )
        # Additive attention bias [P, 1, 1, 1, capacity]: -inf on prompt padding, 0 elsewhere.
        bias = torch.zeros(p, 1, 1, 1, capacity, dtype=torch.float32, device=prompt_mask.device)
        bias[:, 0, 0, 0, :s].masked_fill_(prompt_mask == 0, float("-inf"))
        if static:  # completion slots open one per step (see step)
            bias[..., s:] = float("-inf")
        self._bias = bias
        self._prompts, self._group, self._prefix = p, g, s
        self._length = s
        self._native = None
        if kernel is not None:
            self._native = NativeBatch(
                kernel,
                prefix_keys=[x.prefix_keys for x in self.layers],  # type: ignore[misc]
                prefix_values=[x.prefix_values for x in self.layers],  # type: ignore[misc]
                keys=[x.keys for x in self.layers],  # type: ignore[misc]
                values=[x.values for x in self.layers],  # type: ignore[misc]
                prompt_bias=bias[:, 0, 0, 0, :s],
                cos=self._cos,
                sin=self._sin,
            )
        self._step = 0
        self._embed = base.embed_tokens.weight
        self._final_norm = (base.norm.weight, float(base.norm.variance_epsilon))
        self._head = as_linear(model.lm_head.weight, None, p * g)
        self._static = static
        if static:  # the slot of step() on the fixed-shape path, written before each step
            self._index = torch.zeros(1, dtype=torch.long, device=prompt_mask.device)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row and return the next-token logits.

        Args:
            tokens: ``[B]`` int64 token ids (the rows' newest tokens).

        Returns:
            ``[B, V]`` logits in the model's dtype.

        Raises:
            RuntimeError: more steps than the ``positions`` given to :meth:`start`.
        """
        t = self._step
        if t >= self._cos.shape[1]:
            raise RuntimeError(
                f"FastDecoder.step: step {t} is past the {self._cos.shape[1]} positions given to start()"
            )
        if self._native is not None:  # slot c's rotary row is row t: c == t here
            logits = self._native(tokens, self._length - self._prefix)
        elif not self._static:
            c = self._length - self._prefix  # completion tokens already in the cache
            logits = self._forward(
                tokens, self._cos[:, t, None, :], self._sin[:, t, None, :], c, c + 1
            )
        else:
            self._index.fill_(t)
            logits = self.static_step(tokens, self._index)
        self._length += 1
        self._step = t + 1
        return logits

    def static_step(self, tokens: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """The fixed-shape step (after ``start(..., static=True)``): feed ``tokens [B]``
        at completion slot ``slot`` (a ``[1]`` int64 tensor on the decoder's device, ``t``
        for the ``t``-th token fed) and return the next-token logits ``[B, V]``.

        Device-side only: the slot is read on the device, the slot's attention bias
        opened in place and the cache written with ``index_copy_``, so a step has fixed
        shapes and no host synchronisation, and can be captured as a CUDA graph. Unlike
        :meth:`step` it keeps no count on the host: the caller advances ``slot``.
        """
        self._bias.index_fill_(-1, slot + self._prefix, 0.0)  # the slot becomes visible
        cos = self._cos.index_select(1, slot)  # [B, 1, D]
        sin = self._sin.index_select(1, slot)
        return self._forward(tokens, cos, sin, slot, None)

    def _forward(
        self,
        tokens: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slot: int | torch.Tensor,
        visible: int | None,
    ) -> torch.Tensor:
        """The decoder maths for one token per row.

        ``slot`` is the completion slot the new keys/values go to (an int, or a ``[1]``
        int64 tensor for the fixed-shape step); the completion part of attention covers
        slots ``[0, visible)``, or all slots (masked by ``_bias``) when ``visible`` is None.
        """
        b = tokens.shape[0]
        p, g, s = self._prompts, self._group, self._prefix
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        rep = hq // hkv
        half = d // 2
        bias = self._bias if visible is None else self._bias[..., : s + visible]
        h = F.embedding(tokens, self._embed)  # [B, hidden]
        for layer in self.layers:
            x = rms_norm(h, layer.norm1, layer.eps1)
            qkv = apply_linears(x, layer.qkv)  # [B, (hq + 2 hkv) d]
            # One call per split/rotation rather than a slice per part: at small sizes a
            # decode step's time is per-op overhead, and these move data only (same bits).
            qk, v_new = qkv.split([(hq + hkv) * d, hkv * d], dim=-1)
            qk = qk.view(b, hq + hkv, d)
            qk = qk * cos + qk.roll(half, dims=-1) * sin  # roll by d/2 swaps the halves
            q_new, k_new = qk.split([hq, hkv], dim=1)
            keys, values = layer.keys, layer.values
            prefix_keys, prefix_values = layer.prefix_keys, layer.prefix_values
            assert keys is not None and values is not None
            assert prefix_keys is not None and prefix_values is not None
            # rows are prompt-major (p * G + g): [B, H, D] -> [P, H, G, D]
            new_k = k_new.reshape(p, g, hkv, d).transpose(1, 2)
            new_v = v_new.view(p, g, hkv, d).transpose(1, 2)
            if isinstance(slot, int):
                keys[..., slot] = new_k
                values[:, :, :, slot] = new_v
                keys_seen, values_seen = keys[..., :visible], values[:, :, :, :visible]
            else:
                keys.index_copy_(4, slot, new_k.unsqueeze(-1))
                values.index_copy_(3, slot, new_v.unsqueeze(3))
                keys_seen, values_seen = keys, values
            q = q_new.reshape(p, g, hkv, rep, d).transpose(1, 2)  # [P, hkv, G, rep, d]
            q_prefix = q.reshape(p, hkv, g * rep, d)
            scores = torch.cat(
                [
                    torch.matmul(q_prefix, prefix_keys).view(p, hkv, g, rep, s),
                    torch.matmul(q, keys_seen),
                ],
                dim=-1,
            )  # [P, hkv, G, rep, S + visible]
            if scores.dtype != torch.float32:  # softmax in float32 (no-op calls skipped)
                probs = torch.softmax(scores.float() * self.scaling + bias, -1).to(q.dtype)
            else:
                probs = torch.softmax(scores * self.scaling + bias, dim=-1)
            probs_prefix, probs_new = probs.split([s, probs.shape[-1] - s], dim=-1)
            attn = torch.matmul(probs_new, values_seen)  # [P, hkv, G, rep, d]
            attn = attn + torch.matmul(
                probs_prefix.reshape(p, hkv, g * rep, s), prefix_values
            ).view(p, hkv, g, rep, d)
            h = h + apply_linear(attn.transpose(1, 2).reshape(b, hq * d), layer.o)
            x = rms_norm(h, layer.norm2, layer.eps2)
            gu = apply_linears(x, layer.gate_up)
            gate, up = gu.chunk(2, dim=-1)
            h = h + apply_linear(F.silu(gate) * up, layer.down)
        h = rms_norm(h, *self._final_norm)
        return apply_linear(h, self._head)

    def release(self) -> None:
        """Drop the KV cache and weight copies (call when decoding is done)."""
        self.layers = []
        self._native = None
        self._bias = self._cos = self._sin = None  # type: ignore[assignment]


def _linears(mods: list[Any], fuse: bool, rows: int, layout: list[str] | None) -> list[Linear]:
    """The step's linears for ``mods`` applied side by side: one fused or one per module,
    each with the LoRA delta of the adapter blocks ``layout`` where the modules have one."""
    if fuse:
        return [adapted(as_linear(*fused(mods), rows), lora_delta(mods, layout))]
    out: list[Linear] = []
    for m in mods:
        lin = base_linear(m)
        out.append(adapted(as_linear(lin.weight, lin.bias, rows), lora_delta([m], layout)))
    return out
