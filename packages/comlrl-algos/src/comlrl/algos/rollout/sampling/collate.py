"""From sampled token ids to :class:`~comlrl.algos.records.PolicyBatch` and completions.

Two ways in: the native sampler already holds padded tensors (:func:`policy_batch`), and
an agent of the user's own that only returns :class:`~comlrl.core.Completion` records is
collated from their token ids (:func:`collate_completions`).

Named axes: ``N`` prompts, ``G`` completions per prompt, ``B = N * G`` rows, ``S`` padded
prompt tokens, ``L`` completion tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from comlrl.algos.records import AgentSamples, PolicyBatch
from comlrl.core import Completion
from comlrl.estimators.losses import completion_mask as _completion_mask

__all__ = ["policy_batch", "pack_token_rows", "to_completions", "collate_completions"]


def policy_batch(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    logprobs: torch.Tensor,
    eos_token_ids: Sequence[int],
    group_size: int,
) -> PolicyBatch:
    """Assemble a :class:`PolicyBatch` from left-padded prompts and right-padded completions.

    Args:
        prompt_ids: ``[N, S]`` int64, left-padded.
        prompt_mask: ``[N, S]`` 0/1.
        completion_ids: ``[B, L]`` int64, ``B = N * G``, node-major.
        logprobs: ``[B, L]`` behaviour log-probs (garbage after EOS is zeroed).
        eos_token_ids: ids that end a completion (the first one is kept, the rest masked).
        group_size: ``G``.
    """
    g = group_size
    mask = _completion_mask(completion_ids, list(eos_token_ids))
    return PolicyBatch(
        input_ids=torch.cat([prompt_ids.repeat_interleave(g, dim=0), completion_ids], dim=1),
        attention_mask=torch.cat(
            [prompt_mask.long().repeat_interleave(g, dim=0), mask.long()], dim=1
        ),
        completion_mask=mask,
        behaviour_logprobs=logprobs.float().masked_fill(~mask, 0.0),
        group_size=g,
    )


def pack_token_rows(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    group_size: int,
    pad_token_id: int,
    device: torch.device | str = "cpu",
) -> PolicyBatch:
    """Pack token-id lists into a :class:`PolicyBatch`: ``N`` prompts left-padded, each
    shared by its ``G`` completions (rows ``n * G .. n * G + G - 1``), right-padded.

    Args:
        prompt_ids: ``N`` prompts' token ids.
        completion_ids: ``N * G`` completions' token ids, node-major.
        group_size: ``G``.
        pad_token_id: id written in the padding (masked out).
        device: where the tensors go.

    Returns:
        ``input_ids [N * G, S + L]`` int64 (``L >= 1``), ``attention_mask`` 0/1,
        ``completion_mask [N * G, L]`` bool over each completion's own tokens, and zero
        ``behaviour_logprobs`` (offline tokens have none).

    Raises:
        ValueError: ``len(completion_ids) != N * G``.
    """
    n, g = len(prompt_ids), group_size
    if len(completion_ids) != n * g:
        raise ValueError(f"{len(completion_ids)} completions for {n} prompts x group_size={g}")
    from torch.nn.utils.rnn import pad_sequence

    def rows(seqs: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        return [torch.as_tensor(list(x), dtype=torch.int64) for x in seqs]

    prompts, comps = rows(prompt_ids), rows(completion_ids)
    # left padding: right-pad the reversed prompts, then reverse the columns back
    left = pad_sequence([p.flip(0) for p in prompts], batch_first=True, padding_value=pad_token_id)
    left = left.flip(1)
    right = pad_sequence(comps, batch_first=True, padding_value=pad_token_id)
    if right.shape[1] == 0:  # every completion empty: keep one (masked) column
        right = torch.full((n * g, 1), int(pad_token_id), dtype=torch.int64)
    s, length = left.shape[1], right.shape[1]
    p_len = torch.tensor([len(p) for p in prompts])
    c_len = torch.tensor([len(c) for c in comps])
    p_mask = torch.arange(s)[None, :] >= (s - p_len)[:, None]
    c_mask = torch.arange(length)[None, :] < c_len[:, None]
    batch = PolicyBatch(
        input_ids=torch.cat([left.repeat_interleave(g, dim=0), right], dim=1),
        attention_mask=torch.cat([p_mask.long().repeat_interleave(g, dim=0), c_mask.long()], 1),
        completion_mask=c_mask,
        behaviour_logprobs=torch.zeros(c_mask.shape, dtype=torch.float32),
        group_size=g,
    )
    return batch.to(device)


def to_completions(
    batch: PolicyBatch, tokenizer: Any, eos_token_ids: Sequence[int]
) -> list[list[Completion]]:
    """Decode a :class:`PolicyBatch` into ``N`` lists of ``G`` completions (CPU tensors)."""
    mask = batch.completion_mask
    b, length = mask.shape
    g = batch.group_size
    lengths = mask.sum(dim=1).tolist()
    ids_cpu = batch.input_ids[:, -length:].cpu() if length else batch.input_ids[:, :0].cpu()
    logp_cpu = batch.behaviour_logprobs.cpu()
    texts = tokenizer.batch_decode(
        [ids_cpu[i, : lengths[i]] for i in range(b)], skip_special_tokens=True
    )
    last = ids_cpu.gather(1, (torch.tensor(lengths) - 1).clamp(min=0)[:, None]).squeeze(1)
    ended = torch.isin(last, torch.tensor(list(eos_token_ids))) & (torch.tensor(lengths) > 0)
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
    return [flat[n * g : (n + 1) * g] for n in range(b // g)]


def collate_completions(
    prompts: Sequence[str],
    completions: Sequence[Sequence[Completion]],
    tokenizer: Any,
    *,
    pad_token_id: int,
    device: torch.device | str = "cpu",
) -> AgentSamples:
    """Build :class:`AgentSamples` from an agent's ``generate`` output.

    The prompts are tokenized again (left-padded); each completion's ``token_ids`` are
    right-padded with ``pad_token_id``. Behaviour log-probs come from
    ``Completion.logprobs``; a completion without them gets NaN there, and the update
    then needs ``clip_ratio=None`` (on-policy, the ratio is not used).

    Raises:
        ValueError: groups of unequal size, a completion without ``token_ids``, or a
            prompt count that differs from the number of groups.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} groups of completions")
    sizes = {len(group) for group in completions}
    if len(sizes) != 1:
        raise ValueError(
            f"every prompt needs the same number G of completions, got sizes {sorted(sizes)}"
        )
    g = sizes.pop()
    flat = [c for group in completions for c in group]
    for i, c in enumerate(flat):
        if c.token_ids is None:
            raise ValueError(
                f"completion {i} ({c.text[:60]!r}) has no token_ids; an agent trained by "
                "CoMLRL must return the sampled token ids (and ideally their log-probs)"
            )
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True)
    length = max(1, max(c.num_tokens for c in flat))
    ids = torch.full((len(flat), length), int(pad_token_id), dtype=torch.int64)
    logp = torch.zeros(len(flat), length, dtype=torch.float32)
    for i, c in enumerate(flat):
        n = c.num_tokens
        ids[i, :n] = torch.as_tensor(c.token_ids, dtype=torch.int64)
        logp[i, :n] = (
            torch.as_tensor(c.logprobs, dtype=torch.float32)
            if c.logprobs is not None
            else float("nan")
        )
    lengths = torch.tensor([c.num_tokens for c in flat])
    mask = torch.arange(length)[None, :] < lengths[:, None]  # each completion's own tokens
    batch = PolicyBatch(
        input_ids=torch.cat([enc["input_ids"].repeat_interleave(g, dim=0), ids], dim=1),
        attention_mask=torch.cat(
            [enc["attention_mask"].long().repeat_interleave(g, dim=0), mask.long()], dim=1
        ),
        completion_mask=mask,
        behaviour_logprobs=logp.masked_fill(~mask, 0.0),
        group_size=g,
    ).to(device)
    return AgentSamples(tuple(prompts), tuple(tuple(grp) for grp in completions), batch)
