"""The iterative preference recipes' configs: the rounds (:class:`IterativeSection`),
MADPO-Iter's library config (:class:`IterativeMADPOConfig`) and the run configs
``comlrl train algo=madpo_iter|marlhf_iter`` validates (:class:`MADPOIterRunConfig`,
:class:`MARLHFIterRunConfig`)."""

from __future__ import annotations

from typing import Any, Literal

from comlrl.algos.recipes.launch import (
    eval_on_start_follows,
)
from comlrl.algos.recipes.preference.config import ValidatedConfig
from comlrl.algos.recipes.preference.madpo.config import MADPOConfig, MADPORunConfig
from comlrl.algos.recipes.preference.marlhf.config import RewardModelConfig
from comlrl.algos.training.config.rl import TrainConfig
from pydantic import Field, model_validator

__all__ = ["IterativeSection", "IterativeMADPOConfig", "MADPOIterRunConfig", "MARLHFIterRunConfig"]


class IterativeSection(ValidatedConfig):
    """The rounds of iterative preference refresh (MADPO-Iter, MARLHF-Iter;
    :mod:`comlrl.algos.recipes.preference.iterative.replay`). A run of ``num_steps`` optimizer
    steps is ``ceil(num_steps / steps_per_round)`` rounds; each round first samples
    ``round_prompts`` prompts' candidates from the current and the comparator policy and
    pairs them, then trains ``steps_per_round`` steps.

    Attributes:
        steps_per_round: optimizer steps per round.
        round_prompts: prompts sampled per round (``None``: ``batch_size * steps_per_round``).
        comparator: ``current`` / ``current_copy`` (the current agents), ``model``
            (frozen ``comparator_models``), ``history`` (the policy
            ``comparator_history_k`` rounds ago) or ``api`` (a model served at
            ``comparator_api_url``); see :mod:`comlrl.algos.recipes.preference.iterative.comparator`.
        comparator_models: ``comparator="model"``: one model for every agent or one per agent.
        comparator_num_candidates: ``K'`` comparator candidates per prompt (``None``: ``K``).
        comparator_history_k: ``comparator="history"``: rounds back (1: the current policy).
        comparator_api_url, comparator_api_format, comparator_api_model,
            comparator_api_key_env: ``comparator="api"``: the endpoint, its request format
            (``generic``, ``openai_chat``, ``anthropic_messages``, ``openai_responses``),
            the served model's name and the environment variable holding the API key
            (:mod:`comlrl.algos.recipes.preference.iterative.api_comparator`).
        pair_selection: order of a prompt's pairs before ``pairs_per_prompt`` cuts:
            ``comparator_reward`` (highest comparator reward first), ``reward_gap``,
            ``random``, ``all``.
        replay_mode: the round's training pairs: ``current`` (this round's), ``nearest_k``
            (a draw from the last ``replay_k`` rounds), ``all_history``, ``lambda_decay``
            (rounds weighted ``(1 - replay_lambda) * replay_lambda**age``).
        replay_k, replay_lambda: for ``nearest_k`` / ``lambda_decay`` only.
        replay_sample_size: pairs drawn per round by the replay modes other than
            ``current`` (``None``: as many as this round generated).
        replay_dir: a folder for every round's pairs (``iteration_XXXX.json``, read back
            when a draw picks that round; :mod:`comlrl.algos.recipes.preference.iterative.replay_shards`);
            ``None`` keeps them in memory.
    """

    steps_per_round: int = Field(4, ge=1)
    round_prompts: int | None = Field(None, ge=1)
    comparator: Literal["current", "current_copy", "model", "history", "api"] = "current"
    comparator_models: list[str] | None = None
    comparator_num_candidates: int | None = Field(None, ge=1)
    comparator_history_k: int = Field(1, ge=1)
    comparator_api_url: str | None = None
    comparator_api_format: Literal[
        "generic", "openai_chat", "anthropic_messages", "openai_responses"
    ] = "generic"
    comparator_api_model: str | None = None
    comparator_api_key_env: str | None = None
    pair_selection: Literal["comparator_reward", "reward_gap", "random", "all"] = (
        "comparator_reward"
    )
    replay_mode: Literal["current", "nearest_k", "all_history", "lambda_decay"] = "current"
    replay_k: int | None = Field(None, ge=1)
    replay_lambda: float | None = Field(None, ge=0, le=1)
    replay_sample_size: int | None = Field(None, ge=1)
    replay_dir: str | None = None

    @model_validator(mode="after")
    def _fields_of_their_modes(self) -> IterativeSection:
        mode = self.replay_mode
        if mode == "nearest_k" and self.replay_k is None:
            raise ValueError("replay_mode='nearest_k' needs replay_k >= 1")
        if mode != "nearest_k" and self.replay_k is not None:
            raise ValueError(f"replay_k={self.replay_k} needs replay_mode='nearest_k'")
        if mode == "lambda_decay" and self.replay_lambda is None:
            raise ValueError("replay_mode='lambda_decay' needs replay_lambda in [0, 1]")
        if mode != "lambda_decay" and self.replay_lambda is not None:
            raise ValueError(f"replay_lambda={self.replay_lambda} needs replay_mode='lambda_decay'")
        if mode == "current" and self.replay_sample_size is not None:
            raise ValueError(
                f"replay_sample_size={self.replay_sample_size} is read by the replay modes "
                "other than 'current'; drop it or pick one"
            )
        if (self.comparator == "model") != (self.comparator_models is not None):
            raise ValueError(
                "comparator='model' needs comparator_models=[NAME] (one, or one per agent), "
                f"and only it reads them (comparator={self.comparator!r}, "
                f"comparator_models={self.comparator_models!r})"
            )
        if (self.comparator == "api") != (self.comparator_api_url is not None):
            raise ValueError(
                "comparator='api' needs comparator_api_url=URL, and only it reads it "
                f"(comparator={self.comparator!r}, comparator_api_url={self.comparator_api_url!r})"
            )
        if self.comparator != "history" and self.comparator_history_k != 1:
            raise ValueError(
                f"comparator_history_k={self.comparator_history_k} needs comparator='history'"
            )
        return self

    def num_rounds(self, num_steps: int) -> int:
        """Rounds of a run of ``num_steps`` steps."""
        return -(-num_steps // self.steps_per_round)


class IterativeMADPOConfig(MADPOConfig, IterativeSection):
    """MADPO-Iter: :class:`MADPOConfig` (sampling, DPO loss, ``pairs_per_prompt`` per
    prompt against the comparator; ``min_gap`` is unused: any non-tie pairs) plus the
    rounds (:class:`IterativeSection`, whose ``pair_selection`` this is). The rounds are
    the pairs' source: ``pair_source`` stays ``online`` and ``num_epochs`` unset."""

    # IterativeSection's pair_selection (the MRO would give MADPOConfig's)
    pair_selection: Literal["comparator_reward", "reward_gap", "random", "all"] = (
        "comparator_reward"  # type: ignore[assignment]
    )

    @model_validator(mode="after")
    def _rounds_make_the_pairs(self) -> IterativeMADPOConfig:
        if self.pair_source != "online":
            raise ValueError(
                f"pair_source={self.pair_source!r}: MADPO-Iter's rounds make its pairs; "
                "leave pair_source='online'"
            )
        return self


class MADPOIterRunConfig(MADPORunConfig, IterativeMADPOConfig):
    """``algo=madpo_iter``: :class:`~comlrl.algos.recipes.preference.madpo.config.MADPORunConfig` (agents,
    task, DPO and sampling settings; ``pairs_per_prompt`` current-vs-comparator pairs per
    prompt) plus the rounds (:class:`~comlrl.algos.recipes.preference.iterative.config.IterativeSection`:
    ``steps_per_round``, ``comparator``, ``replay_mode``, ...)."""

    output_dir: str = "runs/madpo_iter"

    @model_validator(mode="after")
    def _aligned(self) -> MADPOIterRunConfig:
        _check_aligned(self.joint_mode)
        return self


class MARLHFIterRunConfig(TrainConfig, IterativeSection):
    """``algo=marlhf_iter``: :class:`~comlrl.algos.training.config.rl.TrainConfig` for the RL
    steps (MAGRPO on the learned reward) plus the rounds
    (:class:`~comlrl.algos.recipes.preference.iterative.config.IterativeSection`) and the reward model.

    Attributes:
        reward_model: the reward model's backbone (None: agent 0's model).
        reward: how it is fitted each round (from its initial weights).
        num_candidates: ``K``, current candidates per agent per prompt in a round (>= 1).
        pairs_per_prompt: current-vs-comparator pairs kept per prompt.
        scoring_reward: ``task`` (pairs ordered by the task reward) or ``reward_model``
            (by the previous round's reward model; round 0 has none and uses the task's).
        eval_every: on by default (every 40 steps and before the first): the evaluation
            (``eval.jsonl``) scores the agents with the task's reward on ``eval_split``.
    """

    output_dir: str = "runs/marlhf_iter"
    eval_every: int = Field(40, ge=0)
    eval_on_start: bool = True
    reward_model: str | None = None
    reward: RewardModelConfig = Field(default_factory=lambda: RewardModelConfig(learning_rate=1e-3))
    num_candidates: int = Field(4, ge=1)
    pairs_per_prompt: int = Field(1, ge=1)
    scoring_reward: Literal["task", "reward_model"] = "task"

    @model_validator(mode="before")
    @classmethod
    def _no_start_eval_when_off(cls, data: Any) -> Any:
        return eval_on_start_follows(data)

    @model_validator(mode="after")
    def _single_turn_aligned(self) -> MARLHFIterRunConfig:
        _check_aligned(self.joint_mode)
        if self.num_turns != 1:
            raise ValueError(f"marlhf_iter is single-turn; got num_turns={self.num_turns}")
        return self


def _check_aligned(joint_mode: str) -> None:
    if joint_mode != "align":
        raise ValueError(
            f"joint_mode={joint_mode!r}: the rounds compare current and comparator joint "
            "actions index by index; set joint_mode=align"
        )
