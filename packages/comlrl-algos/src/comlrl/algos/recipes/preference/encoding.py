"""Preference and SFT rows as tensors: tokenizing prompts and completions into a
:class:`~comlrl.algos.records.PolicyBatch` and their sequence log-probs (through the shared
:func:`comlrl.algos.models.logprobs.completion_logprobs`), plus the small steps every
preference loop shares (row checks, one clipped optimizer step).

Named axes: ``N`` prompts, ``G`` completions per prompt, ``B`` sequences, ``S`` padded prompt
tokens, ``L`` completion tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from comlrl.algos.models.logprobs import completion_logprobs
from comlrl.algos.recipes.preference.config import PreferenceTrainConfig
from comlrl.algos.records import PolicyBatch
from comlrl.algos.rollout.sampling.collate import pack_token_rows
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.update.agents import build_optimizer, resolve_device

__all__ = [
    "check_rows",
    "clipped_optimizer_step",
    "encode_completions",
    "model_device",
    "prepare_training",
    "sequence_logprobs",
]


def encode_completions(
    tokenizer: Any,
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    group_size: int = 1,
    add_eos: bool = True,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    device: torch.device | str = "cpu",
) -> PolicyBatch:
    """Tokenize ``N`` prompts and their ``N * G`` completions into a :class:`PolicyBatch`.

    Prompts are tokenized as the tokenizer does by default (BOS included where it adds
    one) and left-padded; completions without special tokens, followed by EOS when
    ``add_eos``, right-padded. Rows ``n * G .. n * G + G - 1`` are prompt ``n``'s
    completions (for DPO, ``G = 2``: chosen then rejected). ``behaviour_logprobs`` are
    zero (offline data has none).

    Returns:
        A :class:`PolicyBatch` with ``input_ids [N * G, S + L]`` int64 and
        ``completion_mask [N * G, L]`` bool on ``device``.

    Raises:
        ValueError: ``len(completions) != N * G``, a completion that tokenizes to nothing
            (with ``add_eos=False``), or a tokenizer without pad and EOS tokens.
    """
    n, g = len(prompts), group_size
    if len(completions) != n * g:
        raise ValueError(f"{len(completions)} completions for {n} prompts x group_size={g}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None or (add_eos and tokenizer.eos_token_id is None):
        raise ValueError("the tokenizer needs a pad or EOS token id; set tokenizer.pad_token")
    prompt_ids = [list(ids) for ids in tokenizer(list(prompts))["input_ids"]]
    if max_prompt_length is not None:
        prompt_ids = [ids[-max_prompt_length:] for ids in prompt_ids]
    comp_ids = [
        list(ids) for ids in tokenizer(list(completions), add_special_tokens=False)["input_ids"]
    ]
    if add_eos:
        comp_ids = [ids + [int(tokenizer.eos_token_id)] for ids in comp_ids]
    if max_completion_length is not None:
        comp_ids = [ids[:max_completion_length] for ids in comp_ids]
    for i, ids in enumerate(comp_ids):
        if not ids:
            raise ValueError(
                f"completion #{i} ({completions[i]!r}) has no tokens; use add_eos=True or drop it"
            )
    return pack_token_rows(prompt_ids, comp_ids, group_size=g, pad_token_id=int(pad), device=device)


def sequence_logprobs(
    model: Any, batch: PolicyBatch, prompts: slice | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and sequence log-probs (nats, float32) of the completions of ``batch``.

    Through :func:`comlrl.algos.models.logprobs.completion_logprobs` (temperature 1, each prompt
    computed once for its ``G`` completions). Gradients flow when grad mode is on.

    Args:
        model: a ``transformers`` causal LM.
        batch: the :class:`PolicyBatch`.
        prompts: which prompts (a slice over ``[0, N)``); ``None``: all.

    Returns:
        ``(sequence [b], tokens [b, L])``: per-row sums over the completion mask, and the
        per-token log-probs with 0 on masked positions.
    """
    prompts = prompts if prompts is not None else slice(0, batch.num_prompts)
    g = batch.group_size
    mask = batch.completion_mask[prompts.start * g : prompts.stop * g]
    tokens = completion_logprobs(model, batch, prompts).masked_fill(~mask, 0.0)
    return tokens.sum(dim=1), tokens


def check_rows(
    dataset: Sequence[Mapping[str, Any]], keys: tuple[str, ...], what: str
) -> list[Mapping[str, Any]]:
    """The rows of ``dataset`` as a list, each checked to hold a string under every key.

    Args:
        dataset: rows (a ``datasets.Dataset`` or a list of dicts).
        keys: the string fields every row needs, e.g. ``("prompt", "completion")``.
        what: the dataset's name in error messages (``"SFT"``, ``"DPO evaluation"``).

    Raises:
        ConfigError: an empty dataset, or a row whose field is missing or not a string
            (naming the row, what it has and what it needs).
    """
    rows = list(dataset)
    if not rows:
        raise ConfigError(f"the {what} dataset is empty; give rows with keys {keys}.")
    for i, row in enumerate(rows):
        missing = [k for k in keys if not isinstance(row.get(k), str)]
        if missing:
            raise ConfigError(
                f"{what} row #{i} lacks string field(s) {missing} (has {sorted(row)}); every row "
                f"needs {keys}."
            )
    return rows


def model_device(model: Any) -> torch.device:
    """The device of ``model``'s first parameter (where its inputs must go)."""
    return next(model.parameters()).device


def clipped_optimizer_step(
    model: Any, optimizer: torch.optim.Optimizer, max_grad_norm: float | None
) -> float:
    """One optimizer step after clipping the gradient's global L2 norm to ``max_grad_norm``
    (``None``: no clipping); returns the norm before clipping (measured either way)."""
    limit = float("inf") if max_grad_norm is None else max_grad_norm
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), limit))
    optimizer.step()
    return norm


def prepare_training(model: Any, config: PreferenceTrainConfig) -> torch.optim.Optimizer:
    """Seed torch with ``config.seed``, move ``model`` to ``config.device`` in train mode, and
    return the optimizer (``config.optimizer``, ``learning_rate``, ``weight_decay``) over its
    trainable parameters."""
    torch.manual_seed(config.seed)
    model.to(resolve_device(config.device))
    model.train()
    return build_optimizer(
        [p for p in model.parameters() if p.requires_grad],
        config.optimizer,
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
    )
