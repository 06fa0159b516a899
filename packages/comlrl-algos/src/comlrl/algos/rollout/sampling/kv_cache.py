"""KV-cache helpers for the native sampler: preallocated layers and a model-forward decode step.

A ``transformers`` ``DynamicCache`` grows with ``torch.cat`` every step, copying the whole
cache each time; :func:`preallocate_cache` swaps its plain full-attention layers for
buffers sized once per batch. :class:`HFDecodeStepper` feeds one token per row through the
model's own ``forward`` with that cache and a prepared 4D mask; it is the fallback decode
step for models :class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder` does not cover.
:class:`StaticCacheStepper` is its fixed-shape twin over ``transformers``' ``StaticCache``
(every step the same shapes, the slot read on the device), the model-forward step of
:class:`~comlrl.algos.rollout.sampling.decode_loop.StaticDecodeLoop`, whose CUDA graph holds it.

Named axes: ``P`` prompts, ``G`` completions per prompt, ``B = P * G`` rows, ``H`` heads,
``D`` head size, ``V`` vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from comlrl.algos.models.hf_cache import cache_kwargs
from transformers.cache_utils import DynamicLayer

__all__ = [
    "HFDecodeStepper",
    "PreallocatedLayer",
    "StaticCacheStepper",
    "preallocate_cache",
    "static_cache_unsupported",
]


class HFDecodeStepper:
    """One-token decode steps through ``model(...)`` with a preallocated KV cache.

    Takes the prefill cache over ``P`` prompts, repeats it for the ``G`` rows of each
    prompt, and keeps the 4D boolean decode mask (one query per row: every real past
    token is visible) so the model does not rebuild it from a 2D mask every step.
    """

    def __init__(
        self,
        model: Any,
        cache: Any,
        prompt_mask: torch.Tensor,
        g: int,
        capacity: int,
        next_pos: torch.Tensor,
    ) -> None:
        cache.batch_repeat_interleave(g)
        preallocate_cache(cache, capacity)
        p, s = prompt_mask.shape
        self.model, self.cache = model, cache
        self.mask4d = torch.zeros(
            p * g, 1, 1, capacity, dtype=torch.bool, device=prompt_mask.device
        )
        self.mask4d[:, 0, 0, :s] = prompt_mask.bool().repeat_interleave(g, dim=0)
        self.pos, self.n = next_pos, s

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens [B]``; return the next logits ``[B, V]``."""
        self.mask4d[:, 0, 0, self.n] = True
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask4d[..., : self.n + 1],
            position_ids=self.pos,
            **cache_kwargs(self.model, self.cache),
            use_cache=True,
        )
        self.pos = self.pos + 1
        self.n += 1
        return out.logits[:, -1]


class PreallocatedLayer(DynamicLayer):  # type: ignore[misc]
    """A ``DynamicLayer`` that appends into a preallocated buffer instead of ``torch.cat``.

    ``keys``/``values`` are views ``[B, H, length, D]`` of ``[B, H, capacity, D]`` buffers,
    so a decode step copies only the new token's keys and values (``torch.cat`` copies the
    whole cache every step). Past the capacity it falls back to concatenation.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__()
        b, h, n, d = keys.shape
        self._kbuf = keys.new_empty(b, h, max(capacity, n), d)
        self._vbuf = values.new_empty(b, values.shape[1], max(capacity, n), values.shape[3])
        self._kbuf[:, :, :n] = keys
        self._vbuf[:, :, :n] = values
        self._n = n
        self.dtype, self.device = keys.dtype, keys.device
        self.keys, self.values = self._kbuf[:, :, :n], self._vbuf[:, :, :n]
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, m = self._n, key_states.shape[-2]
        if n + m > self._kbuf.shape[-2]:
            return super().update(key_states, value_states, *args, **kwargs)  # type: ignore[no-any-return]
        self._kbuf[:, :, n : n + m] = key_states
        self._vbuf[:, :, n : n + m] = value_states
        self._n = n + m
        self.keys, self.values = self._kbuf[:, :, : n + m], self._vbuf[:, :, : n + m]
        return self.keys, self.values


def preallocate_cache(cache: Any, capacity: int) -> None:
    """Swap the plain full-attention layers of a ``DynamicCache`` for preallocated ones."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return
    for i, layer in enumerate(layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if type(layer) is DynamicLayer and keys is not None and values is not None and keys.numel():
            layers[i] = PreallocatedLayer(keys, values, capacity)


def static_cache_unsupported(model: Any, cache: Any) -> str | None:
    """Why :class:`StaticCacheStepper` cannot continue ``cache`` (a prefill's
    ``DynamicCache``) for ``model``, or ``None`` when it can: every layer must be a plain
    full-attention layer on both sides (no sliding windows, no other cache types)."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return f"the prefill cache is a {type(cache).__name__} without layers"
    if any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        return f"the prefill cache has {kinds} layers (only full-attention layers are static)"
    try:
        from transformers.cache_utils import StaticCache, StaticLayer

        static = StaticCache(config=model.config, max_cache_len=1)
    except Exception as err:  # an older transformers, or a config it cannot read
        return f"transformers' StaticCache is not available here ({type(err).__name__}: {err})"
    if len(static.layers) != len(layers) or any(type(x) is not StaticLayer for x in static.layers):
        return "the model's static cache has layers other than full attention"
    return None


class StaticCacheStepper:
    """Fixed-shape one-token steps through ``model(...)`` with ``transformers``' ``StaticCache``.

    Takes the prefill cache over ``P`` prompts, repeats it for the ``G`` rows of each
    prompt into a ``StaticCache`` of ``capacity`` positions, and keeps a 4D boolean mask
    over all of them (the completion slots open one per step). :meth:`static_forward` reads
    the slot from a device tensor and the cache writes at its own device-side position,
    so a step has fixed shapes and no host synchronisation (check first with
    :func:`static_cache_unsupported`).

    Args:
        model: the causal LM (or an adapter view of one: any callable taking the
            ``transformers`` forward arguments).
        cache: the prefill's ``DynamicCache`` (layers with ``keys``/``values``
            ``[P, Hkv, S, D]``).
        prompt_mask: ``[P, S]`` attention mask of the prompts.
        g: ``G`` rows per prompt (``B = P * G``, prompt-major).
        capacity: ``S + L``, the positions of the static cache.
        next_pos: ``[B, 1]`` position id of each row's first fed token.
    """

    def __init__(
        self,
        model: Any,
        cache: Any,
        prompt_mask: torch.Tensor,
        g: int,
        capacity: int,
        next_pos: torch.Tensor,
    ) -> None:
        from transformers.cache_utils import StaticCache

        p, s = prompt_mask.shape
        static = StaticCache(config=model.config, max_cache_len=capacity)
        layer: Any  # a StaticLayer (checked by static_cache_unsupported)
        for layer, src in zip(static.layers, cache.layers, strict=True):
            keys = src.keys.repeat_interleave(g, dim=0)
            values = src.values.repeat_interleave(g, dim=0)
            layer.lazy_initialization(keys, values)
            layer.keys[:, :, :s] = keys
            layer.values[:, :, :s] = values
            if hasattr(layer, "cumulative_length"):  # writes at its own device-side count
                layer.cumulative_length.fill_(s)
        self._positioned = not hasattr(static.layers[0], "cumulative_length")
        self.model, self.cache = model, static
        self.mask4d = torch.zeros(
            p * g, 1, 1, capacity, dtype=torch.bool, device=prompt_mask.device
        )
        self.mask4d[:, 0, 0, :s] = prompt_mask.bool().repeat_interleave(g, dim=0)
        self.start, self.prefix = next_pos, s

    def static_forward(self, tokens: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens [B]`` at completion slot ``slot`` (``[1]`` int64, ``t`` for the
        ``t``-th fed token); return the next logits ``[B, V]``."""
        position = slot + self.prefix
        self.mask4d.index_fill_(-1, position, True)
        extra: dict[str, Any] = {}
        if self._positioned:  # transformers < 5.24: the layers write at cache_position
            extra["cache_position"] = position
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask4d,
            position_ids=self.start + slot,
            **cache_kwargs(self.model, self.cache),
            use_cache=True,
            **extra,
        )
        return out.logits[:, -1]  # type: ignore[no-any-return]
