"""The configs of SFT and DPO (one model on offline rows): the library configs
(:class:`SFTConfig`, :class:`DPOConfig`) and the run configs ``comlrl train algo=sft|dpo``
validates (:class:`SFTRunConfig`, :class:`DPORunConfig`: plus the model, the ``data`` files
and the outputs)."""

from __future__ import annotations

from typing import ClassVar, Literal

from comlrl.algos.recipes.launch import OneModelRunFields
from comlrl.algos.recipes.preference.config import PreferenceTrainConfig
from pydantic import Field, model_validator

__all__ = ["SFTConfig", "DPOConfig", "SFTRunConfig", "DPORunConfig"]


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


class SFTRunConfig(SFTConfig, OneModelRunFields):
    """:class:`~comlrl.algos.recipes.preference.supervised.config.SFTConfig` plus the run's model,
    ``data`` / ``eval_data`` files of ``{"prompt", "completion"}`` rows, and outputs."""

    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "completion")
    output_dir: str = "runs/sft"


class DPORunConfig(DPOConfig, OneModelRunFields):
    """:class:`~comlrl.algos.recipes.preference.supervised.config.DPOConfig` plus the run's model,
    ``data`` / ``eval_data`` files of ``{"prompt", "chosen", "rejected"}`` rows, and outputs."""

    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected")
    output_dir: str = "runs/dpo"
