"""SFT and DPO of one model on fixed rows, each a setup and one step under the loop driver.

- :func:`train_sft`: supervised fine-tuning on ``prompt``/``completion`` rows (token-mean
  NLL of the completion tokens only); evaluation is the held-out NLL.
- :func:`train_dpo`: DPO (Rafailov et al. 2023) on ``prompt``/``chosen``/``rejected`` rows
  against a frozen reference model; evaluation is the held-out chosen-vs-rejected margin
  and accuracy.

Trainer objects of SFT and DPO (one model on offline rows): thin fronts over
:mod:`comlrl.algos.recipes.preference.supervised.recipe` that check their arguments and
config when built (before any model work) and call the recipe's loop in ``train``.

The end-to-end runs of the one-model recipes (``algo=sft``, ``algo=dpo``): their run
configs (the library config plus the model, the ``data`` files and the outputs), and the
run: read and check the rows, load the model, train, write ``final/agent_0``.
"""

from __future__ import annotations

import copy
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.models.logprobs import prompt_chunks, sampling_mode
from comlrl.algos.recipes.launch import (
    RunOutputs,
    RunResult,
    load_model,
    loss_summary,
    quiet_transformers,
    read_jsonl_rows,
    resuming_line,
    setup_errors,
    start_outputs,
)
from comlrl.algos.recipes.preference.checkpoint import (
    loop_settings,
    read_step_checkpoint,
    save_models,
    write_step_checkpoint,
)
from comlrl.algos.recipes.preference.encoding import (
    check_rows,
    clipped_optimizer_step,
    encode_completions,
    model_device,
    prepare_training,
    sequence_logprobs,
)
from comlrl.algos.recipes.preference.inputs import check_config
from comlrl.algos.recipes.preference.supervised.config import (
    DPOConfig,
    DPORunConfig,
    SFTConfig,
    SFTRunConfig,
)
from comlrl.algos.records import PolicyBatch
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.loop import (
    RecipeLoop,
    StepResult,
    run_loop,
)
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.reporting import Reporter
from comlrl.estimators.preference_losses import (
    dpo_loss,
    sft_nll,
)

__all__ = [
    "evaluate_sft",
    "train_sft",
    "evaluate_dpo",
    "train_dpo",
    "SFTTrainer",
    "DPOTrainer",
    "run_sft",
    "run_dpo",
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


class SFTTrainer:
    """Supervised fine-tuning of ``model`` on ``prompt``/``completion`` rows
    (:func:`comlrl.algos.recipes.preference.supervised.recipe.train_sft`).

    Raises:
        ConfigError: a config of the wrong type, or rows without the string fields.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: SFTConfig,
        *,
        dataset: Sequence[Mapping[str, Any]],
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        check_config(config, SFTConfig)
        keys = ("prompt", "completion")
        self.dataset = check_rows(dataset, keys, "SFT")
        self.eval_dataset = (
            check_rows(eval_dataset, keys, "SFT evaluation") if eval_dataset is not None else None
        )
        self.model, self.tokenizer, self.config = model, tokenizer, config

    def evaluate(self) -> dict[str, float]:
        """Held-out NLL (:func:`~comlrl.algos.recipes.preference.supervised.recipe.evaluate_sft`)."""
        if self.eval_dataset is None:
            raise ConfigError("no eval_dataset was given to SFTTrainer")
        return evaluate_sft(self.model, self.tokenizer, self.eval_dataset, self.config)

    def train(self, **outputs: Any) -> list[dict[str, float]]:
        """Run the loop; one metrics row per step. ``outputs`` (``output_dir``,
        ``save_every``, ``keep_last``, ``resume_from``, ``record``, ``progress``) as in
        :func:`~comlrl.algos.recipes.preference.supervised.recipe.train_sft`: with ``output_dir``, logs,
        step checkpoints, Ctrl-C at a step boundary and ``final/``; ``resume_from``
        continues a run exactly."""
        return train_sft(
            self.model, self.tokenizer, self.dataset, self.config, self.eval_dataset, **outputs
        )


class DPOTrainer:
    """DPO of ``model`` on ``prompt``/``chosen``/``rejected`` rows against ``ref_model``
    (default: a frozen deep copy of ``model`` made when training starts;
    :func:`comlrl.algos.recipes.preference.supervised.recipe.train_dpo`).

    Raises:
        ConfigError: a config of the wrong type, rows without the string fields, or
            ``ref_model is model``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: DPOConfig,
        *,
        dataset: Sequence[Mapping[str, Any]],
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        ref_model: Any | None = None,
    ) -> None:
        check_config(config, DPOConfig)
        keys = ("prompt", "chosen", "rejected")
        self.dataset = check_rows(dataset, keys, "DPO")
        self.eval_dataset = (
            check_rows(eval_dataset, keys, "DPO evaluation") if eval_dataset is not None else None
        )
        if ref_model is model:
            raise ConfigError(
                "ref_model is the policy itself; pass a separate frozen copy or None."
            )
        self.model, self.tokenizer, self.config, self.ref_model = (
            model,
            tokenizer,
            config,
            ref_model,
        )

    def train(self, **outputs: Any) -> list[dict[str, float]]:
        """Run the loop; one metrics row per step. ``outputs`` as in
        :func:`~comlrl.algos.recipes.preference.supervised.recipe.train_dpo` (``resume_from``: build the
        trainer on the run's initial weights: the reference is their copy)."""
        return train_dpo(
            self.model,
            self.tokenizer,
            self.dataset,
            self.config,
            self.eval_dataset,
            ref_model=self.ref_model,
            **outputs,
        )


def run_sft(config: SFTRunConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=sft``: :func:`~comlrl.algos.recipes.preference.supervised.recipe.train_sft` on
    ``config.data``; raises as :func:`run_dpo`."""
    from comlrl.algos.recipes.preference.supervised.recipe import train_sft

    def train(model: Any, tok: Any, rows: list[dict[str, Any]], held: Any, **loop: Any) -> Any:
        return train_sft(model, tok, rows, config, held, **loop)

    return _run_one_model(config, outputs, "sft", train)


def run_dpo(config: DPORunConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=dpo``: :func:`~comlrl.algos.recipes.preference.supervised.recipe.train_dpo` on
    ``config.data`` (reference model: a frozen copy of the model as loaded).

    Raises:
        ConfigError: unreadable or malformed rows, a bad model name, a model that does not
            load, a folder that holds another run (without ``outputs.overwrite``).
        CheckpointError: ``outputs.resume_from`` does not fit the run.
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
    """
    from comlrl.algos.recipes.preference.supervised.recipe import train_dpo

    def train(model: Any, tok: Any, rows: list[dict[str, Any]], held: Any, **loop: Any) -> Any:
        return train_dpo(model, tok, rows, config, held, **loop)

    return _run_one_model(config, outputs, "dpo", train)


def _run_one_model(
    config: SFTRunConfig | DPORunConfig,
    outputs: RunOutputs | None,
    algo: str,
    train: Callable[..., list[dict[str, float]]],
) -> RunResult:
    from comlrl.algos.training.config.task_setup import check_model_names
    from comlrl.algos.training.run.checkpoint import CheckpointError, read_checkpoint_meta

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    outputs.check_folder()
    keys = config.row_keys
    assert config.data is not None  # OneModelRunFields checked it
    rows = read_jsonl_rows(config.data, keys, algo.upper())
    held = (
        read_jsonl_rows(config.eval_data, keys, f"{algo.upper()} evaluation")
        if config.eval_data
        else None
    )
    check_model_names(config.models)
    quiet_transformers()
    print(
        f"comlrl: {algo.upper()} of {config.models[0]} on {config.data} ({len(rows)} rows), "
        f"{config.num_steps} steps of {config.batch_size} rows; outputs in "
        f"{outputs.output_dir}/",
        file=sys.stderr,
    )
    with setup_errors():
        model, tok = load_model(config.models[0], config, config.seed)
        out = start_outputs(config, algo, outputs)
        if outputs.resume_from is not None:
            step = read_checkpoint_meta(outputs.resume_from)["step"]
            print(resuming_line(out, step, config.num_steps, outputs.resume_from))
    record = {"algo": algo, **config.model_dump()}
    try:
        history = train(
            model,
            tok,
            rows,
            held,
            **outputs.loop_arguments(record),
            resume_from=outputs.resume_from,
        )
    except CheckpointError as exc:  # the resume's checkpoint, read before the first step
        raise CheckpointError(f"cannot resume from {outputs.resume_from}: {exc}") from None
    return RunResult(history, loss_summary(history, out), out)
