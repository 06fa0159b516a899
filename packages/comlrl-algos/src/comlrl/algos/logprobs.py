"""Current-policy log-probs of sampled completions, with the autograd graph.

Logits are computed only at the ``L`` positions that predict completion tokens (never over
the prompt) and reduced to log-probs by :func:`comlrl.kernels.token_logprobs`, which never
materialises an fp32 ``[N, V]`` copy.

Named axes: ``b`` rows of the micro-batch, ``G`` completions per prompt, ``S`` padded
prompt tokens, ``L`` completion tokens, ``V`` vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from comlrl.algos.records import PolicyBatch
from comlrl.kernels import token_logprobs

__all__ = ["completion_logprobs", "prompt_chunks"]


def completion_logprobs(
    model: Any,
    batch: PolicyBatch,
    prompts: slice,
    *,
    temperature: float = 1.0,
    shared_prefix: bool = True,
) -> torch.Tensor:
    """Log-probs ``[b, L]`` (float32, nats) of the completions of prompts ``prompts``.

    With ``shared_prefix`` each prompt runs through the model once and its KV cache (with
    its autograd graph) is repeated for its ``G`` completions, so prompt work is not
    repeated ``G`` times; the result and its gradient equal the plain per-sequence forward
    (tested to 1e-5). Without it, every row runs prompt and completion in one forward.

    Args:
        model: a ``transformers`` causal LM (``logits_to_keep`` and ``past_key_values``).
        batch: the agent's :class:`PolicyBatch`.
        prompts: which prompts (groups), as a slice over ``[0, N)``.
        temperature: the sampling temperature; log-probs are those of
            ``log_softmax(logits / temperature)``.
        shared_prefix: see above.
    """
    g = batch.group_size
    rows = slice(prompts.start * g, prompts.stop * g)
    ids, mask = batch.input_ids[rows], batch.attention_mask[rows]
    length = batch.completion_mask.shape[1]
    s = ids.shape[1] - length
    if not shared_prefix:
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = torch.arange(s - 1, s - 1 + length, device=ids.device)
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids,
            logits_to_keep=keep, use_cache=False,
        ).logits  # [b, L, V]
    else:
        prompt_ids, prompt_mask = ids[::g, :s], mask[::g, :s]
        out = model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )
        first = out.logits[:, -1:].repeat_interleave(g, dim=0)  # [b, 1, V]
        if length == 1:
            logits = first
        else:
            cache = out.past_key_values
            cache.batch_repeat_interleave(g)
            start = prompt_mask.sum(-1, keepdim=True).repeat_interleave(g, dim=0)
            rest = model(
                input_ids=ids[:, s : s + length - 1],
                attention_mask=mask[:, : s + length - 1],
                position_ids=start + torch.arange(length - 1, device=ids.device),
                past_key_values=cache,
                use_cache=True,
            ).logits  # [b, L - 1, V]
            logits = torch.cat([first, rest], dim=1)
    b = logits.shape[0]
    return token_logprobs(
        logits.reshape(b * length, -1), ids[:, s:].reshape(-1), temperature=temperature
    ).view(b, length)


def prompt_chunks(batch: PolicyBatch, micro_batch_size: int | None) -> list[slice]:
    """Micro-batches as slices of prompts: whole groups, so each prefix is computed once.

    ``micro_batch_size`` counts sequences and is rounded down to whole groups of ``G``
    (at least one group); ``None`` puts the whole batch in one chunk.
    """
    b = batch.completion_mask.shape[0]
    n = b // batch.group_size
    per = max(1, (micro_batch_size or b) // batch.group_size)
    return [slice(i, min(i + per, n)) for i in range(0, n, per)]
