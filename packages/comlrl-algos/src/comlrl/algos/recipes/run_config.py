"""What the ``*RunConfig`` classes of the recipes' end-to-end runs add to the library
configs: the fields a run needs that a trainer leaves to its caller (:class:`RunFields`:
``output_dir``, dtype, prompt format, checkpoints; :class:`OneModelRunFields`: the model and
the ``data`` files of a one-model recipe), and :func:`eval_on_start_follows`. Each
``*RunConfig`` lives beside its recipe (``recipes/<family>/run.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from comlrl.algos.models.loading import DEFAULT_MODEL
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RunFields", "OneModelRunFields", "eval_on_start_follows"]


class RunFields(BaseModel):
    """Fields of a run that the library configs leave to the caller: where it writes and
    how it checkpoints (read by :meth:`~comlrl.algos.recipes.run_steps.RunOutputs.of`) and
    how its models load."""

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


class OneModelRunFields(RunFields):
    """:class:`RunFields` of a one-model recipe (SFT, DPO) plus its model and the
    JSON-lines ``data`` / ``eval_data`` files (checked to exist)."""

    #: the string fields every ``data`` / ``eval_data`` row must have.
    row_keys: ClassVar[tuple[str, ...]] = ()
    models: list[str] = Field(
        default_factory=lambda: [DEFAULT_MODEL],
        description=f"The one model to train (HF id, local path, or {DEFAULT_MODEL!r}).",
    )
    data: str | None = Field(None, description="JSON-lines file of training rows.")
    eval_data: str | None = Field(None, description="JSON-lines file of held-out rows.")

    @model_validator(mode="after")
    def _one_model_and_data(self) -> OneModelRunFields:
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
