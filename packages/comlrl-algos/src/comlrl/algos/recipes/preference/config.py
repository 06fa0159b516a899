"""The preference recipes' configs: optimizer and loop settings (:class:`PreferenceTrainConfig`),
SFT, DPO, MADPO, MARLHF's reward model (:class:`RewardModelConfig`), and the rounds of
iterative preference refresh (:class:`IterativeSection`, :class:`IterativeMADPOConfig`)."""

from __future__ import annotations

from typing import Any, Literal

from comlrl.algos.training.config import ConfigError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "PreferenceTrainConfig",
    "SFTConfig",
    "DPOConfig",
    "MADPOConfig",
    "RewardModelConfig",
    "IterativeSection",
    "IterativeMADPOConfig",
]


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
    :func:`~comlrl.estimators.preference_losses.dpo_loss` for ``beta``, ``label_smoothing``,
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
        pair_selection: which of a prompt's candidate pairs are kept: ``reward_gap``
            (the largest gaps) or ``random`` (a uniform draw;
            :func:`~comlrl.algos.recipes.preference.madpo.initial_pairs.within_prompt_pairs`).
        pair_source: ``online``: every step samples ``batch_size`` prompts' candidates
            from the current policy and pairs them; ``initial`` (CoMLRL 1.4.3's MADPO):
            every training prompt's pairs are built once from the initial policy before
            the first step, and each step trains on the next ``batch_size`` pairs
            (:mod:`~comlrl.algos.recipes.preference.madpo.initial_pairs`).
        num_epochs: ``pair_source="initial"`` only: passes over the pairs; the run then
            has ``num_epochs * ceil(P / batch_size)`` steps (``P`` pairs) instead of
            ``num_steps``.
        reference_free: ``log pi_ref = 0`` for every agent (no frozen reference copy; the
            loss of CoMLRL 1.4.3's MADPO) instead of DPO against the initial policy.
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
    pair_selection: Literal["reward_gap", "random"] = "reward_gap"
    pair_source: Literal["online", "initial"] = "online"
    num_epochs: int | None = Field(None, ge=1)
    reference_free: bool = False

    @model_validator(mode="after")
    def _epochs_need_initial_pairs(self) -> MADPOConfig:
        if self.num_epochs is not None and self.pair_source != "initial":
            raise ValueError(
                f"num_epochs={self.num_epochs} counts passes over the pairs built once "
                "(pair_source='initial'); set pair_source='initial' or drop num_epochs"
            )
        return self


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


class IterativeSection(_Validated):
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
