"""Trainer objects of SFT and DPO (one model on offline rows): thin fronts over
:mod:`comlrl.algos.recipes.preference.supervised.recipe` that check their arguments and
config when built (before any model work) and call the recipe's loop in ``train``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.algos.recipes.preference.config import DPOConfig, SFTConfig
from comlrl.algos.recipes.preference.encoding import check_rows
from comlrl.algos.recipes.preference.inputs import check_config
from comlrl.algos.recipes.preference.supervised.recipe import evaluate_sft, train_dpo, train_sft
from comlrl.algos.training.config import ConfigError

__all__ = ["SFTTrainer", "DPOTrainer"]


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
