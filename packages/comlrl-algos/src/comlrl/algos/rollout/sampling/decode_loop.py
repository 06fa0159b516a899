"""The fixed-shape decode loop: the whole step on the device, captured once as a CUDA graph.

:class:`StaticDecodeLoop` decodes ``B`` rows for up to ``L`` tokens after a prefill. Its
step is one function of fixed-shape device tensors (:meth:`StaticDecodeLoop.step`): the
model's one-token forward over a static KV cache (a ``static_forward(tokens, slot)`` of
:class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder` or
:class:`~comlrl.algos.rollout.sampling.kv_cache.StaticCacheStepper`), the draw with
temperature, top-k and top-p (:func:`~comlrl.algos.rollout.sampling.draw.sample_with_uniforms`),
the behaviour log-prob of the drawn token (:func:`comlrl.kernels.token_logprobs`), padding
after a row's end, EOS bookkeeping, and the writes of the token and log-prob into the output
buffers at the step index (a device tensor). Nothing in it reads a value back to the host,
so on a CUDA device it is captured once per batch (``torch.cuda.CUDAGraph``, after one
warm-up step on a side stream) and replayed for every later token: one graph launch per
token instead of hundreds of kernel launches. On other devices (and where capture fails)
the same function runs eagerly, which is how the CPU tests check it against the eager loop.

The host only draws each step's uniforms (:func:`~comlrl.algos.rollout.sampling.draw.draw_uniforms`,
the same calls on the same streams as the eager loop, so the same tokens are drawn) and
looks at the rows every ``check_every`` steps: whether all are finished, and, with a
``stop`` hook (stop sequences, tool calls), each step's tokens in order, as the eager loop
would have shown them. A row the hook stops is finished on the device (it decodes padding
from then on, inside the same graph: no re-capture) and its tokens after the stop are
replaced by padding. The loop may run up to ``check_every - 1`` steps past the step where
every row finished; those are dropped, and the random streams are put back where the eager
loop would have left them (their state at the start, then the same draws again). With
:class:`~comlrl.algos.rollout.sampling.draw.StreamBlocks` (agents sampling together) that
holds per block: each agent's streams end where its own rows' loop would have ended.

Named axes: ``B`` rows, ``L`` new tokens, ``V`` vocabulary.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from comlrl.algos.rollout.sampling.draw import (
    StreamBlocks,
    Streams,
    draw_uniforms,
    rewind_blocks,
    sample_with_uniforms,
    stream_states,
)
from comlrl.core import SamplingParams
from comlrl.kernels import token_logprobs

__all__ = ["CHECK_EVERY", "StaticDecodeLoop"]

#: Steps between two looks at the rows (one device-to-host copy each): at most this many
#: minus one steps are decoded after every row has finished.
CHECK_EVERY = 8

_WARNED: set[str] = set()
_WARN_LOCK = threading.Lock()


class StaticDecodeLoop:
    """Decode ``B`` rows with a fixed-shape step, replayed as a CUDA graph on CUDA devices.

    Args:
        static_forward: ``(tokens [B] int64, slot [1] int64) -> logits [B, V]``: feeds
            one token per row at completion slot ``slot`` (``t`` for the ``t``-th fed
            token) of a static KV cache, device-side only.
        rows: ``B``.
        params: sampling settings (``L = params.max_new_tokens``, temperature, top-k,
            top-p); fixed for the loop (they are part of the captured step).
        eos_token_ids: ids that end a row.
        pad_token_id: written after a row's end.
        device: the rows' device.
        capture: capture the step as a CUDA graph (a CUDA device only; ignored elsewhere).
        check_every: steps between looks at the rows on the host (>= 1).
        name: the agent's name, for the warning when capture fails.

    Raises:
        ValueError: ``check_every < 1``.
    """

    def __init__(
        self,
        static_forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        rows: int,
        params: SamplingParams,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        device: torch.device,
        capture: bool,
        check_every: int = CHECK_EVERY,
        name: str = "agent",
    ) -> None:
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.static_forward = static_forward
        self.params = params
        self.pad_token_id = int(pad_token_id)
        self.device = device
        self.capture = bool(capture) and device.type == "cuda"
        self.check_every = int(check_every)
        self.name = name
        #: ``"off"`` (not asked for), ``"captured"``, or ``"failed: <why>"`` after :meth:`run`.
        self.capture_status = "off"
        b, length = int(rows), int(params.max_new_tokens)
        self.rows, self.length = b, length
        with torch.device(device):
            self.eos = torch.tensor([int(i) for i in eos_token_ids], dtype=torch.long)
            self.tokens = torch.full((b, length), self.pad_token_id, dtype=torch.long)
            self.logprobs = torch.zeros(b, length, dtype=torch.float32)
            # the step at which a row finished (EOS, or the stop hook); L while it runs
            self.done_at = torch.full((b,), length, dtype=torch.long)
            self.done = torch.zeros(b, dtype=torch.bool)
            self.uniforms = torch.zeros(b, 1, dtype=torch.float32)
            self.tokens_in = torch.full((b,), self.pad_token_id, dtype=torch.long)
            self.index = torch.zeros(1, dtype=torch.long)  # the token being drawn
            self.slot = torch.zeros(1, dtype=torch.long)  # the completion slot being fed
        self._graph: Any = None

    # ------------------------------------------------------------------ the device step
    def sample_into(self, logits: torch.Tensor) -> None:
        """Draw token ``index`` of every row from ``logits [B, V]`` and the uniforms
        buffer, and write it, its log-prob and the rows' end into the buffers."""
        params = self.params
        token = sample_with_uniforms(logits, self.uniforms, params)
        logp = token_logprobs(logits, token, temperature=params.temperature)
        token = token.masked_fill(self.done, self.pad_token_id)
        if self.eos.numel():
            ended = (token[:, None] == self.eos).any(-1) & ~self.done
            self.done_at.copy_(torch.where(ended, self.index, self.done_at))
            self.done.logical_or_(ended)
        self.tokens.index_copy_(1, self.index, token[:, None])
        self.logprobs.index_copy_(1, self.index, logp[:, None].float())
        self.tokens_in.copy_(token)
        self.index.add_(1)

    def step(self) -> None:
        """One decode step: feed the last tokens, draw the next (what the graph holds)."""
        logits = self.static_forward(self.tokens_in, self.slot)
        self.slot.add_(1)
        self.sample_into(logits)

    # ------------------------------------------------------------------ the host loop
    @torch.no_grad()
    def run(
        self,
        first_logits: torch.Tensor,
        generator: Streams = None,
        stop: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Decode from the prefill's next-token logits ``[B, V]``.

        Args:
            first_logits: the logits that draw token 0.
            generator: as for :meth:`~comlrl.algos.rollout.sampling.native.NativeSampler.sample`.
            stop: as for :meth:`~comlrl.algos.rollout.sampling.native.NativeSampler.sample`;
                called with each step's ``[B]`` tokens (on the CPU) in order, every
                ``check_every`` steps.

        Returns:
            ``[B, n]`` int64 tokens, ``[B, n]`` float32 behaviour log-probs (``n`` the
            steps the eager loop would have taken: until every row finished, at most
            ``L``), and per block of ``generator`` (one block unless it is
            :class:`~comlrl.algos.rollout.sampling.draw.StreamBlocks`) the steps the block's
            rows alone would have taken; each block's streams are left as after those.
        """
        b, length = self.rows, self.length
        states = stream_states(generator, self.device)
        stopped_at = [length] * b  # the step each row was stopped by the hook (host)
        eos_at: list[int] = [length] * b
        start, end = 0, 1  # the first look is after token 0 (drawn from the prefill)
        self._draw(generator)
        self.sample_into(first_logits)
        finished = False
        while True:
            # one look at the rows after steps [start, end)
            if stop is not None:
                chunk = self.tokens[:, start:end].cpu()
                eos_at = self.done_at.tolist()
                hook = self._apply_stop(stop, chunk, start, eos_at, stopped_at)
                if hook:
                    rows = torch.tensor(hook, dtype=torch.long)
                    steps = torch.tensor([stopped_at[r] for r in hook], dtype=torch.long)
                    rows, steps = rows.to(self.device), steps.to(self.device)
                    self.done.index_fill_(0, rows, True)
                    self.done_at.index_copy_(
                        0, rows, torch.minimum(self.done_at.index_select(0, rows), steps)
                    )
                last = max(min(e, s) for e, s in zip(eos_at, stopped_at, strict=True))
            else:
                last = int(self.done_at.max())
            if last < end:  # every row finished by step `last`
                finished = True
                break
            if end >= length:
                break
            start, end = end, min(end + self.check_every, length)
            for _ in range(start, end):
                self._draw(generator)
                self._step_once()
        # per block, the steps until its last row finished (the eager loop stops there)
        blocks = len(generator.blocks) if isinstance(generator, StreamBlocks) else 1
        ends = (self.done_at.view(blocks, -1).amax(dim=1) + 1).clamp(max=length).tolist()
        n = max(ends) if finished else length
        rewind_blocks(generator, states, ends, end, b, self.device)
        tokens = self.tokens[:, :n]
        after = torch.arange(n, device=self.device)[None, :] > self.done_at[:, None]
        return (
            tokens.masked_fill(after, self.pad_token_id),
            self.logprobs[:, :n].clone(),
            [int(x) for x in ends],
        )

    def _draw(self, generator: Streams) -> None:
        draw_uniforms(self.rows, generator, self.device, torch.float32, out=self.uniforms)

    def _apply_stop(
        self,
        stop: Callable[[torch.Tensor], torch.Tensor],
        chunk: torch.Tensor,
        start: int,
        eos_at: list[int],
        stopped_at: list[int],
    ) -> list[int]:
        """Call ``stop`` with each step of ``chunk`` ``[B, k]`` (steps ``start...``) as
        the eager loop shows it (padding after a row's end), up to the step where every
        row has finished; record the rows it stops in ``stopped_at`` and return them."""
        hook: list[int] = []
        pad = self.pad_token_id
        for j in range(chunk.shape[1]):
            t = start + j
            token = chunk[:, j].clone()
            over = [r for r in range(len(stopped_at)) if stopped_at[r] < t]
            if over:
                token[over] = pad
            verdict = stop(token).to("cpu", torch.bool)
            for r in verdict.nonzero().flatten().tolist():
                if stopped_at[r] == self.length and eos_at[r] > t:
                    stopped_at[r] = t
                    hook.append(r)
            if all(min(e, s) <= t for e, s in zip(eos_at, stopped_at, strict=True)):
                break  # the eager loop stops here: it shows the hook no later step
        return hook

    def _step_once(self) -> None:
        """One decode step: eagerly, or (CUDA, ``capture``) the graph's replay; the first
        step of a loop is the warm-up and the capture."""
        if not self.capture:
            self.step()
            return
        # with the loop's device current: an agent on cuda:1 may be sampled from a thread
        # whose current device is cuda:0, and a replay runs on the current stream
        with torch.cuda.device(self.device):
            if self._graph is not None:
                self._graph.replay()
                return
            current = torch.cuda.current_stream()
            side = torch.cuda.Stream()
            # warm-up outside any graph: library handles and workspaces are made here
            side.wait_stream(current)
            with torch.cuda.stream(side):
                self.step()
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                # capture_begin/end rather than torch.cuda.graph(), which also synchronizes
                # the device and empties the caching allocator (a stall for the other
                # agents' work); thread_local: other agents' threads keep launching work
                side.wait_stream(current)
                with torch.cuda.stream(side):
                    graph.capture_begin(capture_error_mode="thread_local")
                    try:
                        self.step()
                    finally:
                        graph.capture_end()
                current.wait_stream(side)
            except Exception as err:  # capture impossible: decode eagerly from here on
                self.capture = False
                self.capture_status = f"failed: {type(err).__name__}: {err}"
                _warn_once(
                    f"agent {self.name!r}: the decode step could not be captured as a CUDA "
                    f"graph ({type(err).__name__}: {err}); decoding eagerly instead.",
                )
                return
            # the warm-up was this step; capture only records, so the graph's first
            # replay is the next step
            self._graph = graph
            self.capture_status = "captured"

    def release(self) -> None:
        """Drop the graph (its memory pool) and the buffers."""
        self._graph = None


def _warn_once(message: str) -> None:
    """A ``RuntimeWarning`` with ``message``, once per process."""
    with _WARN_LOCK:
        if message in _WARNED:
            return
        _WARNED.add(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
