"""MADPO's configs: the library config (:class:`MADPOConfig`: sampling, pairing, the DPO
loss) and the run config ``comlrl train algo=madpo`` validates (:class:`MADPORunConfig`:
plus the agents' models, the task, the evaluation split and the outputs)."""

from __future__ import annotations

from typing import Literal

from comlrl.algos.models.loading import DEFAULT_MODEL
from comlrl.algos.recipes.launch import (
    RunFields,
)
from comlrl.algos.recipes.preference.config import PreferenceTrainConfig
from comlrl.algos.training.config.sections import ReportingSection
from comlrl.algos.training.config.task import TaskConfig
from pydantic import Field, model_validator

__all__ = ["MADPOConfig", "MADPORunConfig"]


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


class MADPORunConfig(MADPOConfig, ReportingSection, RunFields):
    """:class:`~comlrl.algos.recipes.preference.madpo.config.MADPOConfig` plus the agents' models, the
    task and outputs. ``learning_rate`` defaults to 1e-3, ``num_steps`` to 60 and
    ``optimizer`` to RAdam (Liu et al. 2020), which suit the built-in 260K-parameter
    stories260k (pretrained LLMs want about 1e-6 to 1e-5). Measured on the built-in
    ``coop_story`` task, `comlrl train algo=madpo` with seeds 0-2: training reward, first ->
    last quarter of the 60 steps, +0.20 / +0.17 / +0.18 with RAdam; AdamW's first steps at this
    rate (bias-corrected second moments from a single pair batch) overshoot and the reward
    fell (-0.06, -0.08 for seeds 0, 1).

    Attributes:
        eval_split: task split for held-out reward and pair margin (None: no evaluation).
        eval_limit: evaluate on the first N examples of ``eval_split`` only.
    """

    output_dir: str = "runs/madpo"
    learning_rate: float = Field(1e-3, gt=0)
    optimizer: Literal["adamw", "radam", "sgd"] = "radam"
    num_steps: int = Field(60, ge=1)
    batch_size: int = Field(4, ge=1, description="Prompts per step.")
    models: list[str] = Field(default_factory=lambda: [DEFAULT_MODEL])
    task: TaskConfig = Field(default_factory=TaskConfig)
    eval_split: str | None = None
    eval_limit: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _models_fit(self) -> MADPORunConfig:
        if len(self.models) not in (1, self.num_agents):
            raise ValueError(
                f"models lists {len(self.models)} models for num_agents={self.num_agents}; "
                "give one model for all agents or exactly one per agent."
            )
        return self

    def model_for(self, agent: int) -> str:
        """Model name or path of agent ``agent`` (0-based)."""
        return self.models[0] if len(self.models) == 1 else self.models[agent]
