"""MADPO's config (:class:`MADPOConfig`): the agents' models and task, sampling, pairing,
the DPO loss and the outputs, with two optional sections: ``iterative`` (rounds of pairs
against a comparator: MADPO-Iter) and ``role_format`` (one model plays every role)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from comlrl.algos.recipes.preference.config import (
    IterativeSection,
    PreferenceTrainConfig,
    gather_section,
    renamed_key,
)
from comlrl.algos.training.config.task import TaskConfig
from pydantic import Field, model_validator

__all__ = ["MADPOConfig"]


class MADPOConfig(PreferenceTrainConfig):
    """Multi-agent DPO: sampling, pairing and loss settings (single-turn tasks).

    ``comlrl train algo=madpo`` presets ``learning_rate=1e-3``, ``optimizer=radam``,
    ``num_steps=60`` and ``batch_size=4``, which suit the built-in 260K-parameter stories260k
    (pretrained LLMs want about 1e-6 to 1e-5, the field defaults). Measured on the built-in
    ``coop_story`` task with seeds 0-2: training reward, first -> last quarter of the 60
    steps, +0.20 / +0.17 / +0.18 with RAdam; AdamW's first steps at this rate (bias-corrected
    second moments from a single pair batch) overshoot and the reward fell (-0.06, -0.08 for
    seeds 0, 1).

    Attributes:
        num_agents: ``A`` (with ``role_format``: the task's roles, played by one model).
        num_generations: ``K``, candidates each agent samples per prompt (>= 2); with
            ``joint_mode="align"`` the ``k``-th candidates of all agents form joint action
            ``k``. (The former name ``num_candidates`` resolves to it.)
        min_gap: the smallest reward gap (task units) that makes a pair.
        pairs_per_prompt: pairs kept per prompt, largest gap first.
        beta: DPO inverse temperature.
        eval_num_samples: samples per held-out prompt in the evaluation's reward.
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
        task: the task trained on (single-turn).
        eval_split: task split for held-out reward and pair margin (None: no evaluation).
        eval_limit: evaluate on the first N examples of ``eval_split`` only.
        role_format: one model plays every role of the task (``models`` names it):
            ``sentences`` or ``tagged`` says how its joint response splits into the roles
            (:mod:`comlrl.algos.rollout.joint_policy`); ``num_generations`` counts joint
            responses and ``max_new_tokens`` is a whole joint response's budget. ``None``:
            one model per agent.
        iterative: rounds of fresh pairs against a comparator policy with a replay
            (:class:`~comlrl.algos.recipes.preference.config.IterativeSection`; MADPO-Iter,
            ``algo=madpo_iter``): ``pairs_per_prompt`` current-vs-comparator pairs per
            prompt; ``min_gap`` is unused (any non-tie pair); ``pair_source`` stays
            ``online``. Its keys given flat (``steps_per_round=4``) move into it.
    """

    #: former keys that resolve to today's (``steps_per_round`` -> ``iterative.steps_per_round``)
    moved_keys: ClassVar[dict[str, str]] = {
        "num_candidates": "num_generations",
        **{k: f"iterative.{k}" for k in IterativeSection.model_fields if k != "pair_selection"},
    }
    output_dir: str = "runs/madpo"
    num_agents: int = Field(2, ge=1, le=16)
    num_generations: int = Field(4, ge=2)
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
    task: TaskConfig = Field(default_factory=TaskConfig)
    eval_split: str | None = None
    eval_limit: int | None = Field(None, ge=1)
    role_format: Literal["sentences", "tagged"] | None = None
    iterative: IterativeSection | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        data = renamed_key(data, "num_candidates", "num_generations")
        return gather_section(data, "iterative", IterativeSection, also=("pair_selection",))

    @model_validator(mode="after")
    def _consistent(self) -> MADPOConfig:
        if self.num_epochs is not None and self.pair_source != "initial":
            raise ValueError(
                f"num_epochs={self.num_epochs} counts passes over the pairs built once "
                "(pair_source='initial'); set pair_source='initial' or drop num_epochs"
            )
        if self.role_format is not None and len(self.models) != 1:
            raise ValueError(
                f"role_format={self.role_format!r} trains one joint policy but models "
                f"lists {len(self.models)}: {self.models!r}; give one model"
            )
        if len(self.models) not in (1, self.num_agents):
            raise ValueError(
                f"models lists {len(self.models)} models for num_agents={self.num_agents}; "
                "give one model for all agents or exactly one per agent."
            )
        if self.iterative is not None:
            if self.pair_source != "online":
                raise ValueError(
                    f"pair_source={self.pair_source!r}: MADPO-Iter's rounds make its pairs; "
                    "leave pair_source='online'"
                )
            if self.joint_mode != "align":
                raise ValueError(
                    f"joint_mode={self.joint_mode!r}: the rounds compare current and "
                    "comparator joint actions index by index; set joint_mode=align"
                )
        return self
