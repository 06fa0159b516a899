"""The native sampling loop: one prefill per prompt, a shared-prefix KV cache, one step per token.

:class:`NativeSampler` turns ``P`` left-padded prompts into ``B = P * G`` completions with
behaviour log-probs. Each prompt is prefilled once and its KV cache repeated for its ``G``
rows; every new token is one decode step for all rows, through
:class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder` for Llama-family models (checked once
against the model's own forward) or the model's ``forward``
(:class:`~comlrl.algos.rollout.sampling.kv_cache.HFDecodeStepper`) otherwise. :func:`hf_generate`
is the ``model.generate`` alternative for models with exotic caches.

Behaviour log-probs are those of the tempered full softmax (``log_softmax(logits / T)``
at the sampled token, computed by :func:`comlrl.kernels.token_logprobs`): top-p/top-k
filters change which tokens can be drawn but are not renormalised into the log-probs,
matching what the training forward recomputes, so the PPO ratio of the first update is
1 under any filter (tested, and likewise for the vLLM backend, which recomputes them
when a filter is on). The update treats the filtered sampler as the full tempered
policy: the filter's truncation is a fixed part of sampling, not of the policy optimised.

Two decode loops follow the prefill. The eager loop looks at every token on the host
(EOS, stop hooks); on CPU with float32 logits each of its tokens' sampling (filters, draw,
log-prob, EOS bookkeeping) is one call of :func:`comlrl.kernels.sample_tokens` with the
uniforms drawn by :func:`~comlrl.algos.rollout.sampling.draw.draw_uniforms` exactly as
:func:`~comlrl.algos.rollout.sampling.draw.sample_next` draws them (same streams, same calls),
so the two give the same tokens except where a uniform falls within float rounding of a
CDF boundary; ``sample_next`` serves everything else. The fixed-shape loop
(:class:`~comlrl.algos.rollout.sampling.decode_loop.StaticDecodeLoop`, the default on CUDA)
runs the whole step on the device over a static KV cache and replays it as a CUDA graph,
drawing the same uniforms: the same tokens as the eager loop.

Named axes: ``P`` prompts, ``G`` completions per prompt, ``B = P * G`` rows, ``S`` padded
prompt length, ``L`` completion tokens, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from comlrl.algos.models.hf_cache import output_cache
from comlrl.algos.models.threads import small_model_threads
from comlrl.algos.rollout.sampling.decode_loop import CHECK_EVERY, StaticDecodeLoop
from comlrl.algos.rollout.sampling.draw import (
    StreamBlocks,
    Streams,
    draw_uniforms,
    rewind_blocks,
    sample_next,
    stream_states,
)
from comlrl.algos.rollout.sampling.fast_decode.decoder import FastDecoder
from comlrl.algos.rollout.sampling.kv_cache import (
    HFDecodeStepper,
    StaticCacheStepper,
    static_cache_unsupported,
)
from comlrl.core import SamplingParams
from comlrl.kernels import token_logprobs

try:  # comlrl-kernels builds that predate sample_tokens keep the Python sampling step
    from comlrl.kernels import sample_tokens, sample_tokens_unavailable
except ImportError:  # pragma: no cover - depends on the installed build
    sample_tokens = None  # type: ignore[assignment]
    sample_tokens_unavailable = None  # type: ignore[assignment]

__all__ = [
    "DECODE_LOOPS",
    "FAST_DECODE_RTOL",
    "NativeSampler",
    "decode_threads",
    "hf_generate",
]

#: The decode loops :class:`NativeSampler` takes (``decode_loop``).
DECODE_LOOPS = ("auto", "static", "eager")

#: Relative tolerance (of the largest |logit|) for the once-per-agent check that the fast
#: decode step matches the model's own forward, per dtype. Float rounding differences are
#: ~1e-6 relative in float32; a real mismatch (wrong rotary or attention maths) is ~1e-1.
FAST_DECODE_RTOL = {
    torch.float32: 1e-3,
    torch.float64: 1e-3,
    torch.bfloat16: 5e-2,
    torch.float16: 2e-2,
}


@contextlib.contextmanager
def decode_threads(model: Any, device: torch.device) -> Iterator[None]:
    """Run CPU decoding of small models on one intra-op thread
    (:func:`~comlrl.algos.models.threads.small_model_threads`; measured there: 0.17 s vs
    0.20 s for 64 steps of 32 rows of the built-in model with 1 vs 2 threads)."""
    with small_model_threads(model, device):
        yield


class NativeSampler:
    """CoMLRL's own sampling loop for one causal LM.

    Args:
        model: a ``transformers`` causal LM whose cache supports ``batch_repeat_interleave``
            (every decoder-only LM with a ``DynamicCache``).
        pad_token_id: id written after a row's EOS.
        eos_token_ids: ids that end a completion.
        fast_decode: run decode steps of Llama-family models through
            :class:`FastDecoder`; a model it does not support, or whose first fast step
            disagrees with its own forward (tolerance :data:`FAST_DECODE_RTOL`), decodes
            through ``model(...)`` and :attr:`fast_decode_status` says why.
        cuda_graphs: on a CUDA device, decode with the fixed-shape loop and replay its
            whole step (forward, sampling, log-probs, EOS and stop bookkeeping) as one CUDA
            graph per token (:class:`~comlrl.algos.rollout.sampling.decode_loop.StaticDecodeLoop`;
            the same tokens from the same random numbers). Ignored elsewhere.
        decode_loop: ``"auto"`` (default): the fixed-shape loop on CUDA devices when
            ``cuda_graphs``, the eager loop elsewhere; ``"static"``: the fixed-shape loop on
            any device (its step captured only on CUDA with ``cuda_graphs``; this is how the
            CPU tests run the graph's step); ``"eager"``: the eager loop (a host check per
            token). :attr:`decode_loop_status` says which loop the last call used and why.
        check_every: steps between the fixed-shape loop's looks at the rows (see
            :class:`~comlrl.algos.rollout.sampling.decode_loop.StaticDecodeLoop`).
        name: used in warnings.

    Raises:
        ValueError: an unknown ``decode_loop``.
    """

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        fast_decode: bool = True,
        cuda_graphs: bool = True,
        decode_loop: str = "auto",
        check_every: int = CHECK_EVERY,
        name: str = "agent",
    ) -> None:
        if decode_loop not in DECODE_LOOPS:
            raise ValueError(
                f"agent {name!r}: decode_loop must be one of {list(DECODE_LOOPS)}, got {decode_loop!r}"
            )
        self.model = model
        self.cuda_graphs = bool(cuda_graphs)
        self.decode_loop = decode_loop
        self.check_every = int(check_every)
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.fast_decode = bool(fast_decode)
        self.name = name
        #: ``"unchecked"``, ``"on"`` (checked against the model's forward), or why it is off.
        self.fast_decode_status = "unchecked" if self.fast_decode else "off: fast_decode=False"
        #: the loop of the last call: ``"static (CUDA graph)"``, ``"static"``, or
        #: ``"eager: <why>"``; ``"unused"`` before the first call.
        self.decode_loop_status = "unused"
        #: why the step is no longer captured (a capture failed once), else ``None``.
        self.graph_off: str | None = None

    def _fast_decoder(self, max_length: int) -> FastDecoder | None:
        """The lean decode step for this batch, or ``None`` to use ``model(...)``."""
        if not self.fast_decode or self.fast_decode_status.startswith("off"):
            return None
        reason = FastDecoder.unsupported_reason(self.model, max_length)
        if reason is not None:
            self.fast_decode_status = f"off: {reason}"
            return None
        return FastDecoder(self.model)

    def _check_fast_step(
        self, fast_logits: torch.Tensor, hf: HFDecodeStepper, token: torch.Tensor
    ) -> torch.Tensor:
        """Compare the first fast decode step with the model's own forward (once per sampler).

        Returns the logits to continue with: the fast ones when they agree, else the
        model's (and fast decoding is switched off for this sampler, with a warning).
        """
        ref = hf.step(token)
        tol = FAST_DECODE_RTOL.get(ref.dtype, 3e-2) * (float(ref.abs().max()) + 1e-6)
        err = float((fast_logits.float() - ref.float()).abs().max())
        if err <= tol:
            self.fast_decode_status = "on"
            return fast_logits
        self.fast_decode_status = f"off: first decode step differs from the model's forward by {err:.3g} (tolerance {tol:.3g})"
        warnings.warn(
            f"agent {self.name!r}: fast decoding disagrees with {type(self.model).__name__}.forward "
            f"(max |logit difference| {err:.3g} > {tol:.3g}); using the model's own forward from now on.",
            RuntimeWarning,
            stacklevel=4,
        )
        return ref

    def _static_forward(
        self,
        cache: Any,
        attention_mask: torch.Tensor,
        g: int,
        next_pos: torch.Tensor,
        params: SamplingParams,
    ) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], FastDecoder | None] | str:
        """The fixed-shape step of this batch and the decoder to release after it, or why
        the eager loop decodes it."""
        device = attention_mask.device
        if self.decode_loop == "eager":
            return "decode_loop='eager'"
        if self.decode_loop == "auto" and not (device.type == "cuda" and self.cuda_graphs):
            return "the fixed-shape loop serves CUDA devices with cuda_graphs (decode_loop='auto')"
        total = attention_mask.shape[1] + params.max_new_tokens
        fast = self._fast_decoder(total)
        if fast is not None:
            if self.fast_decode_status == "unchecked":
                return "the fast decode step is checked against the model's forward first"
            steps = torch.arange(max(params.max_new_tokens - 1, 1), device=device)
            fast.start(cache, attention_mask, g, next_pos + steps, total, static=True)
            return fast.static_step, fast
        reason = static_cache_unsupported(self.model, cache)
        if reason is not None:
            return reason
        stepper = StaticCacheStepper(self.model, cache, attention_mask, g, total, next_pos)
        return stepper.static_forward, None

    @torch.no_grad()
    def sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        stop: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``G`` completions for each of ``P`` left-padded prompts.

        Rows that emitted EOS keep decoding padding (masked later) until all rows are done.

        Args:
            input_ids: ``[P, S]`` int64 prompt ids, left-padded.
            attention_mask: ``[P, S]`` 0/1, 0 on padding.
            params: sampling settings (``G = params.num_generations``).
            generator: the random stream to draw from (``None``: torch's global one), or
                ``P`` streams, one per prompt, each drawing its prompt's ``G`` rows.
            stop: called after every step with that step's tokens ``[B]``; the rows it
                returns True for (``[B]`` bool) are finished like an EOS row (their token
                is kept, padding follows). Tool calls pause rows this way
                (:mod:`comlrl.algos.rollout.tool_calls`). The fixed-shape loop calls it
                every ``check_every`` steps with each of those steps' tokens in order.

        Returns:
            completion ids ``[B, L]`` (int64, the pad id after EOS) and behaviour
            log-probs ``[B, L]`` (float32) of the tempered full softmax.
        """
        ids, logp, _ = self._sample(input_ids, attention_mask, params, generator, stop)
        return ids, logp

    @torch.no_grad()
    def sample_blocks(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        streams: StreamBlocks,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`sample` for a batch of ``n`` equal blocks of prompts with their own
        random streams (agents sampling together, one block each): per block its
        completion ids ``[B / n, L_i]`` and log-probs, ``L_i`` the steps its rows alone
        would have taken, and its streams left where sampling it alone would leave them.
        """
        ids, logp, ends = self._sample(input_ids, attention_mask, params, streams, None)
        rows = ids.shape[0] // len(ends)
        return [
            (ids[i * rows : (i + 1) * rows, :n], logp[i * rows : (i + 1) * rows, :n])
            for i, n in enumerate(ends)
        ]

    def _sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: Streams,
        stop: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Prefill, then the fixed-shape or the eager loop; also per block of streams the
        steps its rows took."""
        g = params.num_generations
        model = self.model
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = output_cache(out)
        logits = out.logits[:, -1].repeat_interleave(g, dim=0)
        next_pos = attention_mask.sum(-1, keepdim=True).repeat_interleave(g, dim=0)
        static = self._static_forward(cache, attention_mask, g, next_pos, params)
        if isinstance(static, str):
            self.decode_loop_status = f"eager: {static}"
            return self._eager(cache, attention_mask, g, next_pos, logits, params, generator, stop)
        forward, fast = static
        capture = self.cuda_graphs and input_ids.device.type == "cuda" and self.graph_off is None
        loop = StaticDecodeLoop(
            forward,
            rows=logits.shape[0],
            params=params,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            device=input_ids.device,
            capture=capture,
            check_every=self.check_every,
            name=self.name,
        )
        try:
            result = loop.run(logits, generator, stop)
        finally:
            loop.release()
            if fast is not None:
                fast.release()
        if loop.capture_status.startswith("failed"):
            self.graph_off = loop.capture_status
        graph = capture and self.graph_off is None
        self.decode_loop_status = "static (CUDA graph)" if graph else "static"
        return result

    def _eager(
        self,
        cache: Any,
        attention_mask: torch.Tensor,
        g: int,
        next_pos: torch.Tensor,
        logits: torch.Tensor,
        params: SamplingParams,
        generator: Streams,
        stop: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The eager loop: one decode step, one draw and one host check per token."""
        model = self.model
        device = attention_mask.device
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        s = attention_mask.shape[1]
        total = s + params.max_new_tokens
        b = logits.shape[0]
        fast = self._fast_decoder(total)
        check = fast is not None and self.fast_decode_status == "unchecked"
        if fast is not None:
            steps = torch.arange(max(params.max_new_tokens - 1, 1), device=device)
            fast.start(cache, attention_mask, g, next_pos + steps, total)
            step_fn = fast.step
            if not check:
                cache = None  # the fast decoder holds its own copy
        else:
            step_fn = HFDecodeStepper(model, cache, attention_mask, g, total, next_pos).step
        done = torch.zeros(b, dtype=torch.bool, device=device)
        tokens: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        native = _native_sampling(device)
        blocks = len(generator.blocks) if isinstance(generator, StreamBlocks) else 1
        states = stream_states(generator, device) if blocks > 1 else []
        ends = [params.max_new_tokens] * blocks  # per block: steps until its rows finished
        try:
            for step in range(params.max_new_tokens):
                if native and logits.dtype == torch.float32:
                    u = draw_uniforms(b, generator, logits.device, torch.float32)
                    token, logp, all_done = sample_tokens(  # type: ignore[misc]
                        logits,
                        u,
                        done,
                        eos,
                        pad_id=self.pad_token_id,
                        temperature=params.temperature,
                        top_k=params.top_k,
                        top_p=params.top_p,
                    )
                    logps.append(logp)
                    tokens.append(token)
                else:
                    token = sample_next(logits, params, generator)
                    logps.append(token_logprobs(logits, token, temperature=params.temperature))
                    token = token.masked_fill(done, self.pad_token_id)
                    tokens.append(token)
                    done = done | torch.isin(token, eos)
                    all_done = step + 1 < params.max_new_tokens and bool(done.all())
                if stop is not None:
                    done |= stop(token) & ~done
                    all_done = step + 1 < params.max_new_tokens and bool(done.all())
                if blocks > 1:
                    for i, over in enumerate(done.view(blocks, -1).all(1).tolist()):
                        if over and ends[i] == params.max_new_tokens:
                            ends[i] = step + 1
                if step + 1 == params.max_new_tokens or all_done:
                    break
                logits = step_fn(token)
                if check:
                    check = False
                    hf = HFDecodeStepper(model, cache, attention_mask, g, total, next_pos)
                    cache = None
                    logits = self._check_fast_step(logits, hf, token)
                    if self.fast_decode_status != "on":  # continue on the model's own forward
                        step_fn = hf.step
                    del hf
        finally:
            if fast is not None:
                fast.release()
        n = len(tokens)
        if blocks > 1:  # each agent's streams as its own rows' loop would leave them
            rewind_blocks(generator, states, ends, n, b, device)
        else:
            ends = [n]
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1).float(), ends


@torch.no_grad()
def hf_generate(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    params: SamplingParams,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    stop: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample through ``model.generate`` (prompts repeated ``G`` times).

    ``stop`` (see :meth:`NativeSampler.sample`) runs as a stopping criterion on each
    step's last tokens; ``generate`` pads a row after it stops.

    Returns:
        completion ids ``[B, L]`` and behaviour log-probs ``[B, L]`` (float32) of the
        tempered full softmax, from the raw step logits ``generate`` returns; NaN (unmeasured:
        :class:`~comlrl.algos.rollout.agent.HFAgent` recomputes them with one forward pass)
        when it returns none (a replaced or custom ``generate``).
    """
    criteria = None
    if stop is not None:
        from transformers import StoppingCriteria, StoppingCriteriaList

        hook = stop

        class _Stop(StoppingCriteria):  # type: ignore[misc]
            def __call__(self, ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
                return hook(ids[:, -1])

        criteria = StoppingCriteriaList([_Stop()])
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=True,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else None,
        max_new_tokens=params.max_new_tokens,
        num_return_sequences=params.num_generations,
        eos_token_id=list(eos_token_ids),
        pad_token_id=pad_token_id,
        return_dict_in_generate=True,
        output_logits=True,
        stopping_criteria=criteria,
    )
    completion_ids = out.sequences[:, input_ids.shape[1] :]
    b, length = completion_ids.shape
    if not getattr(out, "logits", None):
        return completion_ids, torch.full((b, length), float("nan"), device=completion_ids.device)
    logits = torch.stack(out.logits, dim=1)  # [B, L, V], raw (pre-temperature)
    logp = token_logprobs(
        logits.reshape(b * length, -1), completion_ids.reshape(-1), temperature=params.temperature
    ).view(b, length)
    return completion_ids, logp


def _native_sampling(device: torch.device) -> bool:
    """Whether tokens on ``device`` are sampled by :func:`comlrl.kernels.sample_tokens`
    (CPU, and the C++ sampler built and not turned off by ``COMLRL_KERNELS_BACKEND=torch``);
    the caller also checks that the logits are float32."""
    if sample_tokens_unavailable is None or device.type != "cpu":
        return False
    return sample_tokens_unavailable() is None
