"""Drawing one token per row: temperature, top-k and top-p filters, inverse-CDF draws.

Every sampling path of the native sampler draws through these functions: the eager loop
(:class:`~comlrl.algos.rollout.sampling.native.NativeSampler`) and the fixed-shape loop whose
step may be replayed as a CUDA graph
(:class:`~comlrl.algos.rollout.sampling.decode_loop.StaticDecodeLoop`). The random numbers are
drawn by :func:`draw_uniforms` (one uniform per row per step, from the caller's streams)
and turned into tokens by :func:`sample_with_uniforms`, a pure function of the logits and
those uniforms with no host synchronisation, so it can run inside a captured graph and
gives the same tokens as the eager loop from the same uniforms.

Named axes: ``B`` rows, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import torch
from comlrl.core import SamplingParams

__all__ = [
    "StreamBlocks",
    "Streams",
    "draw_uniforms",
    "filtered_scores",
    "generator_objects",
    "rewind_blocks",
    "stream_states",
    "sample_next",
    "sample_with_uniforms",
]


@dataclass(frozen=True)
class StreamBlocks:
    """The random streams of a batch made of ``n`` equal contiguous blocks of rows (one
    per agent when agents that share a base sample together): block ``i`` draws its rows'
    uniforms from ``blocks[i]`` exactly as :func:`draw_uniforms` would for that block
    alone (one stream, or one per prompt), so every agent's tokens and streams are those
    of sampling it on its own."""

    blocks: tuple[torch.Generator | Sequence[torch.Generator] | None, ...]


#: What a sampling call draws from: torch's default stream (``None``), one stream, one
#: stream per prompt, or blocks of rows with their own streams.
Streams: TypeAlias = torch.Generator | Sequence[torch.Generator] | StreamBlocks | None


def filtered_scores(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The scores :func:`sample_next` draws from: ``logits [B, V] / T`` in float32 with
    the tokens top-k and then top-p drop set to ``-inf``.

    ``softmax`` of them is the truncated, renormalised sampling distribution. Behaviour
    log-probs are *not* taken from it but from the full ``log_softmax(logits / T)`` (the
    distribution the update computes; see :mod:`~comlrl.algos.rollout.sampling.native`).
    With float32 logits, ``T = 1`` and no filter the result is ``logits`` itself: do not
    modify it in place.
    """
    scores = logits.float()
    if params.temperature != 1.0:  # x / 1.0 == x: skip the op (it is per decode step)
        scores = scores / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (keeps at least one)
        drop = (cum - sorted_scores.softmax(-1)) >= params.top_p
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(drop, float("-inf")))
    return scores


def sample_with_uniforms(
    logits: torch.Tensor, uniforms: torch.Tensor, params: SamplingParams
) -> torch.Tensor:
    """One token per row of ``logits [B, V]`` from the uniforms ``[B, 1]`` (float32 in
    ``[0, 1)``): the smallest token whose cumulative filtered probability exceeds the
    row's uniform (inverse-CDF sampling; :func:`filtered_scores` gives the distribution).

    Returns ``[B]`` int64 token ids. Device-side only (no host synchronisation), so it
    may run inside a captured CUDA graph.
    """
    cdf = filtered_scores(logits, params).softmax(-1).cumsum(-1)
    u = uniforms.to(cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: Streams = None
) -> torch.Tensor:
    """Sample one token per row from ``logits [B, V]`` with temperature, top-k and top-p.

    ``generator`` is one stream, ``P`` streams of which stream ``p`` draws the uniforms
    of rows ``[p * B / P, (p + 1) * B / P)`` (one prompt's ``G`` rows), or
    :class:`StreamBlocks`. Inverse-CDF
    sampling, one uniform per row and a binary search over the cumulative probabilities
    (``torch.multinomial`` draws ``V`` exponentials per row, ~10x slower on CPU).

    Raises:
        ValueError: ``B`` is not a multiple of the number of streams.
    """
    u = draw_uniforms(logits.shape[0], generator, logits.device, torch.float32)
    return sample_with_uniforms(logits, u, params)


def draw_uniforms(
    rows: int,
    generator: Streams,
    device: torch.device,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ``[B, 1]`` uniforms of one sampling step (see :func:`sample_next` for how
    ``generator``'s streams split the rows); every sampling path draws through this.

    ``out``: a ``[B, 1]`` tensor of ``dtype`` on ``device`` to draw into (the same numbers;
    the fixed-shape loop keeps its input buffer's address this way).

    Raises:
        ValueError: ``rows`` is not a multiple of the number of streams or blocks.
    """
    if isinstance(generator, StreamBlocks):
        n = len(generator.blocks)
        if not n or rows % n:
            raise ValueError(f"{rows} rows cannot be split into {n} blocks of streams")
        per = rows // n
        if out is None:
            out = torch.empty(rows, 1, device=device, dtype=dtype)
        for i, block in enumerate(generator.blocks):
            draw_uniforms(per, block, device, dtype, out=out[i * per : (i + 1) * per])
        return out
    if generator is None or isinstance(generator, torch.Generator):
        if out is not None:
            return torch.rand(rows, 1, device=device, dtype=dtype, generator=generator, out=out)
        return torch.rand(rows, 1, device=device, dtype=dtype, generator=generator)
    if not generator or rows % len(generator):
        raise ValueError(f"{rows} rows cannot be split over {len(generator)} generators")
    per = rows // len(generator)
    if out is not None:
        for i, g in enumerate(generator):
            torch.rand(
                per, 1, device=device, dtype=dtype, generator=g, out=out[i * per : (i + 1) * per]
            )
        return out
    return torch.cat(
        [torch.rand(per, 1, device=device, dtype=dtype, generator=g) for g in generator]
    )


def generator_objects(
    generator: torch.Generator | Sequence[torch.Generator] | None, device: torch.device
) -> list[torch.Generator]:
    """The generator objects a draw on ``device`` advances (``None``: torch's default
    generator of that device)."""
    if isinstance(generator, torch.Generator):
        return [generator]
    if generator is not None:
        return list(generator)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return [torch.cuda.default_generators[index]]
    return [torch.default_generator]


def _blocks(generator: Streams) -> tuple[torch.Generator | Sequence[torch.Generator] | None, ...]:
    return generator.blocks if isinstance(generator, StreamBlocks) else (generator,)


def stream_states(generator: Streams, device: torch.device) -> list[list[torch.Tensor]]:
    """Per block, the states of its generators (to rewind them with :func:`rewind_blocks`)."""
    return [[g.get_state() for g in generator_objects(b, device)] for b in _blocks(generator)]


def rewind_blocks(
    generator: Streams,
    states: list[list[torch.Tensor]],
    draws: Sequence[int],
    drawn: int,
    rows: int,
    device: torch.device,
) -> None:
    """Leave each block's streams as ``draws[i]`` steps would have, where ``drawn`` were
    drawn from the ``states`` (:func:`stream_states`) on: a block that finished earlier
    (its agent alone would have stopped there) gets its states back and its draws again.
    ``rows``: the batch's rows."""
    blocks = _blocks(generator)
    per = rows // len(blocks)
    for block, saved, n in zip(blocks, states, draws, strict=True):
        if n >= drawn:
            continue
        for g, state in zip(generator_objects(block, device), saved, strict=True):
            g.set_state(state)
        for _ in range(n):
            draw_uniforms(per, block, device, torch.float32)
