"""A Hugging Face causal LM as a CoMLRL agent: a thin front over :mod:`comlrl.algos.sampling`.

:class:`HFAgent` follows the :class:`comlrl.core.Agent` protocol (``generate``) and adds
what training needs: :meth:`HFAgent.sample` returns the completions together with their
padded tensors (:class:`~comlrl.algos.records.AgentSamples`), and ``model`` /
``tokenizer`` are the policy the update differentiates. Nothing is kept between calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from comlrl.algos.records import AgentSamples
from comlrl.algos.sampling.collate import policy_batch, to_completions
from comlrl.algos.sampling.native import NativeSampler, decode_threads, hf_generate
from comlrl.core import Completion, SamplingParams

__all__ = ["HFAgent"]


class HFAgent:
    """One agent backed by a ``transformers`` causal LM and its tokenizer.

    Args:
        model: a ``PreTrainedModel`` with a causal LM head.
        tokenizer: its tokenizer; padding side is forced to ``"left"``.
        name: agent name used in logs and checkpoint folders.
        eos_token_ids: token ids that end a completion; defaults to the model's
            generation config EOS ids, else the tokenizer's EOS id.
        backend: ``"native"`` (default) runs CoMLRL's sampling loop
            (:class:`~comlrl.algos.sampling.native.NativeSampler`: one prefill per prompt,
            its KV cache shared by its ``G`` completions, one model call per token);
            ``"hf"`` calls ``model.generate`` (prompts repeated ``G`` times), for models
            with exotic caches or generation code.
        fast_decode: with the native backend, decode Llama-family models (Llama, Qwen2,
            Mistral) through :class:`~comlrl.algos.sampling.decode.FastDecoder` (checked
            once against the model's forward; :attr:`fast_decode_status` says whether it
            is on and why not).

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
        self.generator: torch.Generator | None = None
        self.sampler = NativeSampler(
            model,
            pad_token_id=int(tokenizer.pad_token_id),
            eos_token_ids=self.eos_token_ids,
            fast_decode=fast_decode,
            name=name,
        )

    @property
    def fast_decode_status(self) -> str:
        """``"unchecked"``, ``"on"``, or ``"off: <why>"`` (see ``fast_decode``)."""
        return self.sampler.fast_decode_status

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
    def sample(
        self, prompts: Sequence[str], params: SamplingParams, keys: Sequence[int] | None = None
    ) -> AgentSamples:
        """Sample ``G`` completions for each of ``N`` prompts in one batched call.

        ``keys`` (``N`` seeds, native backend only): draw prompt ``n``'s completions from
        a stream seeded by ``keys[n]`` instead of the agent's stream, so they do not
        depend on the other prompts of the call (up to float round-off of the logits
        from the batch's padding).

        Raises:
            ValueError: ``keys`` with the ``"hf"`` backend or not one per prompt.

        Returns:
            :class:`~comlrl.algos.records.AgentSamples`: the ``N x G`` completions (text,
            token ids, behaviour log-probs) and their padded
            :class:`~comlrl.algos.records.PolicyBatch` on the model's device.
        """
        generator: torch.Generator | list[torch.Generator] | None = self.generator
        if keys is not None:
            if self.backend != "native":
                raise ValueError(
                    f"agent {self.name!r}: prompt-keyed sampling (sampling_rng='prompt') needs "
                    "backend='native'; model.generate draws from one stream."
                )
            if len(keys) != len(prompts):
                raise ValueError(f"agent {self.name!r}: {len(keys)} keys for {len(prompts)} prompts")
            generator = [torch.Generator(device=self.device).manual_seed(int(k)) for k in keys]
        enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        input_ids = enc["input_ids"].to(self.device)
        attention_mask = enc["attention_mask"].to(self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            if self.backend == "native":
                with decode_threads(self.model, self.device):
                    ids, logp = self.sampler.sample(input_ids, attention_mask, params, generator)
            else:
                ids, logp = hf_generate(
                    self.model, input_ids, attention_mask, params,
                    eos_token_ids=self.eos_token_ids, pad_token_id=int(self.tokenizer.pad_token_id),
                )
        finally:
            self.model.train(was_training)
        batch = policy_batch(
            input_ids, attention_mask, ids, logp, self.eos_token_ids, params.num_generations
        )
        groups = to_completions(batch, self.tokenizer, self.eos_token_ids)
        return AgentSamples(tuple(prompts), tuple(tuple(g) for g in groups), batch)

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[list[Completion]]:
        """The :class:`comlrl.core.Agent` call: ``N`` lists of ``G`` completions."""
        return [list(group) for group in self.sample(prompts, params).completions]
