"""The ``*RunConfig`` classes: the library configs plus what a command-line run needs
(model names, task or data file, ``output_dir``, dtype); the library configs are unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from comlrl.algos.cli.run_steps import RunRequest
from comlrl.algos.models.loading import DEFAULT_MODEL
from comlrl.algos.recipes.preference.config import (
    DPOConfig,
    MADPOConfig,
    RewardModelConfig,
    SFTConfig,
)
from comlrl.algos.training.config import TrainConfig
from comlrl.algos.training.task_config import TaskConfig
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "eval_on_start_follows",
    "SFTRunConfig",
    "DPORunConfig",
    "MADPORunConfig",
    "MARLHFRunConfig",
]


class _CommandLineRun(BaseModel):
    """Fields of a command-line run that the library configs leave to the caller."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    output_dir: str = Field(
        "runs/default", description="Where metrics.jsonl, config.yaml and final/ go."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    prompt_format: Literal["auto", "chat", "raw"] = Field(
        "auto",
        description="chat: the tokenizer's chat template on the task's prompt messages; raw: "
        "the prompt text; auto: chat when the tokenizer has a chat template.",
    )
    trust_remote_code: bool = False
    progress: bool = True
    save_every: int = Field(
        0,
        ge=0,
        description="Step checkpoint every N steps and at the last; 0 = only on Ctrl-C or when a step fails.",
    )
    keep_last: int | None = Field(
        None, ge=1, description="Keep the newest N step checkpoints (None = all); final/ stays."
    )

    def run_outputs(self, request: RunRequest, algo: str) -> dict[str, Any]:
        """The run-output arguments of the preference recipes' ``train_*`` functions: where
        this run writes (``config.yaml`` records ``algo`` for ``--resume``), how often it
        checkpoints, and the step checkpoint ``--resume`` continues from."""
        return {
            "output_dir": Path(self.output_dir),
            "save_every": self.save_every,
            "keep_last": self.keep_last,
            "resume_from": request.resume_from,
            "record": {"algo": algo, **self.model_dump()},
            "progress": self.progress,
        }


class _OneModelRun(_CommandLineRun):
    #: the string fields every ``data`` / ``eval_data`` row must have.
    row_keys: ClassVar[tuple[str, ...]] = ()
    models: list[str] = Field(
        default_factory=lambda: [DEFAULT_MODEL],
        description=f"The one model to train (HF id, local path, or {DEFAULT_MODEL!r}).",
    )
    data: str | None = Field(None, description="JSON-lines file of training rows.")
    eval_data: str | None = Field(None, description="JSON-lines file of held-out rows.")

    @model_validator(mode="after")
    def _one_model_and_data(self) -> _OneModelRun:
        if len(self.models) != 1:
            raise ValueError(
                f"this recipe trains one model but models lists {len(self.models)}: "
                f"{self.models!r}; give one (--model NAME once, or models=[NAME])"
            )
        keys = self.row_keys
        example = json.dumps({k: "..." for k in keys})
        if self.data is None:
            raise ValueError(
                f"needs data=PATH.jsonl, a JSON-lines file with one {example} row per line "
                "(there is no built-in data set for it: the built-in coop_story task has "
                "seeds and a reward, not reference texts)"
            )
        for key, path in (("data", self.data), ("eval_data", self.eval_data)):
            if path is not None and not Path(path).expanduser().is_file():
                raise ValueError(
                    f"{key}={path!r}: no such file; give a JSON-lines file of {example} rows"
                )
        return self


class SFTRunConfig(SFTConfig, _OneModelRun):
    """:class:`~comlrl.algos.recipes.preference.config.SFTConfig` plus the command line's model,
    ``data`` / ``eval_data`` files of ``{"prompt", "completion"}`` rows, and outputs."""

    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "completion")
    output_dir: str = "runs/sft"


class DPORunConfig(DPOConfig, _OneModelRun):
    """:class:`~comlrl.algos.recipes.preference.config.DPOConfig` plus the command line's model,
    ``data`` / ``eval_data`` files of ``{"prompt", "chosen", "rejected"}`` rows, and outputs."""

    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected")
    output_dir: str = "runs/dpo"


class MADPORunConfig(MADPOConfig, _CommandLineRun):
    """:class:`~comlrl.algos.recipes.preference.config.MADPOConfig` plus the agents' models, the
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
    report_to: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        ["jsonl"], description="As TrainConfig.report_to: jsonl, tensorboard, wandb."
    )
    wandb_project: str = Field("comlrl", description="W&B project name (report_to wandb).")
    reward_curve: bool = Field(True, description="Write output_dir/reward_curve.png at the end.")

    _report_to_list = field_validator("report_to", mode="before")(
        TrainConfig._report_to_list.__func__  # type: ignore[attr-defined]
    )

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


class MARLHFRunConfig(TrainConfig):
    """MARLHF from the command line: :class:`~comlrl.algos.training.config.TrainConfig` for the RL
    phase (MAGRPO by default, on the learned reward) plus how preference pairs are sampled
    and the joint reward model is fit (:class:`~comlrl.algos.MARLHFTrainer`).

    Attributes:
        reward_model: the reward model's backbone (None: agent 0's model).
        reward: the reward model's training settings
            (:class:`~comlrl.algos.recipes.preference.config.RewardModelConfig`).
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


def eval_on_start_follows(data: Any) -> Any:
    """For configs whose evaluation is on by default (``eval_every=40``,
    ``eval_on_start=true``): ``eval_every=0`` without ``eval_on_start`` turns the start
    evaluation off too, so the saved ``config.yaml`` (which ``--resume`` validates again)
    holds a consistent ``eval_on_start: false``."""
    if isinstance(data, dict) and "eval_on_start" not in data:
        try:
            off = int(data.get("eval_every", 1)) == 0
        except (TypeError, ValueError):
            return data  # the field's own check reports it
        if off:
            return {**data, "eval_on_start": False}
    return data
