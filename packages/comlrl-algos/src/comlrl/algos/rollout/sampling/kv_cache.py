"""KV-cache helpers for the native sampler: preallocated layers and a model-forward decode step.

A ``transformers`` ``DynamicCache`` grows with ``torch.cat`` every step, copying the whole
cache each time; :func:`preallocate_cache` swaps its plain full-attention layers for
buffers sized once per batch. :class:`HFDecodeStepper` feeds one token per row through the
model's own ``forward`` with that cache and a prepared 4D mask; it is the fallback decode
step for models :class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder` does not cover.

Named axes: ``P`` prompts, ``G`` completions per prompt, ``B = P * G`` rows, ``H`` heads,
``D`` head size, ``V`` vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from comlrl.algos.models.hf_cache import cache_kwargs
from transformers.cache_utils import DynamicLayer

__all__ = ["HFDecodeStepper", "PreallocatedLayer", "preallocate_cache"]


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
