"""A ``comlrl.algos`` preference trainer (MADPO, MADPO-Iter) behind the recipe-trainer
contract of :class:`comlrl.trainers.base.CompatTrainer`: ``train()``, ``resume(path)``,
``evaluate()``, ``step``, ``run``, ``agents``, ``optimizers``, ``output_dir``, ``config``.

The recipe's own functions do the work: ``train`` is the recipe's loop under the loop
driver (its checkpoint format), ``resume`` its resume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PreferenceRecipeRun", "OUTPUT_FIELDS"]

#: the fields :meth:`CompatTrainer._build <comlrl.trainers.base.CompatTrainer>` adds to a
#: recipe config that a preference run takes as its outputs instead
OUTPUT_FIELDS = (
    "models", "prompt_format", "output_dir", "save_every", "keep_last", "progress",
    "report_to", "wandb_project", "eval_limit",
)  # fmt: skip


class PreferenceRecipeRun:
    """One preference run: ``state`` (the recipe's run: a MADPO run, or a MADPO-Iter run
    holding one as ``madpo``), its loop ``train(state, **outputs)``, its
    ``resume(state, path, output_dir)`` and ``evaluate(madpo_run)``.

    Args:
        state: the recipe's run.
        outputs: ``output_dir``, ``save_every``, ``keep_last``, ``progress`` for the loop.
        train, resume, evaluate: the recipe's functions.
    """

    def __init__(
        self,
        state: Any,
        outputs: dict[str, Any],
        *,
        train: Callable[..., list[dict[str, float]]],
        resume: Callable[..., int],
        evaluate: Callable[[Any], dict[str, float]],
    ) -> None:
        self.state, self.outputs = state, outputs
        self._train, self._resume, self._evaluate = train, resume, evaluate

    @property
    def run(self) -> Any:
        """The MADPO run (``step``, ``agents``, ``optimizers``, ``eval_data``, ``config``)."""
        return getattr(self.state, "madpo", self.state)

    @property
    def config(self) -> Any:
        """The recipe's validated config."""
        return self.run.config

    @property
    def step(self) -> int:
        """Optimizer steps taken so far."""
        return int(self.run.step)

    @property
    def agents(self) -> list[Any]:
        """The recipe's ``A`` agents."""
        return list(self.run.agents)

    @property
    def optimizers(self) -> list[Any]:
        """One optimizer per agent."""
        return list(self.run.optimizers)

    @property
    def output_dir(self) -> Path:
        """Where metrics, evaluation rows and step checkpoints go."""
        return Path(self.outputs["output_dir"])

    def train(self) -> list[dict[str, float]]:
        """The recipe's loop to its last step (from the resumed step, if any)."""
        return self._train(self.state, **self.outputs)

    def resume(self, path: str | Path) -> int:
        """Continue from the recipe's step checkpoint ``path``; returns its step."""
        return self._resume(self.state, path, self.outputs["output_dir"])

    def evaluate(self) -> dict[str, float]:
        """The recipe's evaluation row (keys without the ``eval/`` prefix)."""
        row = self._evaluate(self.run)
        return {k.removeprefix("eval/"): float(v) for k, v in row.items()}
