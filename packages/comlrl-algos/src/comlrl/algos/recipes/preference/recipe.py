"""Preference and supervised recipes: SFT, DPO, MADPO, and MARLHF's joint reward model.

Every recipe reads its log-probs through the shared path
(:func:`comlrl.algos.models.logprobs.completion_logprobs`, which reduces logits with
:func:`comlrl.kernels.token_logprobs`) and its losses from
:mod:`comlrl.algos.functional.preference_losses`. Each loop reads top to bottom:

- :func:`train_sft`: supervised fine-tuning on ``prompt``/``completion`` rows (token-mean
  NLL of the completion tokens only); evaluation is the held-out NLL.
- :func:`train_dpo`: DPO (Rafailov et al. 2023) on ``prompt``/``chosen``/``rejected`` rows
  against a frozen reference model; evaluation is the held-out chosen-vs-rejected margin
  and accuracy.
- :func:`madpo_setup` / :func:`madpo_step` / :func:`train_madpo`: multi-agent DPO. Per
  prompt each agent samples ``K`` candidates with :func:`comlrl.algos.rollout.tree.rollout`,
  the reward function scores the joint actions, :func:`preference_pairs` pairs them by
  reward gap, and every agent takes a step on
  :func:`~comlrl.algos.functional.preference_losses.multi_agent_dpo_loss` against its own frozen
  reference model.
- :class:`JointRewardModel` / :func:`train_reward_model` / :class:`RewardModelReward`:
  MARLHF's joint reward model (LM backbone + linear head on the last token of the joint
  response), trained with the Bradley-Terry loss on the same pairs, then used as the
  reward function of any RL recipe.

Named axes: ``N`` prompts, ``A`` agents, ``K`` candidates (joint actions) per prompt,
``P`` pairs, ``B`` sequences, ``S`` padded prompt tokens, ``L`` completion tokens, ``H``
hidden size.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import torch
from comlrl.algos.functional.preference_losses import (
    bradley_terry_loss,
    dpo_loss,
    multi_agent_dpo_loss,
    select_preference_pairs,
    sft_nll,
)
from comlrl.algos.models.logprobs import completion_logprobs, prompt_chunks, sampling_mode
from comlrl.algos.records import PolicyBatch, Rollout
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.rollout.sampling.collate import pack_token_rows
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.config import ConfigError
from comlrl.algos.training.steps import DataStream, build_optimizer, resolve_device
from comlrl.core import RewardBatch, SamplingParams
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from torch import nn

__all__ = [
    "PreferenceTrainConfig",
    "SFTConfig",
    "DPOConfig",
    "MADPOConfig",
    "RewardModelConfig",
    "StepCheckpoints",
    "encode_completions",
    "sequence_logprobs",
    "train_sft",
    "evaluate_sft",
    "train_dpo",
    "evaluate_dpo",
    "JointPreferencePairs",
    "preference_pairs",
    "MADPORun",
    "madpo_setup",
    "madpo_step",
    "madpo_pair_metrics",
    "madpo_evaluate",
    "madpo_checkpoint",
    "madpo_resume",
    "train_madpo",
    "format_joint_text",
    "JointRewardModel",
    "train_reward_model",
    "evaluate_reward_model",
    "RewardModelReward",
]


# --------------------------------------------------------------------------- configs


class _Validated(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @classmethod
    def build(cls, **kwargs: Any) -> Any:
        """Validate ``kwargs`` into this config; raises :class:`ConfigError` (a
        ``ValueError``) naming every bad field, its value and the rule it broke."""
        try:
            return cls(**kwargs)
        except ValidationError as exc:
            lines = [
                f"{'.'.join(str(x) for x in e['loc']) or '(config)'}: {e['msg']} (got {e.get('input')!r})"
                for e in exc.errors()
            ]
            raise ConfigError(f"invalid {cls.__name__}:\n  " + "\n  ".join(lines)) from None


class PreferenceTrainConfig(_Validated):
    """Optimizer and loop settings shared by the preference and SFT recipes.

    Units: ``learning_rate`` per optimizer step, ``num_steps`` in optimizer steps, token
    limits in tokens, ``batch_size`` in rows (SFT, DPO) or prompts (MADPO).
    """

    learning_rate: float = Field(1e-5, gt=0)
    optimizer: Literal["adamw", "radam", "sgd"] = "adamw"
    weight_decay: float = Field(0.0, ge=0)
    num_steps: int = Field(100, ge=1)
    batch_size: int = Field(8, ge=1)
    micro_batch_size: int | None = Field(
        None, ge=1, description="Rows per forward/backward (SFT, DPO); None: the whole batch."
    )
    max_grad_norm: float | None = Field(1.0, gt=0)
    eval_every: int = Field(
        0, ge=0, description="Evaluate every this many steps (0: only at the end)."
    )
    seed: int = 0
    device: str = "auto"


class SFTConfig(PreferenceTrainConfig):
    """Supervised fine-tuning on ``prompt``/``completion`` rows.

    Attributes:
        max_prompt_length: keep the last this many prompt tokens (``None``: all).
        max_completion_length: keep the first this many completion tokens, EOS included.
        add_eos: end every completion with the tokenizer's EOS token, so the model learns
            to stop.
    """

    max_prompt_length: int | None = Field(None, ge=1)
    max_completion_length: int | None = Field(None, ge=1)
    add_eos: bool = True


class DPOConfig(SFTConfig):
    """DPO on ``prompt``/``chosen``/``rejected`` rows (see
    :func:`~comlrl.algos.functional.preference_losses.dpo_loss` for ``beta``, ``label_smoothing``,
    ``loss_type``)."""

    beta: float = Field(0.1, gt=0)
    label_smoothing: float = Field(0.0, ge=0, lt=0.5)
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"

    @model_validator(mode="after")
    def _smoothing_needs_sigmoid(self) -> DPOConfig:
        if self.label_smoothing and self.loss_type != "sigmoid":
            raise ValueError(
                f"label_smoothing={self.label_smoothing} applies to loss_type='sigmoid' only; "
                "set label_smoothing=0 for IPO"
            )
        return self


class MADPOConfig(PreferenceTrainConfig):
    """Multi-agent DPO: sampling, pairing and loss settings (single-turn tasks).

    Attributes:
        num_agents: ``A``.
        num_candidates: ``K``, candidates each agent samples per prompt (>= 2); with
            ``joint_mode="align"`` the ``k``-th candidates of all agents form joint action
            ``k``.
        min_gap: the smallest reward gap (task units) that makes a pair.
        pairs_per_prompt: pairs kept per prompt, largest gap first.
        beta: DPO inverse temperature.
        eval_num_samples: samples per held-out prompt in :func:`madpo_evaluate`'s reward.
    """

    num_agents: int = Field(2, ge=1, le=16)
    num_candidates: int = Field(4, ge=2)
    max_new_tokens: int = Field(48, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    joint_mode: Literal["align", "cross"] = "align"
    min_gap: float = Field(0.0, ge=0)
    pairs_per_prompt: int = Field(1, ge=1)
    beta: float = Field(0.1, gt=0)
    eval_num_samples: int = Field(4, ge=1)


class RewardModelConfig(_Validated):
    """Training of MARLHF's joint reward model on preference pairs.

    Attributes:
        learning_rate: per optimizer step.
        num_epochs: passes over the training pairs.
        batch_size: pairs per optimizer step.
        max_length: keep the last this many tokens of each joint text (the head reads
            the last one).
        freeze_backbone: train the linear head only.
    """

    learning_rate: float = Field(1e-4, gt=0)
    optimizer: Literal["adamw", "radam", "sgd"] = "adamw"
    weight_decay: float = Field(0.0, ge=0)
    num_epochs: int = Field(1, ge=1)
    batch_size: int = Field(8, ge=1)
    max_length: int = Field(512, ge=2)
    max_grad_norm: float | None = Field(1.0, gt=0)
    freeze_backbone: bool = False
    seed: int = 0


# --------------------------------------------------------------------------- tensors


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


def _rows(
    dataset: Sequence[Mapping[str, Any]], keys: tuple[str, ...], what: str
) -> list[Mapping[str, Any]]:
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


def _device_of(model: Any) -> torch.device:
    return next(model.parameters()).device


def _step(model: Any, optimizer: torch.optim.Optimizer, max_grad_norm: float | None) -> float:
    """One optimizer step after clipping the gradient's global L2 norm to ``max_grad_norm``
    (``None``: no clipping); returns the norm before clipping (measured either way)."""
    limit = float("inf") if max_grad_norm is None else max_grad_norm
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), limit))
    optimizer.step()
    return norm


def _prepare(model: Any, config: PreferenceTrainConfig) -> torch.optim.Optimizer:
    torch.manual_seed(config.seed)
    model.to(resolve_device(config.device))
    model.train()
    return build_optimizer(
        [p for p in model.parameters() if p.requires_grad],
        config.optimizer,
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
    )


# --------------------------------------------------------------------------- step checkpoints


@dataclass(frozen=True)
class StepCheckpoints:
    """Where and when a preference loop (SFT, DPO, MADPO) writes resumable step
    checkpoints, and which one it continues from.

    A checkpoint is the folder :func:`comlrl.algos.training.checkpoint.write_checkpoint` writes
    atomically (temporary folder, then rename) at ``output_dir/checkpoints/step-NNNNNN``:
    the trained model(s) in Hugging Face format (``agent_<i>/``) and ``training_state.pt``
    (optimizers, the data stream's order and position, torch's, Python's and each agent's
    random streams, the step, and a fingerprint of the frozen reference models). Reference
    models are not saved: they are the weights the run started from, rebuilt by loading
    the same models; the fingerprint makes a resume with other initial weights fail.

    While the loop runs, the first Ctrl-C (SIGINT) finishes the step in progress, writes a
    checkpoint and raises :class:`~comlrl.algos.training.lifecycle.TrainingInterrupted`.

    Attributes:
        output_dir: the run's folder (``checkpoints/`` goes inside; ``metrics.jsonl``
            there is cut back to the checkpoint's step on resume).
        save_every: checkpoint every this many steps and at the last step; 0: only on
            Ctrl-C.
        keep_last: keep the newest this many step checkpoints (``None``: all).
        resume_from: a step checkpoint of this run to continue from (``None``: start).
    """

    output_dir: Path
    save_every: int = 0
    keep_last: int | None = None
    resume_from: Path | None = None

    def __post_init__(self) -> None:
        if self.save_every < 0:
            raise ConfigError(f"save_every must be >= 0, got {self.save_every}")
        if self.keep_last is not None and self.keep_last < 1:
            raise ConfigError(f"keep_last must be >= 1 or None, got {self.keep_last}")


def _fingerprint(models: Sequence[Any]) -> list[float]:
    """Per model, the float64 sum of |w| over every parameter: equal for the same
    weights, and almost surely different for others (a cheap check, not a hash)."""
    out = []
    for m in models:
        with torch.no_grad():
            out.append(float(sum(p.detach().double().abs().sum() for p in m.parameters())))
    return out


def _write_step(
    ckpts: StepCheckpoints,
    step: int,
    models: Sequence[tuple[Any, Any]],
    optimizers: Sequence[torch.optim.Optimizer],
    data: DataStream,
    rng: random.Random,
    generators: Sequence[torch.Generator | None],
    references: Sequence[Any] = (),
) -> Path:
    from comlrl.algos.training import checkpoint as ckpt

    state = ckpt.capture_state(
        step=step, optimizers=optimizers, data=data, rng=rng, generators=generators
    )
    state["reference_fingerprint"] = _fingerprint(references)
    path = ckpt.write_checkpoint(
        ckpt.step_checkpoint_path(ckpts.output_dir, step),
        [SimpleNamespace(model=m, tokenizer=t) for m, t in models],
        state,
    )
    if ckpts.keep_last:
        ckpt.prune_checkpoints(ckpts.output_dir, ckpts.keep_last, keep=path)
    return path


def _read_step(
    path: str | Path,
    output_dir: Path | None,
    models: Sequence[Any],
    optimizers: Sequence[torch.optim.Optimizer],
    data: DataStream,
    rng: random.Random,
    generators: Sequence[torch.Generator | None],
    references: Sequence[Any] = (),
) -> int:
    from comlrl.algos.training import checkpoint as ckpt
    from comlrl.algos.training.lifecycle import truncate_jsonl

    state = ckpt.load_training_state(path)
    saved = state.get("reference_fingerprint")
    if saved is None:
        raise ckpt.CheckpointError(
            f"{str(path)!r} was not written by a preference recipe (no reference fingerprint); "
            "resume it with the recipe that wrote it."
        )
    now = _fingerprint(references)
    if len(saved) != len(now) or any(
        abs(a - b) > 1e-9 * max(1.0, abs(b)) for a, b in zip(saved, now, strict=False)
    ):
        raise ckpt.CheckpointError(
            f"the reference models differ from the run's (weight fingerprints {saved} when "
            f"saved, {now} now); resume with the models the run was started with."
        )
    for i, model in enumerate(models):
        ckpt.load_agent_weights(model, Path(path) / f"agent_{i}")
    step = ckpt.restore_state(
        state, optimizers=optimizers, data=data, rng=rng, generators=generators
    )
    if output_dir is not None:
        ckpt.clean_partial_checkpoints(output_dir)
        truncate_jsonl(Path(output_dir) / "metrics.jsonl", step)
    return step


@contextmanager
def _stop_on_ctrl_c(ckpts: StepCheckpoints | None) -> Iterator[Any]:
    """:class:`~comlrl.algos.training.lifecycle.StopAtStepBoundary` while a loop that can
    checkpoint runs; without checkpoints Ctrl-C behaves as usual."""
    from comlrl.algos.training.lifecycle import StopAtStepBoundary

    if ckpts is None:
        yield SimpleNamespace(requested=False)
        return
    with StopAtStepBoundary() as stop:
        yield stop


def _after_step(
    ckpts: StepCheckpoints | None, stop: Any, step: int, num_steps: int, save: Callable[[], Path]
) -> None:
    """Checkpoint on schedule; after Ctrl-C, checkpoint and raise TrainingInterrupted."""
    from comlrl.algos.training.lifecycle import TrainingInterrupted

    if ckpts is None:
        return
    if stop.requested and step < num_steps:
        raise TrainingInterrupted(step, save(), Path(ckpts.output_dir))
    if ckpts.save_every and (step % ckpts.save_every == 0 or step == num_steps):
        save()


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
    rows = _rows(dataset, ("prompt", "completion"), "SFT evaluation")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0.0
    try:
        for i in range(0, len(rows), config.batch_size):
            batch = _sft_batch(
                tokenizer, rows[i : i + config.batch_size], config, _device_of(model)
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
    on_step: Callable[[dict[str, float]], None] | None = None,
    checkpoints: StepCheckpoints | None = None,
) -> list[dict[str, float]]:
    """Supervised fine-tuning: minimise :func:`~comlrl.algos.functional.preference_losses.sft_nll`
    (token-mean NLL of the completion tokens; prompt tokens are not trained on).

    Each step takes ``config.batch_size`` rows in a seeded shuffled order and accumulates
    micro-batches weighted by their share of the batch's completion tokens, so the
    gradient equals the whole batch's. With an ``eval_dataset`` the held-out NLL
    (:func:`evaluate_sft`) is logged before training, every ``eval_every`` steps and at
    the end. ``on_step(row)``, when given, receives each finished row as it is made
    (the command line writes them to ``metrics.jsonl``). With ``checkpoints``, step
    checkpoints (model, optimizer, data order and position, random streams) are written
    as :class:`StepCheckpoints` says, Ctrl-C stops at a step boundary, and a run given
    ``checkpoints.resume_from`` continues from that step exactly as if never stopped.

    Returns:
        One metrics row per step (``step``, ``loss``, ``grad_norm``, ``num_tokens``),
        with ``eval/nll`` on the rows where evaluation ran; a resumed run returns the
        rows of the steps it ran.

    Raises:
        ConfigError: rows without string ``prompt``/``completion`` fields, or an empty set.
        CheckpointError: ``resume_from`` is incomplete or does not fit this run.
        TrainingInterrupted: Ctrl-C (with ``checkpoints``), after the checkpoint.
    """
    rows = _rows(dataset, ("prompt", "completion"), "SFT")
    if eval_dataset is not None:
        eval_dataset = _rows(eval_dataset, ("prompt", "completion"), "SFT evaluation")
    optimizer = _prepare(model, config)
    data = DataStream(rows, seed=config.seed)
    rng = random.Random(config.seed)  # unused by SFT; kept so every recipe saves one
    first = 1
    if checkpoints is not None and checkpoints.resume_from is not None:
        first = 1 + _read_step(
            checkpoints.resume_from, checkpoints.output_dir, [model], [optimizer], data, rng, []
        )

    def save() -> Path:
        assert checkpoints is not None
        return _write_step(checkpoints, step, [(model, tokenizer)], [optimizer], data, rng, [])

    history: list[dict[str, float]] = []
    start = (
        evaluate_sft(model, tokenizer, eval_dataset, config) if eval_dataset and first == 1 else {}
    )
    with _stop_on_ctrl_c(checkpoints) as stop:
        for step in range(first, config.num_steps + 1):
            batch = _sft_batch(
                tokenizer, data.next_batch(config.batch_size), config, _device_of(model)
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
            norm = _step(model, optimizer, config.max_grad_norm)
            row: dict[str, float] = {
                "step": step,
                "loss": loss_sum,
                "grad_norm": norm,
                "num_tokens": total_tokens,
            }
            if step == 1:
                row.update({f"{k}_start": v for k, v in start.items()})
            if eval_dataset and (
                step == config.num_steps or (config.eval_every and step % config.eval_every == 0)
            ):
                row.update(evaluate_sft(model, tokenizer, eval_dataset, config))
            history.append(row)
            if on_step is not None:
                on_step(row)
            _after_step(checkpoints, stop, step, config.num_steps, save)
    return history


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
    rows = _rows(dataset, ("prompt", "chosen", "rejected"), "DPO evaluation")
    was_training = model.training
    model.eval()
    sums = {"eval/loss": 0.0, "eval/margin": 0.0, "eval/accuracy": 0.0}
    try:
        for i in range(0, len(rows), config.batch_size):
            part = rows[i : i + config.batch_size]
            batch = _dpo_batch(tokenizer, part, config, _device_of(model))
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
    on_step: Callable[[dict[str, float]], None] | None = None,
    checkpoints: StepCheckpoints | None = None,
) -> list[dict[str, float]]:
    """Direct Preference Optimization (Rafailov et al. 2023, eq. 7) against a frozen
    reference model.

    ``ref_model`` defaults to a deep copy of ``model`` made once, before the first step,
    frozen (``requires_grad=False``, eval mode). Each step takes ``config.batch_size``
    pairs; chosen and rejected share one prompt forward (``G = 2``); micro-batches are
    weighted by their share of the pairs. With an ``eval_dataset``, :func:`evaluate_dpo`
    runs before training (``*_start`` keys on row 1), every ``eval_every`` steps and at
    the end. ``on_step(row)``, when given, receives each finished row as it is made.
    ``checkpoints`` as in :func:`train_sft`; the reference model is not saved: on resume,
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
        TrainingInterrupted: Ctrl-C (with ``checkpoints``), after the checkpoint.
    """
    keys = ("prompt", "chosen", "rejected")
    rows = _rows(dataset, keys, "DPO")
    if eval_dataset is not None:
        eval_dataset = _rows(eval_dataset, keys, "DPO evaluation")
    if ref_model is model:
        raise ConfigError(
            "ref_model is the policy itself; pass a separate frozen copy or None (a copy is made)."
        )
    optimizer = _prepare(model, config)
    if ref_model is None:
        ref_model = copy.deepcopy(model)
    ref_model.to(_device_of(model)).eval().requires_grad_(False)
    data = DataStream(rows, seed=config.seed)
    rng = random.Random(config.seed)  # unused by DPO; kept so every recipe saves one
    first = 1
    if checkpoints is not None and checkpoints.resume_from is not None:
        first = 1 + _read_step(
            checkpoints.resume_from,
            checkpoints.output_dir,
            [model],
            [optimizer],
            data,
            rng,
            [],
            [ref_model],
        )

    def save() -> Path:
        assert checkpoints is not None
        return _write_step(
            checkpoints, step, [(model, tokenizer)], [optimizer], data, rng, [], [ref_model]
        )

    history: list[dict[str, float]] = []
    start = (
        evaluate_dpo(model, ref_model, tokenizer, eval_dataset, config)
        if eval_dataset and first == 1
        else {}
    )
    with _stop_on_ctrl_c(checkpoints) as stop:
        for step in range(first, config.num_steps + 1):
            part = data.next_batch(config.batch_size)
            batch = _dpo_batch(tokenizer, part, config, _device_of(model))
            optimizer.zero_grad(set_to_none=True)
            sums: dict[str, float] = {}
            micro = None if config.micro_batch_size is None else 2 * config.micro_batch_size
            for chunk in prompt_chunks(batch, micro):
                loss, m = _dpo_chunk(model, ref_model, batch, chunk, config)
                weight = (chunk.stop - chunk.start) / len(part)
                (loss * weight).backward()
                for k, v in {"loss": float(loss.detach()), **m}.items():
                    sums[k] = sums.get(k, 0.0) + v * weight
            row: dict[str, float] = {
                "step": step,
                **sums,
                "grad_norm": _step(model, optimizer, config.max_grad_norm),
            }
            if step == 1:
                row.update({f"{k}_start": v for k, v in start.items()})
            if eval_dataset and (
                step == config.num_steps or (config.eval_every and step % config.eval_every == 0)
            ):
                row.update(evaluate_dpo(model, ref_model, tokenizer, eval_dataset, config))
            history.append(row)
            if on_step is not None:
                on_step(row)
            _after_step(checkpoints, stop, step, config.num_steps, save)
    return history


# --------------------------------------------------------------------------- MADPO


@dataclass(frozen=True)
class JointPreferencePairs:
    """``P`` (chosen, rejected) joint-action pairs of one rollout, as text and tensors.

    Attributes:
        examples: ``P`` task examples, the one each pair answers.
        prompts: ``[P][A]`` each agent's prompt.
        chosen: ``[P][A]`` each agent's completion text in the chosen joint action.
        rejected: ``[P][A]`` same, rejected joint action.
        chosen_reward: ``[P]`` float32 joint rewards of the chosen joint actions.
        rejected_reward: ``[P]`` float32, rejected.
        batches: per agent a :class:`PolicyBatch` of ``2P`` rows, group size 2: row ``2p``
            is the agent's part of pair ``p``'s chosen joint action, ``2p + 1`` rejected.
    """

    examples: tuple[Mapping[str, Any], ...]
    prompts: tuple[tuple[str, ...], ...]
    chosen: tuple[tuple[str, ...], ...]
    rejected: tuple[tuple[str, ...], ...]
    chosen_reward: torch.Tensor
    rejected_reward: torch.Tensor
    batches: tuple[PolicyBatch, ...] = field(repr=False)

    def __len__(self) -> int:
        return len(self.examples)


def preference_pairs(
    ro: Rollout, *, min_gap: float = 0.0, pairs_per_prompt: int = 1
) -> JointPreferencePairs:
    """Pair the joint actions of a single-turn rollout by reward gap
    (:func:`~comlrl.algos.functional.preference_losses.select_preference_pairs` on turn 0's
    ``[N, K]`` rewards) and gather each agent's rows of the pairs.

    Raises:
        ValueError: the rollout has more than one turn (MADPO pairs single-turn joint
            actions; multi-turn trees are not paired here).
    """
    if len(ro.turns) != 1:
        raise ValueError(f"preference_pairs needs a single-turn rollout, got {len(ro.turns)} turns")
    turn = ro.turns[0]
    prompt, chosen, rejected = select_preference_pairs(
        turn.rewards, min_gap=min_gap, pairs_per_prompt=pairs_per_prompt
    )
    batches, prompts, chosen_txt, rejected_txt = [], [], [], []
    for a, samples in enumerate(turn.agents):
        b = samples.batch
        g = b.group_size
        comp = turn.joint_index[:, a]
        rows = torch.stack([prompt * g + comp[chosen], prompt * g + comp[rejected]], dim=1).reshape(
            -1
        )
        rows = rows.to(b.input_ids.device)
        batches.append(
            PolicyBatch(
                b.input_ids[rows],
                b.attention_mask[rows],
                b.completion_mask[rows],
                b.behaviour_logprobs[rows],
                2,
            )
        )
    for n, kc, kr in zip(prompt.tolist(), chosen.tolist(), rejected.tolist(), strict=True):
        agents = turn.agents
        prompts.append(tuple(s.prompts[n] for s in agents))
        chosen_txt.append(
            tuple(s.completions[n][int(turn.joint_index[kc, a])].text for a, s in enumerate(agents))
        )
        rejected_txt.append(
            tuple(s.completions[n][int(turn.joint_index[kr, a])].text for a, s in enumerate(agents))
        )
    node_example = turn.example_index[prompt]
    return JointPreferencePairs(
        examples=tuple(ro.examples[int(p)] for p in node_example),
        prompts=tuple(prompts),
        chosen=tuple(chosen_txt),
        rejected=tuple(rejected_txt),
        chosen_reward=turn.rewards[prompt, chosen],
        rejected_reward=turn.rewards[prompt, rejected],
        batches=tuple(batches),
    )


@dataclass
class MADPORun:
    """What a MADPO run holds between steps (built by :func:`madpo_setup`)."""

    config: MADPOConfig
    agents: list[Any]
    ref_models: list[Any]
    env: Environment
    data: DataStream
    optimizers: list[torch.optim.Optimizer]
    sampling: SamplingParams
    tree: TreeSettings
    rng: random.Random
    eval_pairs: JointPreferencePairs | None = None
    eval_data: Sequence[Mapping[str, Any]] | None = None
    step: int = 0


def madpo_setup(
    agents: Sequence[Any],
    config: MADPOConfig,
    env: Environment,
    dataset: Sequence[Mapping[str, Any]],
    eval_dataset: Sequence[Mapping[str, Any]] | None = None,
    *,
    ref_models: Sequence[Any] | None = None,
) -> MADPORun:
    """Check agents, environment and config; freeze a reference model per agent; build
    optimizers; and, with an ``eval_dataset``, sample held-out pairs once from the initial
    policies (:func:`madpo_pair_metrics` measures their margin as training goes).

    ``ref_models`` defaults to a deep copy of each agent's model, made here, once; an
    entry ``None`` makes that agent's loss reference-free (``log pi_ref = 0``).

    Raises:
        ConfigError: agent counts disagree, agents share one model object (each agent
            needs its own parameters and optimizer), a multi-turn environment limit below
            1, an empty dataset, or ``ref_models`` of the wrong length.
    """
    n = len(agents)
    if n != config.num_agents or env.num_agents != n:
        raise ConfigError(
            f"{n} agents, config.num_agents={config.num_agents}, task for {env.num_agents} agents; make them agree."
        )
    if len({id(a.model) for a in agents}) != n:
        raise ConfigError(
            "MADPO agents share a model object; give each agent its own model (e.g. load it twice)."
        )
    if ref_models is not None and len(ref_models) != n:
        raise ConfigError(
            f"{len(ref_models)} reference models for {n} agents; give one per agent or None."
        )
    try:
        data = DataStream(dataset, seed=config.seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    optimizers = []
    for i, agent in enumerate(agents):
        agent.model.to(device).train()
        if hasattr(agent, "seed"):
            agent.seed(config.seed * 1_000_003 + i)
        optimizers.append(
            build_optimizer(
                [p for p in agent.model.parameters() if p.requires_grad],
                config.optimizer,
                lr=config.learning_rate,
                weight_decay=config.weight_decay,
            )
        )
    refs = [copy.deepcopy(a.model) for a in agents] if ref_models is None else list(ref_models)
    for ref in refs:
        if ref is not None:  # None: no reference for that agent (log pi_ref = 0)
            ref.to(device).eval().requires_grad_(False)
    run = MADPORun(
        config=config,
        agents=list(agents),
        ref_models=refs,
        env=env,
        data=data,
        optimizers=optimizers,
        sampling=SamplingParams(
            num_generations=config.num_candidates,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
        ),
        tree=TreeSettings(num_turns=1, joint_mode=config.joint_mode),
        rng=random.Random(config.seed),
        eval_data=list(eval_dataset) if eval_dataset is not None else None,
    )
    if run.eval_data:
        ro = rollout(
            run.agents,
            run.eval_data,
            env,
            run.sampling,
            run.tree,
            rng=random.Random(config.seed + 1),
        )
        run.eval_pairs = preference_pairs(
            ro, min_gap=config.min_gap, pairs_per_prompt=config.pairs_per_prompt
        )
    return run


def _pair_logps(model: Any, batch: PolicyBatch, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if model is None:  # no reference model (reference-free DPO): log pi_ref = 0
        zeros = torch.zeros(batch.input_ids.shape[0] // 2, device=batch.input_ids.device)
        return zeros, zeros
    batch = batch.to(_device_of(model))
    with torch.set_grad_enabled(grad), sampling_mode(model):  # no dropout, as sampled
        seq, _ = sequence_logprobs(model, batch)
    return seq[0::2], seq[1::2]


def madpo_pair_metrics(run: MADPORun, pairs: JointPreferencePairs) -> dict[str, float]:
    """MADPO loss, joint margin (nats) and accuracy of the current policies on ``pairs``,
    without gradients (see :func:`~comlrl.algos.functional.preference_losses.multi_agent_dpo_loss`).
    Returns ``{}`` for no pairs."""
    if len(pairs) == 0:
        return {}
    parts = []
    for a, agent in enumerate(run.agents):
        was_training = agent.model.training
        agent.model.eval()
        try:
            parts.append(
                (
                    *_pair_logps(agent.model, pairs.batches[a], False),
                    *_pair_logps(run.ref_models[a], pairs.batches[a], False),
                )
            )
        finally:
            agent.model.train(was_training)
    stacked = [torch.stack([p[i].cpu() for p in parts]) for i in range(4)]
    losses, m = multi_agent_dpo_loss(*stacked, beta=run.config.beta)
    return {"loss": float(losses.mean()), **m}


def madpo_step(run: MADPORun) -> dict[str, float]:
    """One MADPO step: sample ``K`` candidates per agent for ``batch_size`` prompts, score
    the joint actions, pair them by reward gap, and step every agent on its own term of
    :func:`~comlrl.algos.functional.preference_losses.multi_agent_dpo_loss`.

    Every agent's log-probs keep their graph until the joint loss is formed (``A`` graphs
    at once; use fewer prompts per step for large models). A step whose prompts give no
    pair (every joint action ties or gaps are below ``min_gap``) samples and logs but
    takes no optimizer step (``num_pairs = 0``).

    Returns:
        The metrics row: ``reward_mean``/``reward_max`` of all sampled joint actions,
        ``num_pairs``, ``reward_gap_mean``, and with pairs ``loss``, ``loss/agent_<i>``,
        ``margin`` (mean joint log-ratio margin before the step, nats), ``accuracy``,
        ``margin/agent_<i>``, ``grad_norm/agent_<i>``.
    """
    cfg = run.config
    examples = run.data.next_batch(cfg.batch_size)
    ro = rollout(run.agents, examples, run.env, run.sampling, run.tree, rng=run.rng)
    pairs = preference_pairs(ro, min_gap=cfg.min_gap, pairs_per_prompt=cfg.pairs_per_prompt)
    rewards = ro.turns[0].rewards
    run.step += 1
    row: dict[str, float] = {
        "step": run.step,
        "reward_mean": float(rewards.mean()),
        "reward_max": float(rewards.max()),
        "num_pairs": len(pairs),
    }
    if len(pairs) == 0:
        return row
    row.update(madpo_update(run, pairs))
    return row


def madpo_update(run: MADPORun, pairs: JointPreferencePairs) -> dict[str, float]:
    """One optimizer step of every agent on its own term of
    :func:`~comlrl.algos.functional.preference_losses.multi_agent_dpo_loss` over ``pairs`` (``P >= 1``
    pairs from any source: :func:`madpo_step`'s rollout, or pairs built elsewhere, e.g.
    against a comparator policy).

    Returns:
        ``reward_gap_mean``, ``loss``, ``loss/agent_<i>``, ``margin``, ``accuracy``,
        ``margin/agent_<i>``, ``grad_norm/agent_<i>`` (see :func:`madpo_step`).

    Raises:
        ValueError: ``pairs`` is empty.
    """
    if len(pairs) == 0:
        raise ValueError("madpo_update needs at least one preference pair, got 0")
    cfg = run.config
    row: dict[str, float] = {}
    row["reward_gap_mean"] = float((pairs.chosen_reward - pairs.rejected_reward).mean())
    parts = []
    for a, agent in enumerate(run.agents):
        chosen, rejected = _pair_logps(agent.model, pairs.batches[a], True)
        ref_c, ref_r = _pair_logps(run.ref_models[a], pairs.batches[a], False)
        parts.append((chosen, rejected, ref_c.to(chosen.device), ref_r.to(chosen.device)))
    # Agents may sit on different devices: the cross-agent sums are detached, so gather
    # the per-agent rows on the first agent's device.
    dev = parts[0][0].device
    stacked = [torch.stack([p[i].to(dev) for p in parts]) for i in range(4)]
    losses, metrics = multi_agent_dpo_loss(*stacked, beta=cfg.beta)
    for opt in run.optimizers:
        opt.zero_grad(set_to_none=True)
    losses.sum().backward()  # agent i's parameters only see L_i
    for a, agent in enumerate(run.agents):
        row[f"grad_norm/agent_{a}"] = _step(agent.model, run.optimizers[a], cfg.max_grad_norm)
        row[f"loss/agent_{a}"] = float(losses[a].detach())
    row["loss"] = float(losses.detach().mean())
    row.update(metrics)
    return row


def madpo_evaluate(run: MADPORun) -> dict[str, float]:
    """Held-out metrics: the mean reward of ``eval_num_samples`` sampled joint actions per
    held-out prompt (:func:`comlrl.algos.rollout.evaluate.evaluate`), and the MADPO loss, margin
    and accuracy on the held-out pairs sampled at setup. ``{}`` without an eval set."""
    from comlrl.algos.rollout import evaluate as evaluation

    if not run.eval_data:
        return {}
    cfg = run.config
    params = SamplingParams(
        num_generations=cfg.eval_num_samples,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
    )
    row, _ = evaluation.evaluate(
        run.agents,
        run.env,
        run.eval_data,
        params,
        run.tree,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
    )
    out = {"eval/reward_mean": float(row["reward_mean"])}
    if run.eval_pairs is not None:
        out.update({f"eval/{k}": v for k, v in madpo_pair_metrics(run, run.eval_pairs).items()})
    return out


def madpo_checkpoint(run: MADPORun, checkpoints: StepCheckpoints) -> Path:
    """Write ``checkpoints.output_dir/checkpoints/step-N`` for the run's step, atomically
    (:class:`StepCheckpoints`): every agent's weights, optimizers, the data stream, the
    run's, torch's, Python's and each agent's random streams, and a fingerprint of the
    frozen reference models (not saved: :func:`madpo_setup` rebuilds them from the initial
    weights). Prunes to ``checkpoints.keep_last``; returns the folder."""
    return _write_step(
        checkpoints,
        run.step,
        [(a.model, a.tokenizer) for a in run.agents],
        run.optimizers,
        run.data,
        run.rng,
        [getattr(a, "generator", None) for a in run.agents],
        run.ref_models,
    )


def madpo_resume(run: MADPORun, path: str | Path, output_dir: str | Path | None = None) -> int:
    """Put a freshly set-up ``run`` (:func:`madpo_setup` on the initial weights) back at the
    step checkpoint ``path`` of :func:`madpo_checkpoint` and return its step;
    :func:`train_madpo` then continues as if never stopped. With ``output_dir``, its
    ``metrics.jsonl`` is cut back to the step and half-written checkpoints are removed.

    Raises:
        CheckpointError: the checkpoint is incomplete, does not fit the run (agents,
            optimizers), or the reference models differ from the saved run's.
    """
    run.step = _read_step(
        path,
        Path(output_dir) if output_dir is not None else None,
        [a.model for a in run.agents],
        run.optimizers,
        run.data,
        run.rng,
        [getattr(a, "generator", None) for a in run.agents],
        run.ref_models,
    )
    return run.step


def train_madpo(
    run: MADPORun,
    *,
    on_step: Callable[[dict[str, float]], None] | None = None,
    checkpoints: StepCheckpoints | None = None,
) -> list[dict[str, float]]:
    """Run :func:`madpo_step` s up to ``config.num_steps`` (from ``run.step``: a run put
    back by :func:`madpo_resume` continues); :func:`madpo_evaluate` before the first
    (``*_start`` keys on row 1), every ``eval_every`` steps and after the last.
    ``on_step(row)``, when given, receives each finished row as it is made. With
    ``checkpoints``: step checkpoints (:func:`madpo_checkpoint`) as it says, Ctrl-C stops
    at a step boundary, and ``checkpoints.resume_from`` is loaded first (when
    ``run.step`` is 0).

    Raises:
        CheckpointError: ``resume_from`` does not fit the run.
        TrainingInterrupted: Ctrl-C (with ``checkpoints``), after the checkpoint.
    """
    cfg = run.config
    if checkpoints is not None and checkpoints.resume_from is not None and run.step == 0:
        madpo_resume(run, checkpoints.resume_from, checkpoints.output_dir)
    start = madpo_evaluate(run) if run.step == 0 else {}
    history = []
    with _stop_on_ctrl_c(checkpoints) as stop:
        for _ in range(run.step, cfg.num_steps):
            row = madpo_step(run)
            if run.step == 1:
                row.update({f"{k}_start": v for k, v in start.items()})
            if run.step == cfg.num_steps or (cfg.eval_every and run.step % cfg.eval_every == 0):
                row.update(madpo_evaluate(run))
            history.append(row)
            if on_step is not None:
                on_step(row)
            _after_step(
                checkpoints,
                stop,
                run.step,
                cfg.num_steps,
                lambda: madpo_checkpoint(run, checkpoints),  # type: ignore[arg-type]
            )
    return history


# --------------------------------------------------------------------------- MARLHF


def format_joint_text(prompts: Sequence[str], completions: Sequence[str]) -> str:
    """The joint response the reward model reads: each agent's prompt and completion, in
    agent order, under ``[agent i]`` headers."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    return "\n".join(
        f"[agent {i + 1} prompt] {p}\n[agent {i + 1} response] {c}"
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    )


class JointRewardModel(nn.Module):
    """A scalar reward of a joint response: an LM backbone plus a linear head reading the
    hidden state of the last real token. The head starts at zero (every score 0, so the
    Bradley-Terry loss starts at ln 2).

    Args:
        backbone: a ``transformers`` causal LM or base model; its decoder (``base_model``)
            gives ``last_hidden_state [B, S, H]`` (the LM head is not run).
        freeze_backbone: train the head only.

    Raises:
        ValueError: the backbone's config has no ``hidden_size``.
    """

    def __init__(self, backbone: Any, *, freeze_backbone: bool = False) -> None:
        super().__init__()
        hidden = getattr(getattr(backbone, "config", None), "hidden_size", None)
        if hidden is None:
            raise ValueError(
                f"cannot read hidden_size from {type(backbone).__name__}.config; pass a transformers model"
            )
        self.backbone = getattr(backbone, "base_model", backbone)
        self.head = nn.Linear(int(hidden), 1)
        # A zero head scores every text 0: the Bradley-Terry loss starts at exactly ln 2
        # (chance) instead of at a random preference (a held-out loss of 0.91-0.97 with
        # std 1/sqrt(H) on stories260k); the first step's gradient reaches the head only.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        param = next(self.backbone.parameters())
        self.head.to(device=param.device, dtype=torch.float32)
        if freeze_backbone:
            self.backbone.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores ``[B]`` float32 of ``input_ids [B, S]`` (left or right padded;
        ``attention_mask [B, S]`` 1 on real tokens, at least one per row)."""
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state  # [B, S, H]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = (positions * attention_mask).argmax(dim=-1)  # index of the last real token
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        return self.head(pooled.float()).squeeze(-1)


def _encode_texts(
    tokenizer: Any, texts: Sequence[str], max_length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = [list(x)[-max_length:] for x in tokenizer(list(texts))["input_ids"]]
    width = max(len(x) for x in ids)
    out = torch.full((len(ids), width), int(pad), dtype=torch.int64)
    mask = torch.zeros((len(ids), width), dtype=torch.int64)
    for i, x in enumerate(ids):
        out[i, : len(x)] = torch.tensor(x, dtype=torch.int64)
        mask[i, : len(x)] = 1
    return out.to(device), mask.to(device)


def _pair_texts(pairs: Sequence[JointPreferencePairs]) -> list[tuple[str, str]]:
    return [
        (format_joint_text(pr, c), format_joint_text(pr, r))
        for ps in pairs
        for pr, c, r in zip(ps.prompts, ps.chosen, ps.rejected, strict=True)
    ]


def _bt_batch(
    model: JointRewardModel, tokenizer: Any, texts: Sequence[tuple[str, str]], max_length: int
) -> tuple[torch.Tensor, dict[str, float]]:
    flat = [t for pair in texts for t in pair]
    ids, mask = _encode_texts(tokenizer, flat, max_length, next(model.parameters()).device)
    scores = model(ids, mask)
    return bradley_terry_loss(scores[0::2], scores[1::2])


@torch.no_grad()
def evaluate_reward_model(
    model: JointRewardModel,
    tokenizer: Any,
    pairs: Sequence[JointPreferencePairs],
    config: RewardModelConfig,
) -> dict[str, float]:
    """Held-out Bradley-Terry ``eval/loss``, ``eval/accuracy`` (chosen scored higher) and
    ``eval/score_gap`` over ``pairs``, pair-weighted."""
    texts = _pair_texts(pairs)
    if not texts:
        raise ConfigError("no held-out pairs to evaluate the reward model on")
    was_training = model.training
    model.eval()
    sums = {"eval/loss": 0.0, "eval/accuracy": 0.0, "eval/score_gap": 0.0}
    try:
        for i in range(0, len(texts), config.batch_size):
            part = texts[i : i + config.batch_size]
            loss, m = _bt_batch(model, tokenizer, part, config.max_length)
            for key, value in (
                ("loss", float(loss)),
                ("accuracy", m["accuracy"]),
                ("score_gap", m["score_gap"]),
            ):
                sums[f"eval/{key}"] += value * len(part)
    finally:
        model.train(was_training)
    return {k: v / len(texts) for k, v in sums.items()}


def train_reward_model(
    model: JointRewardModel,
    tokenizer: Any,
    pairs: Sequence[JointPreferencePairs],
    config: RewardModelConfig,
    eval_pairs: Sequence[JointPreferencePairs] | None = None,
) -> list[dict[str, float]]:
    """Fit MARLHF's joint reward model with the Bradley-Terry loss
    (:func:`~comlrl.algos.functional.preference_losses.bradley_terry_loss`) on the joint texts
    (:func:`format_joint_text`) of ``pairs``: ``num_epochs`` seeded shuffled passes in
    batches of ``batch_size`` pairs.

    Returns:
        One row per optimizer step (``epoch``, ``loss``, ``accuracy``, ``score_gap``,
        ``grad_norm``); with ``eval_pairs``, :func:`evaluate_reward_model` before training
        (``*_start`` keys on row 1) and after each epoch.

    Raises:
        ConfigError: no training pairs.
    """
    texts = _pair_texts(pairs)
    if not texts:
        raise ConfigError(
            "no preference pairs to train the reward model on (every sampled group tied?)"
        )
    torch.manual_seed(config.seed)
    model.train()
    optimizer = build_optimizer(
        [p for p in model.parameters() if p.requires_grad],
        config.optimizer,
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
    )
    rng = random.Random(config.seed)
    start = evaluate_reward_model(model, tokenizer, eval_pairs, config) if eval_pairs else {}
    history: list[dict[str, float]] = []
    for epoch in range(1, config.num_epochs + 1):
        order = list(range(len(texts)))
        rng.shuffle(order)
        for i in range(0, len(order), config.batch_size):
            part = [texts[j] for j in order[i : i + config.batch_size]]
            optimizer.zero_grad(set_to_none=True)
            loss, m = _bt_batch(model, tokenizer, part, config.max_length)
            loss.backward()
            row: dict[str, float] = {"epoch": epoch, "loss": float(loss.detach()), **m}
            row["grad_norm"] = _step(model, optimizer, config.max_grad_norm)
            if not history:
                row.update({f"{k}_start": v for k, v in start.items()})
            history.append(row)
        if eval_pairs:
            history[-1].update(evaluate_reward_model(model, tokenizer, eval_pairs, config))
    model.eval()
    return history


class RewardModelReward:
    """A trained :class:`JointRewardModel` as a batched joint reward
    (:class:`comlrl.core.JointReward`): pass it as ``reward_func=`` to
    :class:`~comlrl.algos.MultiAgentTrainer` (or any recipe's environment).

    The agents' prompts come from ``prompts_of(example) -> A prompts`` (e.g. the task
    environment's ``root(example).prompts``, or the trainer's formatters), so the text the
    model scores is the one it was trained on (:func:`format_joint_text`).

    Args:
        model: the reward model (kept in eval mode; scored without gradients).
        tokenizer: its tokenizer.
        prompts_of: example -> the ``A`` agents' prompts.
        max_length: keep the last this many tokens.
        batch_size: joint texts per forward.
    """

    is_joint_reward = True

    def __init__(
        self,
        model: JointRewardModel,
        tokenizer: Any,
        prompts_of: Callable[[Mapping[str, Any]], Sequence[str]],
        *,
        max_length: int = 512,
        batch_size: int = 32,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.prompts_of = prompts_of
        self.max_length = max_length
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions (``completions``: ``A`` lists of ``K`` texts)."""
        texts = [
            format_joint_text(self.prompts_of(ex), [c[k] for c in completions])
            for k, ex in enumerate(examples)
        ]
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            ids, mask = _encode_texts(
                self.tokenizer, texts[i : i + self.batch_size], self.max_length, device
            )
            scores.extend(float(s) for s in self.model(ids, mask).cpu())
        return RewardBatch(scores)
