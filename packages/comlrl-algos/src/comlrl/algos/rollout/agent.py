"""A Hugging Face causal LM as a CoMLRL agent: a thin front over :mod:`comlrl.algos.rollout.sampling`.

:class:`HFAgent` follows the :class:`comlrl.core.Agent` protocol (``generate``) and adds
what training needs: :meth:`HFAgent.sample` returns the completions together with their
padded tensors (:class:`~comlrl.algos.records.AgentSamples`), and ``model`` /
``tokenizer`` are the policy the update differentiates. Nothing is kept between calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from comlrl.algos.models.chat_template import render_prompts, resolve_prompt_format
from comlrl.algos.records import AgentSamples
from comlrl.algos.rollout.sampling.backends import (
    GENERATION_BACKENDS,
    GenerationBackend,
    NativeBackend,
    recompute_behaviour_logprobs,
)
from comlrl.algos.rollout.sampling.collate import policy_batch, to_completions
from comlrl.algos.rollout.sampling.native import NativeSampler
from comlrl.core import Completion, SamplingParams
from comlrl.core.prompts import Prompt

__all__ = ["HFAgent", "as_agents"]


class HFAgent:
    """One agent backed by a ``transformers`` causal LM and its tokenizer.

    Args:
        model: a ``PreTrainedModel`` with a causal LM head.
        tokenizer: its tokenizer; padding side is forced to ``"left"``.
        name: agent name used in logs and checkpoint folders.
        eos_token_ids: token ids that end a completion; defaults to the model's
            generation config EOS ids, else the tokenizer's EOS id.
        backend: the generation backend (:mod:`comlrl.algos.rollout.sampling.backends`):
            ``"native"`` (default) runs CoMLRL's sampling loop
            (:class:`~comlrl.algos.rollout.sampling.native.NativeSampler`: one prefill per prompt,
            its KV cache shared by its ``G`` completions, one model call per token);
            ``"hf"`` calls ``model.generate`` (prompts repeated ``G`` times), for models
            with exotic caches or generation code; ``"vllm"`` samples with a colocated
            vLLM engine (:class:`~comlrl.algos.rollout.sampling.vllm_backend.VLLMBackend`, extra
            ``comlrl-algos[vllm]``, CUDA only) that gets the weights after each update.
            A :class:`~comlrl.algos.rollout.sampling.backends.GenerationBackend` object is used
            as given.
        fast_decode: with the native backend, decode Llama-family models (Llama, Qwen2,
            Mistral) through :class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder` (checked
            once against the model's forward; :attr:`fast_decode_status` says whether it
            is on and why not).
        cuda_graphs: with fast decoding on a CUDA device, replay each decode step as a
            CUDA graph (see :class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder`); set
            False to launch its kernels one by one (e.g. to profile them).
        prompt_format: how prompts reach the model (:mod:`comlrl.algos.models.chat_template`):
            ``"chat"`` applies the tokenizer's chat template to the prompt's messages,
            ``"raw"`` feeds its text, ``"auto"`` (default) is ``"chat"`` when the tokenizer
            has a chat template. :attr:`prompt_format` holds the resolved choice.
        vllm_options: keyword arguments of
            :class:`~comlrl.algos.rollout.sampling.vllm_backend.VLLMBackend`
            (``gpu_memory_utilization``, ``behaviour_logprobs``, ``engine_kwargs``, ...)
            for ``backend="vllm"``.

    Raises:
        ValueError: no pad/EOS token, an unknown ``backend``, or ``vllm_options`` with
            another backend.
        ValueError: ``prompt_format="chat"`` with a tokenizer that has no chat template.
        RuntimeError: ``backend="vllm"`` without vLLM or without a CUDA GPU.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        name: str = "agent",
        eos_token_ids: Sequence[int] | None = None,
        backend: str | GenerationBackend = "native",
        fast_decode: bool = True,
        vllm_options: dict[str, Any] | None = None,
        cuda_graphs: bool = True,
        prompt_format: str = "auto",
    ) -> None:
        if isinstance(backend, str) and backend not in GENERATION_BACKENDS:
            raise ValueError(
                f"agent {name!r}: unknown generation backend {backend!r}; use one of "
                f"{', '.join(repr(b) for b in GENERATION_BACKENDS)}."
            )
        if vllm_options and backend != "vllm":
            raise ValueError(
                f"agent {name!r}: vllm_options were given but backend={backend!r}; "
                "set backend='vllm' or drop vllm_options."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        #: ``"chat"`` or ``"raw"``: the resolved ``prompt_format``.
        self.prompt_format = resolve_prompt_format(tokenizer, prompt_format, name=f"agent {name!r}")
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
        self._fast_decode = fast_decode
        self._cuda_graphs = cuda_graphs
        pad = int(tokenizer.pad_token_id)
        if not isinstance(backend, str):
            self.generation_backend: GenerationBackend = backend
        elif backend == "vllm":
            from comlrl.algos.rollout.sampling.vllm_backend import VLLMBackend

            self.generation_backend = VLLMBackend(
                model,
                pad_token_id=pad,
                eos_token_ids=self.eos_token_ids,
                name=name,
                **(vllm_options or {}),
            )
        else:
            self.generation_backend = NativeBackend(
                model,
                pad_token_id=pad,
                eos_token_ids=self.eos_token_ids,
                mode=backend,
                fast_decode=fast_decode,
                cuda_graphs=cuda_graphs,
                name=name,
            )
        #: the backend's name: ``"native"``, ``"hf"`` or ``"vllm"``.
        self.backend = self.generation_backend.name

    def replace_model(self, model: Any) -> None:
        """Make ``model`` this agent's policy (e.g. a :class:`~comlrl.algos.models.lora_policy.LoraPolicy`
        over the old one) and rebuild the native generation backend around it; the old
        model is no longer referenced by the agent.

        Raises:
            ValueError: the agent uses the vLLM backend or a backend object given by the
                caller (they hold the old weights; build a new agent instead).
        """
        gb = self.generation_backend
        if not isinstance(gb, NativeBackend):
            raise ValueError(
                f"agent {self.name!r}: cannot replace the model of a {self.backend!r} generation "
                "backend; build a new HFAgent around the new model."
            )
        self.model = model
        self.generation_backend = NativeBackend(
            model,
            pad_token_id=int(self.tokenizer.pad_token_id),
            eos_token_ids=self.eos_token_ids,
            mode=gb.name,
            fast_decode=self._fast_decode,
            cuda_graphs=self._cuda_graphs,
            name=self.name,
        )

    @property
    def sampler(self) -> NativeSampler | None:
        """The native sampling loop (``None`` with another backend)."""
        gb = self.generation_backend
        return gb.sampler if isinstance(gb, NativeBackend) else None

    @property
    def fast_decode_status(self) -> str:
        """``"unchecked"``, ``"on"``, or ``"off: <why>"`` (see ``fast_decode``)."""
        sampler = self.sampler
        return (
            sampler.fast_decode_status if sampler is not None else f"off: backend={self.backend!r}"
        )

    def after_update(self) -> None:
        """Tell the generation backend the weights changed (after an optimizer step).

        The vLLM backend then pushes them before its next sample; it also notices
        in-place parameter updates on its own, so calling this is only needed after
        writes through ``param.data``. A no-op for the native backends.
        """
        self.generation_backend.after_update()

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
    def render(self, prompts: Sequence[Prompt]) -> list[str]:
        """The model-input text of each prompt (chat template or plain text, per
        :attr:`prompt_format`)."""
        return render_prompts(self.tokenizer, prompts, self.prompt_format)

    def sample(
        self, prompts: Sequence[Prompt], params: SamplingParams, keys: Sequence[int] | None = None
    ) -> AgentSamples:
        """Sample ``G`` completions for each of ``N`` prompts in one batched call.

        Prompts are rendered by :meth:`render`; the returned samples hold the rendered
        texts (what the model saw).

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
        generator = self.streams(len(prompts), keys)
        texts, input_ids, attention_mask = self.encode(prompts)
        ids, logp = self.generation_backend.sample(input_ids, attention_mask, params, generator)
        return self.collect(texts, input_ids, attention_mask, ids, logp, params)

    def streams(
        self, num_prompts: int, keys: Sequence[int] | None = None
    ) -> torch.Generator | list[torch.Generator] | None:
        """The random streams of a call over ``num_prompts`` prompts: the agent's own
        (:meth:`seed`), or with ``keys`` one stream per prompt seeded by its key.

        Raises:
            ValueError: ``keys`` with a backend other than ``"native"``, or not one per
                prompt.
        """
        if keys is None:
            return self.generator
        if self.backend != "native":
            raise ValueError(
                f"agent {self.name!r}: prompt-keyed sampling (sampling_rng='prompt') needs "
                "backend='native'; model.generate and vLLM draw from one stream."
            )
        if len(keys) != num_prompts:
            raise ValueError(f"agent {self.name!r}: {len(keys)} keys for {num_prompts} prompts")
        return [torch.Generator(device=self.device).manual_seed(int(k)) for k in keys]

    def encode(self, prompts: Sequence[Prompt]) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        """The rendered texts (:meth:`render`) and their left-padded ``[N, S]`` token ids
        and attention mask on the model's device."""
        texts = self.render(prompts)
        # A chat template writes its own special tokens (BOS, role markers) into the text.
        enc = self.tokenizer(
            texts,
            return_tensors="pt",
            padding=True,
            add_special_tokens=self.prompt_format != "chat",
        )
        return texts, enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    def collect(
        self,
        texts: Sequence[str],
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        ids: torch.Tensor,
        logp: torch.Tensor,
        params: SamplingParams,
    ) -> AgentSamples:
        """The samples of a call: its prompts (:meth:`encode`) and the backend's
        completion ids ``[B, L]`` and behaviour log-probs ``[B, L]`` (recomputed with the
        training model where the backend asks for it or left them unmeasured)."""
        batch = policy_batch(
            input_ids, attention_mask, ids, logp, self.eos_token_ids, params.num_generations
        )
        valid = batch.completion_mask
        unmeasured = bool(torch.isnan(batch.behaviour_logprobs[valid]).any())
        if self.generation_backend.recompute_logprobs or unmeasured:
            batch = dataclasses.replace(
                batch,
                behaviour_logprobs=recompute_behaviour_logprobs(
                    self.model, batch, params.temperature
                ),
            )
        groups = to_completions(batch, self.tokenizer, self.eos_token_ids)
        return AgentSamples(tuple(texts), tuple(tuple(g) for g in groups), batch)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """The :class:`comlrl.core.Agent` call: ``N`` lists of ``G`` completions."""
        return [list(group) for group in self.sample(prompts, params).completions]


def as_agents(agents: Sequence[Any], **options: Any) -> list[Any]:
    """``(model, tokenizer)`` pairs as :class:`HFAgent` s named ``agent_<i>`` (``options``:
    ``HFAgent``'s keyword arguments, e.g. ``prompt_format``); agent objects as they are."""
    return [
        a if not isinstance(a, tuple) else HFAgent(a[0], a[1], name=f"agent_{i}", **options)
        for i, a in enumerate(agents)
    ]
