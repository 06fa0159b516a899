"""MARLHF's config (:class:`MARLHFConfig`): the group-baseline config of its RL phase with a
``reward_model`` section (:class:`RewardModelConfig`: the backbone, how pairs are sampled
and how the joint reward model is fit) and an optional ``iterative`` section (MARLHF-Iter's
rounds)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from comlrl.algos.recipes.preference.config import (
    IterativeSection,
    ValidatedConfig,
    gather_section,
)
from comlrl.algos.training.config.rl import TrainConfig
from pydantic import Field, model_validator

__all__ = ["RewardModelConfig", "MARLHFConfig"]

#: the keys of :class:`RewardModelConfig` that a MARLHF config once held flat, by their
#: old name (``num_candidates`` is now ``reward_model.num_generations``)
_FLAT_REWARD_KEYS = {
    "num_candidates": "num_generations",
    "min_gap": "min_gap",
    "pairs_per_prompt": "pairs_per_prompt",
    "num_collect_batches": "num_collect_batches",
    "eval_fraction": "eval_fraction",
    "scoring_reward": "scoring_reward",
}


class RewardModelConfig(ValidatedConfig):
    """MARLHF's joint reward model: its backbone, the preference pairs it is fit on, and
    how it is fit (the Bradley-Terry loss).

    Attributes:
        model: the backbone (HF id, path or built-in name; ``None``: agent 0's model).
        num_generations: ``K``, candidates per agent per prompt when sampling pairs (>= 2
            for MARLHF; MARLHF-Iter: current candidates per prompt in a round, >= 1).
        min_gap: smallest task-reward gap that makes a pair.
        pairs_per_prompt: pairs kept per prompt, largest gap first (MARLHF-Iter:
            current-vs-comparator pairs).
        num_collect_batches: batches of ``batch_size`` prompts to sample pairs from.
        eval_fraction: share of the pair batches held out to evaluate the reward model.
        scoring_reward: MARLHF-Iter: ``task`` (pairs ordered by the task reward) or
            ``reward_model`` (by the previous round's reward model; round 0 has none and
            uses the task's).
        learning_rate: per optimizer step.
        num_epochs: passes over the training pairs.
        batch_size: pairs per optimizer step.
        max_length: keep the last this many tokens of each joint text (the head reads
            the last one).
        freeze_backbone: train the linear head only.
    """

    model: str | None = None
    num_generations: int = Field(4, ge=1)
    min_gap: float = Field(0.0, ge=0)
    pairs_per_prompt: int = Field(1, ge=1)
    num_collect_batches: int = Field(8, ge=1)
    eval_fraction: float = Field(0.2, ge=0, lt=1)
    scoring_reward: Literal["task", "reward_model"] = "task"
    learning_rate: float = Field(1e-4, gt=0)
    optimizer: Literal["adamw", "radam", "sgd"] = "adamw"
    weight_decay: float = Field(0.0, ge=0)
    num_epochs: int = Field(1, ge=1)
    batch_size: int = Field(8, ge=1)
    max_length: int = Field(512, ge=2)
    max_grad_norm: float | None = Field(1.0, gt=0)
    freeze_backbone: bool = False
    seed: int = 0


class MARLHFConfig(TrainConfig):
    """MARLHF: :class:`~comlrl.algos.training.config.rl.TrainConfig` for the RL phase
    (MAGRPO by default, on the learned reward) plus the reward model (the ``reward_model``
    section) and, for MARLHF-Iter, its rounds (the ``iterative`` section).

    Keys of the sections that were once flat still resolve (``num_collect_batches=4`` is
    ``reward_model.num_collect_batches=4``, ``num_candidates`` is
    ``reward_model.num_generations``, ``reward_model=NAME`` is ``reward_model.model=NAME``,
    ``reward.learning_rate`` is ``reward_model.learning_rate``, ``steps_per_round`` is
    ``iterative.steps_per_round``).

    Attributes:
        reward_model: the reward model (:class:`RewardModelConfig`; its learning rate
            defaults to 1e-3 here).
        iterative: MARLHF-Iter's rounds (single-turn, ``joint_mode=align``): each round's
            comparator pairs refit the reward model from its initial weights, then
            ``steps_per_round`` RL steps climb it. ``None``: MARLHF (one fit, then RL).
        eval_every: as in ``TrainConfig``, but on by default (every 40 steps, and before
            the first step: ``eval_on_start``): the RL phase climbs the learned reward, and
            the evaluation rows (``eval.jsonl``) score the agents with the task's own reward
            on ``eval_split``, which says whether that helped.
    """

    #: former keys that resolve to today's (``num_collect_batches`` ->
    #: ``reward_model.num_collect_batches``, ``steps_per_round`` -> ``iterative.steps_per_round``)
    moved_keys: ClassVar[dict[str, str]] = {
        "reward": "reward_model",
        **{old: f"reward_model.{new}" for old, new in _FLAT_REWARD_KEYS.items()},
        **{k: f"iterative.{k}" for k in IterativeSection.model_fields},
    }
    output_dir: str = "runs/marlhf"
    eval_every: int = Field(40, ge=0)
    eval_on_start: bool = True
    reward_model: RewardModelConfig = Field(
        default_factory=lambda: RewardModelConfig(learning_rate=1e-3)
    )
    iterative: IterativeSection | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "eval_on_start" not in data:  # eval_every=0 turns the start evaluation off too
            try:
                if int(data.get("eval_every", 1)) == 0:
                    data["eval_on_start"] = False
            except (TypeError, ValueError):
                pass  # the field's own check reports it
        section = data.get("reward_model")
        section = {"model": section} if isinstance(section, str) or section is None else section
        if isinstance(section, dict):
            section = dict(section)
            moved = dict(data.pop("reward", None) or {})
            moved.update(
                {new: data.pop(old) for old, new in _FLAT_REWARD_KEYS.items() if old in data}
            )
            for key, value in moved.items():
                if key in section and section[key] != value:
                    raise ValueError(
                        f"{key}={value!r} and reward_model.{key}={section[key]!r} disagree; "
                        f"give reward_model.{key} only"
                    )
                section[key] = value
            if "learning_rate" not in section:
                section["learning_rate"] = 1e-3
            data["reward_model"] = section
        return gather_section(data, "iterative", IterativeSection)

    @model_validator(mode="after")
    def _marlhf_consistent(self) -> MARLHFConfig:
        if self.iterative is None:
            if self.reward_model.num_generations < 2:
                raise ValueError(
                    f"reward_model.num_generations={self.reward_model.num_generations}: MARLHF "
                    "pairs the candidates of a prompt, so it needs at least 2"
                )
            return self
        if self.joint_mode != "align":
            raise ValueError(
                f"joint_mode={self.joint_mode!r}: the rounds compare current and comparator "
                "joint actions index by index; set joint_mode=align"
            )
        if self.num_turns != 1:
            raise ValueError(f"MARLHF-Iter is single-turn; got num_turns={self.num_turns}")
        return self

    @property
    def backbone(self) -> str:
        """The reward model's backbone: ``reward_model.model``, else agent 0's model."""
        return self.reward_model.model or self.model_for(0)
