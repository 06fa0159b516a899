"""What the preference and supervised recipes share: a config that validates into
:class:`~comlrl.algos.training.config.rl.ConfigError` (:class:`ValidatedConfig`) and the
optimizer and loop settings of SFT, DPO and MADPO (:class:`PreferenceTrainConfig`). Each
method's own configs live beside its recipe (``supervised/config.py``, ``madpo/config.py``,
``marlhf/config.py``, ``iterative/config.py``)."""

from __future__ import annotations

from typing import Any, Literal

from comlrl.algos.training.config.rl import ConfigError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["ValidatedConfig", "PreferenceTrainConfig"]


class ValidatedConfig(BaseModel):
    """A config whose :meth:`build` raises :class:`ConfigError` naming every bad field."""

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


class PreferenceTrainConfig(ValidatedConfig):
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
