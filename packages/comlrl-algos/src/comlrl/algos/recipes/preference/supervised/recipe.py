"""SFT and DPO of one model on fixed rows, one class each, driven by the loop driver.

- :class:`SFTRecipe`: supervised fine-tuning on ``prompt``/``completion`` rows (token-mean
  NLL of the completion tokens only, :func:`~comlrl.estimators.preference_losses.sft_nll`);
  evaluation is the held-out NLL.
- :class:`DPORecipe`: DPO (Rafailov et al. 2023, eq. 7) on ``prompt``/``chosen``/``rejected``
  rows against a frozen reference model; evaluation is the held-out chosen-vs-rejected margin
  and accuracy.

Each constructor is the setup (rows checked, the model moved and given its optimizer, the
data stream seeded); :meth:`SFTRecipe.step` is one optimizer step on ``batch_size`` rows
(micro-batches weighted by their share of the batch, so the gradient equals the whole
batch's). :class:`SFTTrainer` and :class:`DPOTrainer` take a model and tokenizer.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from comlrl.algos.models.logprobs import prompt_chunks, sampling_mode
from comlrl.algos.recipes.launch import read_jsonl_rows
from comlrl.algos.recipes.preference.checkpoint import (
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
from comlrl.algos.recipes.preference.supervised.config import DPOConfig, SFTConfig
from comlrl.algos.records import PolicyBatch
from comlrl.algos.rollout.agent import as_agents
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.loop import Collective, Schedule, StepResult, run_loop
from comlrl.algos.training.run.checkpoint import streams_kept_on_failure
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.outputs import RunOutputs
from comlrl.algos.training.run.summary import loss_summary
from comlrl.estimators.preference_losses import dpo_loss, sft_nll

__all__ = ["SFTRecipe", "DPORecipe", "SFTTrainer", "DPOTrainer"]


class SFTRecipe:
    """Supervised fine-tuning of one model on ``prompt``/``completion`` rows: minimise
    :func:`~comlrl.estimators.preference_losses.sft_nll` (prompt tokens are not trained on).

    Each step takes ``config.batch_size`` rows in a seeded shuffled order. With an
    ``eval_dataset`` the held-out NLL (:meth:`evaluate`) is written to ``eval.jsonl`` before
    training (``step`` 0), every ``eval_every`` steps and at the end.

    Args:
        agents: one agent (an :class:`~comlrl.algos.HFAgent` or a ``(model, tokenizer)``
            pair).
        config: an :class:`~comlrl.algos.recipes.preference.supervised.config.SFTConfig`.
        dataset, eval_dataset: the training and held-out rows.
        outputs: where the run writes (default ``RunOutputs.of(config)``).
        record: what ``config.yaml`` holds (default ``algo`` and the config).

    Raises:
        ConfigError: a config of the wrong type, not one agent, a task or environment
            (these recipes train on rows), or rows without the string fields.
    """

    algo: ClassVar[str] = "sft"
    config_type: ClassVar[type[SFTConfig]] = SFTConfig

    def __init__(
        self,
        agents: Sequence[Any],
        config: SFTConfig,
        *,
        dataset: Sequence[Mapping[str, Any]],
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        outputs: RunOutputs | None = None,
        record: Mapping[str, Any] | None = None,
        task: Any = None,
        environment: Any = None,
    ) -> None:
        cls = self.config_type
        if not isinstance(config, cls):
            raise ConfigError(
                f"expected a {cls.__name__}, got {type(config).__name__}; build it with "
                f"{cls.__name__}.build(...)"
            )
        if task is not None or environment is not None:
            raise ConfigError(f"algo={self.algo} trains on rows (dataset=), not on a task.")
        agents = as_agents(agents)
        if len(agents) != 1:
            raise ConfigError(f"algo={self.algo} trains one model; {len(agents)} were given.")
        self.config = config
        self.agents = agents
        self.model, self.tokenizer = agents[0].model, agents[0].tokenizer
        what = self.algo.upper()
        self.rows = check_rows(dataset, config.row_keys, what)
        self.eval_rows = (
            check_rows(eval_dataset, config.row_keys, f"{what} evaluation")
            if eval_dataset is not None
            else None
        )
        self.outputs = outputs if outputs is not None else RunOutputs.of(config)
        self.record = self.outputs.record(
            record if record is not None else {"algo": self.algo, **config.model_dump()}
        )
        self.optimizer = prepare_training(self.model, config)  # seeds torch with config.seed
        self.data = DataStream(self.rows, seed=config.seed)
        self.rng = random.Random(config.seed)  # unused by SFT and DPO; every recipe saves one
        self.global_step = 0

    # --- what the launcher asks of the recipe (comlrl.algos.recipes.launch) ------------

    @classmethod
    def inputs(cls, config: Any) -> tuple[Any, list[Any], list[Any] | None]:
        """No task: the rows of ``config.data`` and ``config.eval_data``, read and checked,
        and the model name.

        Raises:
            ConfigError: no ``data``, an unreadable or malformed file, or a bad model name.
        """
        from comlrl.algos.training.config.task_setup import check_model_names
        from comlrl.algos.training.run.reporting import check_report_to

        what = cls.algo.upper()
        if config.data is None:
            raise ConfigError(
                f"algo={cls.algo} needs data=PATH.jsonl, a JSON-lines file with one "
                f"{config.row_example()} row per line (there is no built-in data set for it: "
                "the built-in coop_story task has seeds and a reward, not reference texts)"
            )
        check_report_to(config.report_to)
        rows = read_jsonl_rows(config.data, config.row_keys, what)
        held = (
            read_jsonl_rows(config.eval_data, config.row_keys, f"{what} evaluation")
            if config.eval_data
            else None
        )
        check_model_names(config.models)
        return None, rows, held

    @classmethod
    def describe(cls, config: Any) -> str:
        """``SFT on rows.jsonl, 100 steps of 8 rows``."""
        return (
            f"{cls.algo.upper()} on {config.data}, {config.num_steps} steps of "
            f"{config.batch_size} rows"
        )

    @classmethod
    def agent_options(cls, config: Any) -> dict[str, Any]:
        """The prompt format (the rows are tokenized as they are)."""
        return {"prompt_format": config.prompt_format}

    @property
    def output_dir(self) -> Path:
        """Where metrics, evaluation rows and checkpoints go."""
        return self.outputs.output_dir

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The one optimizer."""
        return [self.optimizer]

    # --- one step -----------------------------------------------------------------------

    def batch(self, rows: Sequence[Mapping[str, Any]]) -> PolicyBatch:
        """``rows`` tokenized: prompt + completion, the completion tokens masked in."""
        cfg = self.config
        return encode_completions(
            self.tokenizer,
            [r["prompt"] for r in rows],
            [r["completion"] for r in rows],
            add_eos=cfg.add_eos,
            max_prompt_length=cfg.max_prompt_length,
            max_completion_length=cfg.max_completion_length,
            device=model_device(self.model),
        )

    def step(self) -> StepResult:
        """One optimizer step on the next ``batch_size`` rows; the row holds ``loss`` (nats
        per completion token), ``grad_norm`` and ``num_tokens``."""
        cfg = self.config
        with streams_kept_on_failure(self.data, self.rng, []):
            batch = self.batch(self.data.next_batch(cfg.batch_size))
        total_tokens = float(batch.completion_mask.sum())
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for chunk in prompt_chunks(batch, cfg.micro_batch_size):
            _, tokens = sequence_logprobs(self.model, batch, chunk)
            mask = batch.completion_mask[chunk]
            loss = sft_nll(tokens, mask)
            weight = float(mask.sum()) / total_tokens
            (loss * weight).backward()
            loss_sum += float(loss.detach()) * weight
        norm = clipped_optimizer_step(self.model, self.optimizer, cfg.max_grad_norm)
        self.global_step += 1
        row = {"step": self.global_step, "loss": loss_sum, "grad_norm": norm}
        return StepResult({**row, "num_tokens": total_tokens})

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out token-mean NLL (nats per completion token) over the evaluation rows, in
        batches of ``config.batch_size``: ``{"eval/nll": ..., "eval/num_tokens": ...}``.

        Raises:
            ConfigError: no evaluation rows.
        """
        rows = self._eval_rows()
        was_training = self.model.training
        self.model.eval()
        total, count = 0.0, 0.0
        try:
            for i in range(0, len(rows), self.config.batch_size):
                batch = self.batch(rows[i : i + self.config.batch_size])
                _, tokens = sequence_logprobs(self.model, batch)
                total -= float(tokens.sum())
                count += float(batch.completion_mask.sum())
        finally:
            self.model.train(was_training)
        return {"eval/nll": total / count, "eval/num_tokens": count}

    def _eval_rows(self) -> list[Mapping[str, Any]]:
        if self.eval_rows is None:
            raise ConfigError(f"no eval_dataset was given to this {self.algo.upper()} run")
        return self.eval_rows

    # --- saving and resuming ------------------------------------------------------------

    def _references(self) -> list[Any]:
        return []

    def checkpoint(self, path: str | Path) -> Path:
        """Write the step checkpoint ``path``: the model, its optimizer, the data stream and
        random streams (and a fingerprint of DPO's reference); returns the folder."""
        return write_step_checkpoint(
            Path(path), self.global_step, [(self.model, self.tokenizer)], [self.optimizer],
            self.data, self.rng, [], self._references(),
        )  # fmt: skip

    def resume(self, path: str | Path) -> int:
        """Put the run back at the step checkpoint ``path`` (cut the logs in ``output_dir``
        back to its step) and return the step. Build the recipe on the run's initial
        weights first: DPO's reference is their copy.

        Raises:
            CheckpointError: the checkpoint is incomplete, does not fit this run, or the
                reference model's weights differ from the saved run's.
        """
        self.global_step = read_step_checkpoint(
            path, self.output_dir, [self.model], [self.optimizer], self.data, self.rng, [],
            self._references(),
        )  # fmt: skip
        return self.global_step

    def save_final(self, path: Path) -> None:
        """The model and tokenizer in ``path/agent_0`` (Hugging Face format)."""
        save_models(Path(path), [(self.model, self.tokenizer)])

    # --- the loop -----------------------------------------------------------------------

    def schedule(self) -> Schedule:
        """``num_steps``; evaluation before the first step, every ``eval_every`` steps and
        after the last, one row each in ``eval.jsonl``."""
        cfg = self.config
        return Schedule(
            num_steps=cfg.num_steps,
            evaluates=bool(self.eval_rows),
            eval_every=cfg.eval_every,
            eval_on_start=True,
            eval_at_end=True,
            desc=self.algo,
            prompts_per_step=cfg.batch_size,
            record=self.record,
            title=f"{cfg.data or 'rows'} - {cfg.models[0]} - {self.algo.upper()}",
        )

    def collective(self) -> Collective:
        """One process."""
        return Collective()

    def train(self) -> list[dict[str, float]]:
        """Run the steps up to ``config.num_steps`` under the loop driver (from the resumed
        step, if any); one metrics row per step. Writes ``metrics.jsonl``, ``eval.jsonl``,
        ``config.yaml``, step checkpoints and ``final/agent_0``; Ctrl-C or SIGTERM stops at
        a step boundary after a checkpoint.

        Raises:
            ConfigError: ``output_dir`` holds another run (without ``outputs.overwrite``).
            TrainingInterrupted: Ctrl-C or SIGTERM, after the checkpoint.
        """
        return run_loop(self, self.outputs)

    def summary(self, history: Sequence[Mapping[str, Any]]) -> str:
        """``done: N steps, loss first quarter a -> last quarter b (+d); outputs in ...``."""
        return loss_summary(history, self.output_dir)

    def close(self) -> None:
        """Nothing to release."""


class DPORecipe(SFTRecipe):
    """DPO (Rafailov et al. 2023, eq. 7) of one model on ``prompt``/``chosen``/``rejected``
    rows against ``ref_model`` (default: a frozen deep copy of the model made when the recipe
    is built). Each step takes ``config.batch_size`` pairs; chosen and rejected share one
    prompt forward (``G = 2``); micro-batches are weighted by their share of the pairs. The
    reference is not saved: on resume, build the recipe on the model as the run started (its
    copy is the reference) or the same ``ref_model``.

    Raises:
        ConfigError: as :class:`SFTRecipe`, or ``ref_model`` that is the model itself.
    """

    algo: ClassVar[str] = "dpo"
    config_type: ClassVar[type[SFTConfig]] = DPOConfig
    config: DPOConfig

    def __init__(
        self,
        agents: Sequence[Any],
        config: DPOConfig,
        *,
        dataset: Sequence[Mapping[str, Any]],
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        outputs: RunOutputs | None = None,
        record: Mapping[str, Any] | None = None,
        task: Any = None,
        environment: Any = None,
        ref_model: Any | None = None,
    ) -> None:
        super().__init__(
            agents, config, dataset=dataset, eval_dataset=eval_dataset, outputs=outputs,
            record=record, task=task, environment=environment,
        )  # fmt: skip
        if ref_model is self.model:
            raise ConfigError(
                "ref_model is the policy itself; pass a separate frozen copy or None (a copy "
                "is made)."
            )
        self.ref_model = copy.deepcopy(self.model) if ref_model is None else ref_model
        self.ref_model.to(model_device(self.model)).eval().requires_grad_(False)

    def batch(self, rows: Sequence[Mapping[str, Any]]) -> PolicyBatch:
        """``rows`` tokenized: each prompt with its chosen then rejected completion."""
        cfg = self.config
        return encode_completions(
            self.tokenizer,
            [r["prompt"] for r in rows],
            [text for r in rows for text in (r["chosen"], r["rejected"])],
            group_size=2,
            add_eos=cfg.add_eos,
            max_prompt_length=cfg.max_prompt_length,
            max_completion_length=cfg.max_completion_length,
            device=model_device(self.model),
        )

    def _loss(self, batch: PolicyBatch, chunk: slice) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        with sampling_mode(self.model):  # no dropout: at the reference the margin is exactly 0
            logp, _ = sequence_logprobs(self.model, batch, chunk)  # [2b]: chosen, rejected, ...
        with torch.no_grad():
            ref, _ = sequence_logprobs(self.ref_model, batch, chunk)
        return dpo_loss(
            logp[0::2],
            logp[1::2],
            ref[0::2],
            ref[1::2],
            beta=cfg.beta,
            label_smoothing=cfg.label_smoothing,
            loss_type=cfg.loss_type,
        )

    def step(self) -> StepResult:
        """One optimizer step on the next ``batch_size`` pairs; the row holds ``loss``,
        ``margin``, ``accuracy``, ``chosen_reward``, ``rejected_reward`` (the training
        batch, before the step) and ``grad_norm``."""
        cfg = self.config
        with streams_kept_on_failure(self.data, self.rng, []):
            part = self.data.next_batch(cfg.batch_size)
            batch = self.batch(part)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        micro = None if cfg.micro_batch_size is None else 2 * cfg.micro_batch_size
        for chunk in prompt_chunks(batch, micro):
            loss, m = self._loss(batch, chunk)
            weight = (chunk.stop - chunk.start) / len(part)
            (loss * weight).backward()
            for k, v in {"loss": float(loss.detach()), **m}.items():
                sums[k] = sums.get(k, 0.0) + v * weight
        norm = clipped_optimizer_step(self.model, self.optimizer, cfg.max_grad_norm)
        self.global_step += 1
        return StepResult({"step": self.global_step, **sums, "grad_norm": norm})

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out DPO metrics: pair-weighted means of ``eval/loss``, ``eval/margin`` (the
        log-ratio margin ``h`` in nats; 0 when the policy is the reference) and
        ``eval/accuracy`` (fraction with ``h > 0``).

        Raises:
            ConfigError: no evaluation rows.
        """
        rows = self._eval_rows()
        was_training = self.model.training
        self.model.eval()
        sums = {"eval/loss": 0.0, "eval/margin": 0.0, "eval/accuracy": 0.0}
        try:
            for i in range(0, len(rows), self.config.batch_size):
                part = rows[i : i + self.config.batch_size]
                loss, m = self._loss(self.batch(part), slice(0, len(part)))
                sums["eval/loss"] += float(loss) * len(part)
                sums["eval/margin"] += m["margin"] * len(part)
                sums["eval/accuracy"] += m["accuracy"] * len(part)
        finally:
            self.model.train(was_training)
        return {k: v / len(rows) for k, v in sums.items()}

    def _references(self) -> list[Any]:
        return [self.ref_model]


class SFTTrainer(SFTRecipe):
    """:class:`SFTRecipe` of ``model`` and ``tokenizer``."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: SFTConfig,
        *,
        dataset: Sequence[Mapping[str, Any]],
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        outputs: RunOutputs | None = None,
    ) -> None:
        super().__init__(
            [(model, tokenizer)], config, dataset=dataset, eval_dataset=eval_dataset,
            outputs=outputs,
        )  # fmt: skip


class DPOTrainer(DPORecipe):
    """:class:`DPORecipe` of ``model`` and ``tokenizer`` (``ref_model``: the frozen
    reference, default a copy of ``model``)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: DPOConfig,
        *,
        dataset: Sequence[Mapping[str, Any]],
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        ref_model: Any | None = None,
        outputs: RunOutputs | None = None,
    ) -> None:
        super().__init__(
            [(model, tokenizer)], config, dataset=dataset, eval_dataset=eval_dataset,
            ref_model=ref_model, outputs=outputs,
        )  # fmt: skip
