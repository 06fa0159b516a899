"""SFT and DPO of one model on fixed rows, each a setup and one step under the loop driver.

- :func:`train_sft`: supervised fine-tuning on ``prompt``/``completion`` rows (token-mean
  NLL of the completion tokens only); evaluation is the held-out NLL.
- :func:`train_dpo`: DPO (Rafailov et al. 2023) on ``prompt``/``chosen``/``rejected`` rows
  against a frozen reference model; evaluation is the held-out chosen-vs-rejected margin
  and accuracy.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.models.logprobs import prompt_chunks, sampling_mode
from comlrl.algos.recipes.preference.config import DPOConfig, SFTConfig
from comlrl.algos.recipes.preference.encoding import (
    check_rows,
    clipped_optimizer_step,
    encode_completions,
    model_device,
    prepare_training,
    sequence_logprobs,
)
from comlrl.algos.recipes.preference.outputs import (
    loop_settings,
    read_step_checkpoint,
    save_models,
    write_step_checkpoint,
)
from comlrl.algos.records import PolicyBatch
from comlrl.algos.training.config import ConfigError
from comlrl.algos.training.data import DataStream
from comlrl.algos.training.loop import (
    RecipeLoop,
    StepResult,
    run_loop,
)
from comlrl.algos.training.reporting import Reporter
from comlrl.estimators.preference_losses import (
    dpo_loss,
    sft_nll,
)

__all__ = [
    "evaluate_sft",
    "train_sft",
    "evaluate_dpo",
    "train_dpo",
]


# --------------------------------------------------------------------------- SFT


def _sft_batch(
    tokenizer: Any, rows: Sequence[Mapping[str, Any]], config: SFTConfig, device: torch.device
) -> PolicyBatch:
    return encode_completions(
        tokenizer,
        [r["prompt"] for r in rows],
        [r["completion"] for r in rows],
        add_eos=config.add_eos,
        max_prompt_length=config.max_prompt_length,
        max_completion_length=config.max_completion_length,
        device=device,
    )


@torch.no_grad()
def evaluate_sft(
    model: Any, tokenizer: Any, dataset: Sequence[Mapping[str, Any]], config: SFTConfig
) -> dict[str, float]:
    """Held-out token-mean NLL (nats per completion token) over ``dataset``'s
    ``prompt``/``completion`` rows, in batches of ``config.batch_size``.

    Returns ``{"eval/nll": ..., "eval/num_tokens": ...}``. Raises ConfigError on bad rows.
    """
    rows = check_rows(dataset, ("prompt", "completion"), "SFT evaluation")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0.0
    try:
        for i in range(0, len(rows), config.batch_size):
            batch = _sft_batch(
                tokenizer, rows[i : i + config.batch_size], config, model_device(model)
            )
            _, tokens = sequence_logprobs(model, batch)
            total -= float(tokens.sum())
            count += float(batch.completion_mask.sum())
    finally:
        model.train(was_training)
    return {"eval/nll": total / count, "eval/num_tokens": count}


def train_sft(
    model: Any,
    tokenizer: Any,
    dataset: Sequence[Mapping[str, Any]],
    config: SFTConfig,
    eval_dataset: Sequence[Mapping[str, Any]] | None = None,
    *,
    output_dir: str | Path | None = None,
    save_every: int = 0,
    keep_last: int | None = None,
    resume_from: str | Path | None = None,
    record: Mapping[str, Any] | None = None,
    progress: bool = False,
    overwrite: bool = False,
    reporters: Callable[[Path], list[Reporter]] | None = None,
) -> list[dict[str, float]]:
    """Supervised fine-tuning: minimise :func:`~comlrl.estimators.preference_losses.sft_nll`
    (token-mean NLL of the completion tokens; prompt tokens are not trained on).

    Each step takes ``config.batch_size`` rows in a seeded shuffled order and accumulates
    micro-batches weighted by their share of the batch's completion tokens, so the
    gradient equals the whole batch's. With an ``eval_dataset`` the held-out NLL
    (:func:`evaluate_sft`) is written to ``output_dir/eval.jsonl`` before training
    (``step`` 0), every ``eval_every`` steps and at the end.

    Run outputs (the loop driver, :func:`comlrl.algos.training.loop.run_loop`): with
    ``output_dir``, ``metrics.jsonl``, ``config.yaml`` (``record``, when given), step
    checkpoints every ``save_every`` steps and at the last (0: only on Ctrl-C; the newest
    ``keep_last`` kept) and ``final/agent_<i>`` are written there, and Ctrl-C stops at a
    step boundary after a checkpoint (``reporters``, built in ``output_dir``, get every
    row: TensorBoard, W&B, the reward curve); ``resume_from`` (a step checkpoint of this run)
    continues from its step exactly as if never stopped. A fresh run refuses an
    ``output_dir`` that holds another run unless ``overwrite``.

    Returns:
        One metrics row per step (``step``, ``loss``, ``grad_norm``, ``num_tokens``,
        ``time/step_s``, ``prompts_per_s``); a resumed run returns the rows of the steps it
        ran. Evaluation rows (``eval/nll``) go to ``output_dir/eval.jsonl``.

    Raises:
        ConfigError: rows without string ``prompt``/``completion`` fields, or an empty set.
        CheckpointError: ``resume_from`` is incomplete or does not fit this run.
        TrainingInterrupted: Ctrl-C (with ``output_dir``), after the checkpoint.
    """
    rows = check_rows(dataset, ("prompt", "completion"), "SFT")
    if eval_dataset is not None:
        eval_dataset = check_rows(eval_dataset, ("prompt", "completion"), "SFT evaluation")
    settings = loop_settings(
        config,
        output_dir=output_dir,
        save_every=save_every,
        keep_last=keep_last,
        record=record,
        progress=progress,
        desc="sft",
        overwrite=overwrite,
        reporters=reporters,
    )
    optimizer = prepare_training(model, config)
    data = DataStream(rows, seed=config.seed)
    rng = random.Random(config.seed)  # unused by SFT; kept so every recipe saves one
    step = 0
    if resume_from is not None:
        step = read_step_checkpoint(resume_from, output_dir, [model], [optimizer], data, rng, [])

    def one_step() -> StepResult:
        nonlocal step
        batch = _sft_batch(
            tokenizer, data.next_batch(config.batch_size), config, model_device(model)
        )
        total_tokens = float(batch.completion_mask.sum())
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for chunk in prompt_chunks(batch, config.micro_batch_size):
            _, tokens = sequence_logprobs(model, batch, chunk)
            mask = batch.completion_mask[chunk]
            loss = sft_nll(tokens, mask)
            weight = float(mask.sum()) / total_tokens
            (loss * weight).backward()
            loss_sum += float(loss.detach()) * weight
        norm = clipped_optimizer_step(model, optimizer, config.max_grad_norm)
        step += 1
        return StepResult(
            {"step": step, "loss": loss_sum, "grad_norm": norm, "num_tokens": total_tokens}
        )

    loop = RecipeLoop(
        step=one_step,
        checkpoint=lambda path: write_step_checkpoint(
            path, step, [(model, tokenizer)], [optimizer], data, rng, []
        ),
        save_final=lambda path: save_models(path, [(model, tokenizer)]),
        evaluate=(
            (lambda: evaluate_sft(model, tokenizer, eval_dataset, config)) if eval_dataset else None
        ),
        start_step=step,
    )
    return run_loop(loop, settings)


# --------------------------------------------------------------------------- DPO


def _dpo_batch(
    tokenizer: Any, rows: Sequence[Mapping[str, Any]], config: DPOConfig, device: torch.device
) -> PolicyBatch:
    return encode_completions(
        tokenizer,
        [r["prompt"] for r in rows],
        [text for r in rows for text in (r["chosen"], r["rejected"])],
        group_size=2,
        add_eos=config.add_eos,
        max_prompt_length=config.max_prompt_length,
        max_completion_length=config.max_completion_length,
        device=device,
    )


def _dpo_chunk(
    model: Any, ref_model: Any, batch: PolicyBatch, chunk: slice, config: DPOConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    with sampling_mode(model):  # no dropout: at the reference the margin is exactly 0
        logp, _ = sequence_logprobs(model, batch, chunk)  # [2b]: chosen, rejected, ...
    with torch.no_grad():
        ref, _ = sequence_logprobs(ref_model, batch, chunk)
    return dpo_loss(
        logp[0::2],
        logp[1::2],
        ref[0::2],
        ref[1::2],
        beta=config.beta,
        label_smoothing=config.label_smoothing,
        loss_type=config.loss_type,
    )


@torch.no_grad()
def evaluate_dpo(
    model: Any,
    ref_model: Any,
    tokenizer: Any,
    dataset: Sequence[Mapping[str, Any]],
    config: DPOConfig,
) -> dict[str, float]:
    """Held-out DPO metrics over ``prompt``/``chosen``/``rejected`` rows: pair-weighted
    means of ``eval/loss``, ``eval/margin`` (the log-ratio margin ``h`` in nats; 0 when the
    policy is the reference) and ``eval/accuracy`` (fraction with ``h > 0``)."""
    rows = check_rows(dataset, ("prompt", "chosen", "rejected"), "DPO evaluation")
    was_training = model.training
    model.eval()
    sums = {"eval/loss": 0.0, "eval/margin": 0.0, "eval/accuracy": 0.0}
    try:
        for i in range(0, len(rows), config.batch_size):
            part = rows[i : i + config.batch_size]
            batch = _dpo_batch(tokenizer, part, config, model_device(model))
            loss, m = _dpo_chunk(model, ref_model, batch, slice(0, len(part)), config)
            sums["eval/loss"] += float(loss) * len(part)
            sums["eval/margin"] += m["margin"] * len(part)
            sums["eval/accuracy"] += m["accuracy"] * len(part)
    finally:
        model.train(was_training)
    return {k: v / len(rows) for k, v in sums.items()}


def train_dpo(
    model: Any,
    tokenizer: Any,
    dataset: Sequence[Mapping[str, Any]],
    config: DPOConfig,
    eval_dataset: Sequence[Mapping[str, Any]] | None = None,
    *,
    ref_model: Any | None = None,
    output_dir: str | Path | None = None,
    save_every: int = 0,
    keep_last: int | None = None,
    resume_from: str | Path | None = None,
    record: Mapping[str, Any] | None = None,
    progress: bool = False,
    overwrite: bool = False,
    reporters: Callable[[Path], list[Reporter]] | None = None,
) -> list[dict[str, float]]:
    """Direct Preference Optimization (Rafailov et al. 2023, eq. 7) against a frozen
    reference model.

    ``ref_model`` defaults to a deep copy of ``model`` made once, before the first step,
    frozen (``requires_grad=False``, eval mode). Each step takes ``config.batch_size``
    pairs; chosen and rejected share one prompt forward (``G = 2``); micro-batches are
    weighted by their share of the pairs. With an ``eval_dataset``, :func:`evaluate_dpo`
    runs before training (``step`` 0), every ``eval_every`` steps and at the end, one
    row each in ``output_dir/eval.jsonl``.

    Run outputs (the loop driver, :func:`comlrl.algos.training.loop.run_loop`): with
    ``output_dir``, ``metrics.jsonl``, ``config.yaml`` (``record``, when given), step
    checkpoints every ``save_every`` steps and at the last (0: only on Ctrl-C; the newest
    ``keep_last`` kept) and ``final/agent_<i>`` are written there, and Ctrl-C stops at a
    step boundary after a checkpoint (``reporters``, built in ``output_dir``, get every
    row: TensorBoard, W&B, the reward curve); ``resume_from`` (a step checkpoint of this run)
    continues from its step exactly as if never stopped. A fresh run refuses an
    ``output_dir`` that holds another run unless ``overwrite``. The reference model is not saved: on resume,
    pass the model as the run started (its copy is the reference) or the same
    ``ref_model``; the checkpoint's weights are loaded into ``model`` afterwards.

    Returns:
        One row per step: ``loss``, ``margin``, ``accuracy``, ``chosen_reward``,
        ``rejected_reward`` (training batch, before the step), ``grad_norm``, and
        ``eval/*`` where evaluation ran.

    Raises:
        ConfigError: rows without string ``prompt``/``chosen``/``rejected``, an empty set,
            or ``ref_model`` that is ``model`` itself.
        CheckpointError: ``resume_from`` is incomplete, does not fit this run, or the
            reference model's weights differ from the saved run's.
        TrainingInterrupted: Ctrl-C (with ``output_dir``), after the checkpoint.
    """
    keys = ("prompt", "chosen", "rejected")
    rows = check_rows(dataset, keys, "DPO")
    if eval_dataset is not None:
        eval_dataset = check_rows(eval_dataset, keys, "DPO evaluation")
    if ref_model is model:
        raise ConfigError(
            "ref_model is the policy itself; pass a separate frozen copy or None (a copy is made)."
        )
    settings = loop_settings(
        config,
        output_dir=output_dir,
        save_every=save_every,
        keep_last=keep_last,
        record=record,
        progress=progress,
        desc="dpo",
        overwrite=overwrite,
        reporters=reporters,
    )
    optimizer = prepare_training(model, config)
    ref = copy.deepcopy(model) if ref_model is None else ref_model
    ref.to(model_device(model)).eval().requires_grad_(False)
    data = DataStream(rows, seed=config.seed)
    rng = random.Random(config.seed)  # unused by DPO; kept so every recipe saves one
    step = 0
    if resume_from is not None:
        step = read_step_checkpoint(
            resume_from, output_dir, [model], [optimizer], data, rng, [], [ref]
        )

    def one_step() -> StepResult:
        nonlocal step
        part = data.next_batch(config.batch_size)
        batch = _dpo_batch(tokenizer, part, config, model_device(model))
        optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        micro = None if config.micro_batch_size is None else 2 * config.micro_batch_size
        for chunk in prompt_chunks(batch, micro):
            loss, m = _dpo_chunk(model, ref, batch, chunk, config)
            weight = (chunk.stop - chunk.start) / len(part)
            (loss * weight).backward()
            for k, v in {"loss": float(loss.detach()), **m}.items():
                sums[k] = sums.get(k, 0.0) + v * weight
        norm = clipped_optimizer_step(model, optimizer, config.max_grad_norm)
        step += 1
        return StepResult({"step": step, **sums, "grad_norm": norm})

    loop = RecipeLoop(
        step=one_step,
        checkpoint=lambda path: write_step_checkpoint(
            path, step, [(model, tokenizer)], [optimizer], data, rng, [], [ref]
        ),
        save_final=lambda path: save_models(path, [(model, tokenizer)]),
        evaluate=(
            (lambda: evaluate_dpo(model, ref, tokenizer, eval_dataset, config))
            if eval_dataset
            else None
        ),
        start_step=step,
    )
    return run_loop(loop, settings)
