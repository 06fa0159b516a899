"""Generation backends: how an agent turns prompt token ids into sampled completions.

A backend takes ``P`` left-padded prompts and returns ``B = P * G`` right-padded
completion ids with their behaviour log-probs, node-major (row ``p * G + g`` is
completion ``g`` of prompt ``p``), the pad id after a row's first EOS. That is all
:class:`~comlrl.algos.rollout.agent.HFAgent` needs to build the
:class:`~comlrl.algos.records.PolicyBatch` (:func:`~comlrl.algos.rollout.sampling.collate.policy_batch`),
so the rollout and update code do not know which backend sampled.

- ``"native"``: :class:`~comlrl.algos.rollout.sampling.native.NativeSampler` (the default).
- ``"hf"``: ``model.generate`` (:func:`~comlrl.algos.rollout.sampling.native.hf_generate`).
- ``"vllm"``: a colocated vLLM engine per agent
  (:class:`~comlrl.algos.rollout.sampling.vllm_backend.VLLMBackend`, extra ``comlrl-algos[vllm]``).

Named axes: ``P`` prompts, ``G`` completions per prompt, ``B = P * G`` rows, ``S`` padded
prompt tokens, ``L`` completion tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from comlrl.algos.records import PolicyBatch
from comlrl.algos.rollout.sampling.native import NativeSampler, decode_threads, hf_generate
from comlrl.core import SamplingParams

__all__ = [
    "GENERATION_BACKENDS",
    "GenerationBackend",
    "NativeBackend",
    "parameter_versions",
    "recompute_behaviour_logprobs",
]

#: Backend names :class:`~comlrl.algos.rollout.agent.HFAgent` accepts.
GENERATION_BACKENDS = ("native", "hf", "vllm")


@runtime_checkable
class GenerationBackend(Protocol):
    """What :class:`~comlrl.algos.rollout.agent.HFAgent` calls to sample completions.

    Attributes:
        name: the backend's name (``"native"``, ``"hf"``, ``"vllm"``).
        recompute_logprobs: when True the agent replaces the returned log-probs by the
            training model's (:func:`recompute_behaviour_logprobs`).
    """

    name: str

    @property
    def recompute_logprobs(self) -> bool:
        """Replace the returned log-probs by the training model's."""
        ...

    def sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | list[torch.Generator] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``G`` completions for each of ``P`` left-padded prompts.

        Args:
            input_ids: ``[P, S]`` int64 prompt ids, left-padded.
            attention_mask: ``[P, S]`` 0/1, 0 on padding.
            params: sampling settings (``G = params.num_generations``).
            generator: the agent's random stream (``None``: the backend's default), or,
                native sampler only, one stream per prompt (prompt-keyed sampling).

        Returns:
            completion ids ``[B, L]`` int64 (pad id after a row's first EOS; ``L >= 1``)
            and behaviour log-probs ``[B, L]`` float32 (nats; any value after EOS): those
            of the full tempered softmax ``log_softmax(logits / T)`` at the sampled
            token, whatever top-p/top-k kept (the distribution the update computes), or
            NaN where the backend did not measure them; the agent then recomputes them
            with the training model.
        """
        ...

    def after_update(self) -> None:
        """The training model's weights changed (an optimizer step): bring the sampler
        up to date (a no-op for backends that sample from the training model itself)."""
        ...


class NativeBackend:
    """Sample from the training model itself: CoMLRL's loop or ``model.generate``.

    Args:
        model: the agent's ``transformers`` causal LM.
        pad_token_id: id written after a row's EOS.
        eos_token_ids: ids that end a completion.
        mode: ``"native"`` (:class:`NativeSampler`) or ``"hf"`` (``model.generate``).
        fast_decode: see :class:`NativeSampler`.
        cuda_graphs: see :class:`NativeSampler`.
        name: agent name, for warnings.

    Raises:
        ValueError: ``mode`` is neither ``"native"`` nor ``"hf"``.
    """

    recompute_logprobs = False
    #: :meth:`sample` takes a ``stop`` hook (see :meth:`NativeSampler.sample`).
    supports_stop = True

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        mode: str = "native",
        fast_decode: bool = True,
        cuda_graphs: bool = True,
        name: str = "agent",
    ) -> None:
        if mode not in ("native", "hf"):
            raise ValueError(
                f"agent {name!r}: NativeBackend mode must be 'native' or 'hf', got {mode!r}"
            )
        self.name = mode
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.sampler = NativeSampler(
            model,
            pad_token_id=self.pad_token_id,
            eos_token_ids=self.eos_token_ids,
            fast_decode=fast_decode,
            cuda_graphs=cuda_graphs,
            name=name,
        )

    @torch.no_grad()
    def sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | list[torch.Generator] | None = None,
        stop: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`GenerationBackend.sample`; the model runs in eval mode and is put
        back in the mode it was in. ``stop``: see :meth:`NativeSampler.sample` (with
        ``model.generate`` it becomes a stopping criterion)."""
        was_training = self.model.training
        self.model.eval()
        try:
            if self.name == "native":
                with decode_threads(self.model, input_ids.device):
                    return self.sampler.sample(input_ids, attention_mask, params, generator, stop)
            return hf_generate(
                self.model,
                input_ids,
                attention_mask,
                params,
                eos_token_ids=self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                stop=stop,
            )
        finally:
            self.model.train(was_training)

    def after_update(self) -> None:
        """Nothing to do: the sampler reads the training model's parameters."""


@torch.no_grad()
def recompute_behaviour_logprobs(
    model: Any, batch: PolicyBatch, temperature: float
) -> torch.Tensor:
    """The training model's log-probs of a batch's completions, as behaviour log-probs.

    Computes ``log_softmax(logits / T)`` at each sampled token (the native sampler's
    convention: the full tempered softmax, top-p/top-k not renormalised) with the model
    in eval mode, one prompt group at a time through
    :func:`comlrl.algos.models.logprobs.completion_logprobs`.

    Args:
        model: the agent's ``transformers`` causal LM.
        batch: the sampled :class:`PolicyBatch` (``B`` rows, ``L`` completion tokens).
        temperature: ``T`` the completions were sampled with.

    Returns:
        ``[B, L]`` float32 log-probs (nats), 0 on masked positions, on the batch's device.
    """
    from comlrl.algos.models.logprobs import completion_logprobs

    was_training = model.training
    model.eval()
    try:
        logp = completion_logprobs(
            model, batch, slice(0, batch.num_prompts), temperature=temperature, shared_prefix=True
        )
    finally:
        model.train(was_training)
    mask = batch.completion_mask
    return logp.float().to(mask.device).masked_fill(~mask, 0.0)


def parameter_versions(params: Iterable[torch.Tensor]) -> tuple[int, ...]:
    """A cheap fingerprint of parameter values: torch's in-place version counters.

    Every in-place write through the tensor itself (``optimizer.step()``,
    ``load_state_dict``, ``copy_`` under ``no_grad``) bumps the counter, so a changed
    fingerprint means the weights may have changed. Writes through ``param.data`` do
    not bump it; call the backend's ``after_update()`` after such writes.
    """
    return tuple(p._version for p in params)
