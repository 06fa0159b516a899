"""The trainer's log-probs of a policy batch as the update computes them: one micro-batch
(:func:`update_logprobs`), several micro-batches of adapters of one base stacked into one
forward (:func:`grouped_logprobs`), and a whole batch without gradient for ratios and
mismatch metrics (:func:`trainer_logprobs`).

Named axes: ``B`` sequences, ``L`` completion tokens, ``b`` the sequences of one micro-batch.
"""

from __future__ import annotations

from typing import Any

import torch
from comlrl.algos.models.devices import model_device
from comlrl.algos.models.logprobs import completion_logprobs, prompt_chunks, sampling_mode
from comlrl.algos.models.threads import small_model_threads
from comlrl.algos.records import PolicyBatch, stack_batches
from comlrl.algos.training.update.settings import UpdateSettings

__all__ = ["grouped_logprobs", "trainer_logprobs", "update_logprobs"]


def grouped_logprobs(
    model: Any, items: list[tuple[PolicyBatch, slice]], settings: UpdateSettings
) -> list[torch.Tensor]:
    """The log-probs ``[b_k, L_k]`` of each item's micro-batch (a batch and its prompts):
    one item alone, several stacked into one forward (``model`` then runs block ``k`` of
    the rows through item ``k``'s adapter; :class:`~comlrl.algos.models.lora_policy.AdapterBatch`)."""
    if len(items) == 1:
        batch, chunk = items[0]
        return [update_logprobs(model, batch, chunk, settings)]
    parts = [_prompt_rows(batch, chunk) for batch, chunk in items]
    stacked = stack_batches(parts)
    logp = update_logprobs(model, stacked, slice(0, stacked.num_prompts), settings)
    out, r = [], 0
    for part in parts:
        b, length = part.completion_mask.shape
        out.append(logp[r : r + b, :length])
        r += b
    return out


def _prompt_rows(batch: PolicyBatch, prompts: slice) -> PolicyBatch:
    """The rows of ``prompts`` (whole groups) as a batch of their own."""
    g = batch.group_size
    rows = slice(prompts.start * g, prompts.stop * g)
    return PolicyBatch(
        batch.input_ids[rows],
        batch.attention_mask[rows],
        batch.completion_mask[rows],
        batch.behaviour_logprobs[rows],
        g,
    )


def trainer_logprobs(model: Any, batch: PolicyBatch, settings: UpdateSettings) -> torch.Tensor:
    """The trainer's log-probs of ``batch``'s completions at ``settings.temperature``, as
    the update computes them (micro-batches of whole groups, eval mode), without
    gradient: ``[B, L]`` float32 on the model's device (meaningful under
    ``batch.completion_mask`` only)."""
    device = model_device(model)
    batch = batch.to(device)
    with torch.no_grad(), sampling_mode(model), small_model_threads(model):
        parts = [
            update_logprobs(model, batch, chunk, settings)
            for chunk in prompt_chunks(batch, settings.micro_batch_size)
        ]
    return torch.cat(parts).float()


def update_logprobs(
    model: Any, batch: PolicyBatch, chunk: slice, settings: UpdateSettings
) -> torch.Tensor:
    """The log-probs ``[b, L]`` of the completions of ``chunk``'s prompts (whole groups) at
    the update's temperature, with its shared-prefix and fused log-prob settings; with
    gradient when grad mode is on."""
    return completion_logprobs(
        model,
        batch,
        chunk,
        temperature=settings.temperature,
        shared_prefix=settings.shared_prefix,
        fused=settings.fused_logprobs,
    )
