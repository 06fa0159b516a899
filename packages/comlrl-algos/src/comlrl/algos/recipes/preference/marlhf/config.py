"""MARLHF's configs: the joint reward model's training settings
(:class:`RewardModelConfig`) and the run config ``comlrl train algo=marlhf`` validates
(:class:`MARLHFRunConfig`: the RL phase's config plus how pairs are sampled and the reward
model is fit)."""

from __future__ import annotations

from typing import Any, Literal

from comlrl.algos.recipes.launch import (
    eval_on_start_follows,
)
from comlrl.algos.recipes.preference.config import ValidatedConfig
from comlrl.algos.training.config.rl import TrainConfig
from pydantic import Field, model_validator

__all__ = ["RewardModelConfig", "MARLHFRunConfig"]


class RewardModelConfig(ValidatedConfig):
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


class MARLHFRunConfig(TrainConfig):
    """MARLHF from the command line: :class:`~comlrl.algos.training.config.rl.TrainConfig` for the RL
    phase (MAGRPO by default, on the learned reward) plus how preference pairs are sampled
    and the joint reward model is fit (:class:`~comlrl.algos.MARLHFTrainer`).

    Attributes:
        reward_model: the reward model's backbone (None: agent 0's model).
        reward: the reward model's training settings
            (:class:`~comlrl.algos.recipes.preference.marlhf.config.RewardModelConfig`).
        num_candidates: ``K``, candidates per agent per prompt when sampling pairs (>= 2).
        min_gap: smallest task-reward gap that makes a pair.
        pairs_per_prompt: pairs kept per prompt, largest gap first.
        num_collect_batches: batches of ``batch_size`` prompts to sample pairs from.
        eval_fraction: share of the pair batches held out to evaluate the reward model.
        eval_every: as in ``TrainConfig``, but on by default (every 40 steps, and before
            the first step: ``eval_on_start``): the RL phase climbs the learned reward, and
            the evaluation rows (``eval.jsonl``) score the agents with the task's own reward
            on ``eval_split``, which says whether that helped.
    """

    output_dir: str = "runs/marlhf"
    eval_every: int = Field(40, ge=0)
    eval_on_start: bool = True
    reward_model: str | None = None
    reward: RewardModelConfig = Field(default_factory=lambda: RewardModelConfig(learning_rate=1e-3))
    num_candidates: int = Field(4, ge=2)
    min_gap: float = Field(0.0, ge=0)
    pairs_per_prompt: int = Field(1, ge=1)
    num_collect_batches: int = Field(8, ge=1)
    eval_fraction: float = Field(0.2, ge=0, lt=1)

    @model_validator(mode="before")
    @classmethod
    def _no_start_eval_when_off(cls, data: Any) -> Any:
        return eval_on_start_follows(data)
