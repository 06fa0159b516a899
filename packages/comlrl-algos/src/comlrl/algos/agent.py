"""A Hugging Face causal LM as a CoMLRL agent (batched sampling with behaviour log-probs)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from comlrl.algos.decode import FastDecoder
from comlrl.algos.losses import completion_mask as _completion_mask
from comlrl.core import Completion, SamplingParams
from comlrl.kernels import token_logprobs
from transformers.cache_utils import DynamicLayer

__all__ = ["HFAgent", "GenerationBatch"]


@dataclass
class GenerationBatch:
    """The tensors behind one agent's ``P x G`` completions, ready for the update.

    Rows are prompt-major: row ``p * G + g`` is completion ``g`` of prompt ``p``.
    ``B = P * G`` sequences; ``S`` prompt tokens (left-padded); ``L`` completion tokens
    (right-padded).

    Attributes:
        input_ids: ``[B, S + L]`` int64, prompt (left-padded) followed by the completion.
        attention_mask: ``[B, S + L]`` int64, 1 on real prompt tokens and on completion
            tokens up to and including the first EOS, 0 elsewhere.
        completion_mask: ``[B, L]`` bool, the completion part of ``attention_mask``.
        behaviour_logprobs: ``[B, L]`` float32, log-probs of the sampled tokens under the
            tempered sampling policy (0 on masked positions).
        group_size: ``G``, completions per prompt (rows ``p * G`` to ``p * G + G - 1``
            share prompt ``p``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    group_size: int = 1

    @property
    def prompt_length(self) -> int:
        """``S``, the padded prompt length."""
        return self.input_ids.shape[1] - self.completion_mask.shape[1]


class HFAgent:
    """One agent backed by a ``transformers`` causal LM and its tokenizer.

    :meth:`generate` samples all ``P x G`` completions with one ``model.generate`` call
    (prompts repeated ``G`` times via ``num_return_sequences``) and records behaviour
    log-probs through :func:`comlrl.kernels.token_logprobs` from the step logits that
    ``generate`` returns (temperature applied, full softmax: top-p/top-k filters are not
    renormalised into these log-probs, matching what the training forward recomputes).

    Args:
        model: a ``PreTrainedModel`` with a causal LM head.
        tokenizer: its tokenizer; padding side is forced to ``"left"``.
        name: agent name used in logs and checkpoint folders.
        eos_token_ids: token ids that end a completion; defaults to the model's
            generation config EOS ids, else the tokenizer's EOS id.
        backend: ``"native"`` (default) runs CoMLRL's own sampling loop: each prompt is
            prefilled once and its KV cache shared by its ``G`` completions, one model call
            per new token, behaviour log-probs taken at each step; it needs a model whose
            cache supports ``batch_repeat_interleave`` (all ``transformers`` decoder-only
            LMs with ``DynamicCache``). ``"hf"`` calls ``model.generate`` instead (prompts
            repeated ``G`` times), for models with exotic caches or generation code.
        fast_decode: with the native backend, run the one-token decode steps of
            Llama-family models (Llama, Qwen2, Mistral) through
            :class:`comlrl.algos.decode.FastDecoder` instead of ``model(...)`` (same maths,
            a fraction of the per-call overhead). Unsupported models, and any model whose
            first fast step disagrees with its own forward (checked once per agent, see
            :data:`FAST_DECODE_RTOL`), use ``model(...)``; the reason is in
            :attr:`fast_decode_status`.

    Raises:
        ValueError: no pad/EOS token, or an unknown ``backend``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        name: str = "agent",
        eos_token_ids: Sequence[int] | None = None,
        backend: str = "native",
        fast_decode: bool = True,
    ) -> None:
        if backend not in ("native", "hf"):
            raise ValueError(f"agent {name!r}: unknown generation backend {backend!r}; use 'native' or 'hf'.")
        self.backend = backend
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(
                    f"agent {name!r}: the tokenizer has neither a pad nor an EOS token; set "
                    "tokenizer.pad_token before building the agent."
                )
            tokenizer.pad_token = tokenizer.eos_token
        if eos_token_ids is None:
            gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            if gen_eos is None:
                gen_eos = tokenizer.eos_token_id
            eos_token_ids = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        if not eos_token_ids:
            raise ValueError(f"agent {name!r}: no EOS token id; pass eos_token_ids explicitly.")
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.last_batch: GenerationBatch | None = None
        self.generator: torch.Generator | None = None
        self.fast_decode = bool(fast_decode)
        #: ``"unchecked"``, ``"on"`` (checked against the model's forward), or why it is off.
        self.fast_decode_status = "unchecked" if self.fast_decode else "off: fast_decode=False"

    def seed(self, seed: int) -> None:
        """Give this agent its own random stream for sampling (native backend).

        With a per-agent generator an agent's samples do not depend on what other agents
        drew before it, so agents can sample concurrently and runs stay reproducible.
        """
        self.generator = torch.Generator(device=self.device).manual_seed(int(seed))

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Completion]]:
        """Sample ``G`` completions for each of ``P`` prompts in one batched call.

        Returns:
            ``P`` lists of ``G`` completions. The padded tensors behind them are kept in
            :attr:`last_batch` (a :class:`GenerationBatch`) for the trainer's update.
        """
        g = params.num_generations
        enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        input_ids = enc["input_ids"].to(self.device)
        attention_mask = enc["attention_mask"].to(self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            if self.backend == "native":
                with _decode_threads(self.model, self.device):
                    completion_ids, logp = self._sample(input_ids, attention_mask, params)
            else:
                completion_ids, logp = self._hf_generate(input_ids, attention_mask, params)
        finally:
            self.model.train(was_training)
        sequences = torch.cat([input_ids.repeat_interleave(g, dim=0), completion_ids], dim=1)
        b, length = completion_ids.shape
        completion_mask = _completion_mask(completion_ids, self.eos_token_ids)
        logp = logp.masked_fill(~completion_mask, 0.0)
        prompt_mask = attention_mask.repeat_interleave(g, dim=0)
        self.last_batch = GenerationBatch(
            input_ids=sequences,
            attention_mask=torch.cat([prompt_mask, completion_mask.long()], dim=1),
            completion_mask=completion_mask,
            behaviour_logprobs=logp.float(),
            group_size=g,
        )
        lengths = completion_mask.sum(dim=1).tolist()
        ids_cpu = completion_ids.cpu()
        logp_cpu = logp.cpu()
        texts = self.tokenizer.batch_decode(
            [ids_cpu[i, : lengths[i]] for i in range(b)], skip_special_tokens=True
        )
        last = ids_cpu.gather(1, (torch.tensor(lengths) - 1).clamp(min=0)[:, None]).squeeze(1)
        ended = torch.isin(last, torch.tensor(self.eos_token_ids)) & (torch.tensor(lengths) > 0)
        finished = ended.tolist()
        flat = [
            Completion(
                text=texts[i],
                token_ids=ids_cpu[i, : lengths[i]],
                logprobs=logp_cpu[i, : lengths[i]],
                finished=finished[i],
            )
            for i in range(b)
        ]
        return [flat[p * g : (p + 1) * g] for p in range(len(prompts))]

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
        self, fast_logits: torch.Tensor, hf: _HFStepper, token: torch.Tensor
    ) -> torch.Tensor:
        """Compare the first fast decode step with the model's own forward (once per agent).

        Returns the logits to continue with: the fast ones when they agree, else the
        model's (and fast decoding is switched off for this agent, with a warning).
        """
        ref = hf.step(token)
        tol = FAST_DECODE_RTOL.get(ref.dtype, 3e-2) * (float(ref.abs().max()) + 1e-6)
        err = float((fast_logits.float() - ref.float()).abs().max())
        if err <= tol:
            self.fast_decode_status = "on"
            return fast_logits
        self.fast_decode_status = (
            f"off: first decode step differs from the model's forward by {err:.3g} (tolerance {tol:.3g})"
        )
        warnings.warn(
            f"agent {self.name!r}: fast decoding disagrees with {type(self.model).__name__}.forward "
            f"(max |logit difference| {err:.3g} > {tol:.3g}); using the model's own forward from now on.",
            RuntimeWarning,
            stacklevel=3,
        )
        return ref

    def _hf_generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``model.generate`` path: completion ids ``[B, L]`` and behaviour log-probs ``[B, L]``."""
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else None,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.num_generations,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        completion_ids = out.sequences[:, input_ids.shape[1] :]
        b, length = completion_ids.shape
        logits = torch.stack(out.logits, dim=1)  # [B, L, V], raw (pre-temperature)
        logp = token_logprobs(
            logits.reshape(b * length, -1), completion_ids.reshape(-1), temperature=params.temperature
        ).view(b, length)
        return completion_ids, logp

    def _sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Native sampling loop with a shared-prefix KV cache.

        The ``P`` prompts are prefilled once; the cache is then repeated ``G`` times so the
        ``B = P * G`` completions decode together, one model call per token. Rows that
        emitted EOS keep decoding padding (masked later) until all rows are done.

        Returns:
            completion ids ``[B, L]`` (int64, padded with the pad id after EOS) and
            behaviour log-probs ``[B, L]`` (fp32) of the tempered full softmax.
        """
        g = params.num_generations
        pad = int(self.tokenizer.pad_token_id)
        eos = torch.tensor(self.eos_token_ids, device=input_ids.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        s = input_ids.shape[1]
        total = s + params.max_new_tokens
        logits = out.logits[:, -1].repeat_interleave(g, dim=0)
        b = logits.shape[0]
        next_pos = attention_mask.sum(-1, keepdim=True).repeat_interleave(g, dim=0)
        fast = self._fast_decoder(total)
        check = fast is not None and self.fast_decode_status == "unchecked"
        if fast is not None:
            steps = torch.arange(max(params.max_new_tokens - 1, 1), device=input_ids.device)
            fast.start(cache, attention_mask, g, next_pos + steps, total)
            step_fn = fast.step
            if not check:
                cache = None  # the fast decoder holds its own copy
        else:
            step_fn = _HFStepper(self.model, cache, attention_mask, g, total, next_pos).step
        done = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
        tokens: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        try:
            for step in range(params.max_new_tokens):
                token = _sample_next(logits, params, self.generator)
                logps.append(token_logprobs(logits, token, temperature=params.temperature))
                token = token.masked_fill(done, pad)
                tokens.append(token)
                done = done | torch.isin(token, eos)
                if step + 1 == params.max_new_tokens or bool(done.all()):
                    break
                logits = step_fn(token)
                if check:
                    check = False
                    hf = _HFStepper(self.model, cache, attention_mask, g, total, next_pos)
                    cache = None
                    logits = self._check_fast_step(logits, hf, token)
                    if self.fast_decode_status != "on":  # continue on the model's own forward
                        step_fn = hf.step
                    del hf
        finally:
            if fast is not None:
                fast.release()
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1).float()


#: Relative tolerance (of the largest |logit|) for the once-per-agent check that the fast
#: decode step matches the model's own forward, per dtype. Float rounding differences are
#: ~1e-6 relative in float32; a real mismatch (wrong rotary or attention maths) is ~1e-1.
FAST_DECODE_RTOL = {torch.float32: 1e-3, torch.float64: 1e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}


class _HFStepper:
    """One-token decode steps through ``model(...)`` with a preallocated KV cache.

    Takes the prefill cache over ``P`` prompts, repeats it for the ``G`` rows of each
    prompt, and keeps the 4D boolean decode mask (one query per row: every real past
    token is visible) so the model does not rebuild it from a 2D mask every step.
    """

    def __init__(
        self, model: Any, cache: Any, prompt_mask: torch.Tensor, g: int, capacity: int, next_pos: torch.Tensor
    ) -> None:
        cache.batch_repeat_interleave(g)
        _preallocate_cache(cache, capacity)
        p, s = prompt_mask.shape
        self.model, self.cache = model, cache
        self.mask4d = torch.zeros(p * g, 1, 1, capacity, dtype=torch.bool, device=prompt_mask.device)
        self.mask4d[:, 0, 0, :s] = prompt_mask.bool().repeat_interleave(g, dim=0)
        self.pos, self.n = next_pos, s

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens [B]``; return the next logits ``[B, V]``."""
        self.mask4d[:, 0, 0, self.n] = True
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask4d[..., : self.n + 1],
            position_ids=self.pos,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.pos = self.pos + 1
        self.n += 1
        return out.logits[:, -1]


#: Below this many parameters a CPU decode step is a few hundred microseconds of small
#: ops, which intra-op threads slow down (measured: 0.17 s vs 0.20 s for 64 steps of 32
#: rows of the built-in model with 1 vs 2 threads); such models decode on one thread.
SMALL_MODEL_PARAMS = 20_000_000


@contextlib.contextmanager
def _decode_threads(model: Any, device: torch.device) -> Iterator[None]:
    """Run CPU decoding of small models on one intra-op thread, restoring the setting after."""
    before = torch.get_num_threads()
    small = sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS
    if device.type != "cpu" or before == 1 or not small:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _PreallocatedLayer(DynamicLayer):  # type: ignore[misc]
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


def _preallocate_cache(cache: Any, capacity: int) -> None:
    """Swap the plain full-attention layers of a ``DynamicCache`` for preallocated ones."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return
    for i, layer in enumerate(layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if type(layer) is DynamicLayer and keys is not None and values is not None and keys.numel():
            layers[i] = _PreallocatedLayer(keys, values, capacity)


def _sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Sample one token per row from ``logits [B, V]`` with temperature, top-k and top-p."""
    scores = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (keeps at least one)
        drop = (cum - sorted_scores.softmax(-1)) >= params.top_p
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(drop, float("-inf")))
    # Inverse-CDF sampling: one uniform per row and a binary search over the cumulative
    # probabilities (torch.multinomial draws V exponentials per row, ~10x slower on CPU).
    cdf = scores.softmax(-1).cumsum(-1)
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, dtype=cdf.dtype, generator=generator)
    u = u * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
