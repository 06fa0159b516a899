"""The configs of SFT and DPO, one model trained on fixed rows: :class:`SFTConfig`
(``prompt``/``completion`` rows) and :class:`DPOConfig` (``prompt``/``chosen``/``rejected``
rows), what ``comlrl train algo=sft|dpo`` validates and the trainers take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

from comlrl.algos.recipes.preference.config import PreferenceTrainConfig
from pydantic import Field, model_validator

__all__ = ["SFTConfig", "DPOConfig"]


class SFTConfig(PreferenceTrainConfig):
    """Supervised fine-tuning of one model on ``prompt``/``completion`` rows.

    Attributes:
        max_prompt_length: keep the last this many prompt tokens (``None``: all).
        max_completion_length: keep the first this many completion tokens, EOS included.
        add_eos: end every completion with the tokenizer's EOS token, so the model learns
            to stop.
        data: JSON-lines file of training rows (``comlrl train``; a trainer built in Python
            takes its rows as ``dataset=``).
        eval_data: JSON-lines file of held-out rows.
    """

    #: the string fields every ``data`` / ``eval_data`` row must have.
    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "completion")
    output_dir: str = "runs/sft"
    max_prompt_length: int | None = Field(None, ge=1)
    max_completion_length: int | None = Field(None, ge=1)
    add_eos: bool = True
    data: str | None = Field(None, description="JSON-lines file of training rows.")
    eval_data: str | None = Field(None, description="JSON-lines file of held-out rows.")

    @model_validator(mode="after")
    def _one_model_and_files(self) -> SFTConfig:
        if len(self.models) != 1:
            raise ValueError(
                f"this recipe trains one model but models lists {len(self.models)}: "
                f"{self.models!r}; give one (--model NAME once, or models=[NAME])"
            )
        for key, path in (("data", self.data), ("eval_data", self.eval_data)):
            if path is not None and not Path(path).expanduser().is_file():
                raise ValueError(
                    f"{key}={path!r}: no such file; give a JSON-lines file of "
                    f"{self.row_example()} rows"
                )
        return self

    @classmethod
    def row_example(cls) -> str:
        """One row as JSON, e.g. ``{"prompt": "...", "completion": "..."}``."""
        return json.dumps({k: "..." for k in cls.row_keys})


class DPOConfig(SFTConfig):
    """DPO of one model on ``prompt``/``chosen``/``rejected`` rows (see
    :func:`~comlrl.estimators.preference_losses.dpo_loss` for ``beta``, ``label_smoothing``,
    ``loss_type``)."""

    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected")
    output_dir: str = "runs/dpo"
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
