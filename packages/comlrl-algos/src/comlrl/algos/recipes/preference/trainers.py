"""Trainer objects for the preference recipes: thin fronts over
:mod:`comlrl.algos.recipes.preference`.

Each class checks its arguments and config when built (before any model work) and calls
the recipe's loop in :meth:`train`; the maths and the loops live in the recipe.

- :class:`SFTTrainer`, :class:`DPOTrainer`: one model on offline rows.
- :class:`MADPOTrainer`: ``A`` agents on a task (or CoMLRL's ``dataset`` + ``formatters``
  + ``reward_func`` form), pairs sampled online.
- :class:`MARLHFTrainer`: samples pairs like MADPO, fits a joint reward model, and hands
  it to an RL recipe as its reward function (:meth:`MARLHFTrainer.rl_trainer`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.algos.recipes.preference.config import DPOConfig, MADPOConfig, SFTConfig
from comlrl.algos.recipes.preference.encoding import check_rows
from comlrl.algos.recipes.preference.inputs import as_agents, check_config, environment
from comlrl.algos.recipes.preference.madpo.recipe import (
    madpo_checkpoint,
    madpo_evaluate,
    madpo_resume,
    madpo_setup,
    madpo_step,
    train_madpo,
)
from comlrl.algos.recipes.preference.supervised.recipe import evaluate_sft, train_dpo, train_sft
from comlrl.algos.training.config import ConfigError
from comlrl.core import Task

__all__ = [
    "SFTTrainer",
    "DPOTrainer",
    "MADPOTrainer",
]


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


class MADPOTrainer:
    """Multi-agent DPO (:func:`comlrl.algos.recipes.preference.madpo.recipe.madpo_step`): each step
    samples ``K`` candidates per agent, pairs joint actions by reward gap and steps every
    agent on its own term of the joint DPO loss, against a frozen reference per agent.

    Args:
        agents: ``A`` :class:`~comlrl.algos.HFAgent` s or ``(model, tokenizer)`` pairs,
            each with its own model object.
        config: a :class:`MADPOConfig`.
        task: a single-turn use of a :class:`comlrl.core.Task` (its ``train`` split unless
            ``dataset`` is given); or ``dataset`` + ``formatters`` + ``reward_func``.
        eval_dataset: held-out examples (reward and held-out pair margin).
        ref_models: one frozen reference per agent (default: copies made at setup).

    Raises:
        ConfigError: as :func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_setup`, or a
            missing task / formatters / reward function.
    """

    def __init__(
        self,
        agents: Sequence[Any],
        config: MADPOConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        ref_models: Sequence[Any] | None = None,
    ) -> None:
        check_config(config, MADPOConfig)
        self.config = config
        self.agents = as_agents(agents)
        self.env, data = environment(len(self.agents), task, dataset, formatters, reward_func)
        self.run = madpo_setup(
            self.agents, config, self.env, data, eval_dataset, ref_models=ref_models
        )

    def train_step(self) -> dict[str, float]:
        """One step; its metrics row."""
        return madpo_step(self.run)

    def evaluate(self) -> dict[str, float]:
        """Held-out reward and pair metrics."""
        return madpo_evaluate(self.run)

    def train(self, **outputs: Any) -> list[dict[str, float]]:
        """Run the steps up to ``config.num_steps`` (from the resumed step, if any);
        ``outputs`` (``output_dir``, ``save_every``, ``keep_last``, ``resume_from``,
        ``record``, ``progress``) as in
        :func:`~comlrl.algos.recipes.preference.madpo.recipe.train_madpo`."""
        return train_madpo(self.run, **outputs)

    def checkpoint(self, path: str | Path) -> Path:
        """Write a resumable step checkpoint now at ``path``
        (:func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_checkpoint`); returns it."""
        return madpo_checkpoint(self.run, path)

    def resume(self, checkpoint: str | Path, output_dir: str | Path | None = None) -> int:
        """Continue from a step checkpoint (agents, optimizers, data and random streams;
        :func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_resume`); returns its step. Build
        the trainer on the run's initial weights first: the reference models are copies
        of them.

        Raises:
            CheckpointError: the checkpoint is incomplete or does not fit this run.
        """
        return madpo_resume(self.run, checkpoint, output_dir)
