"""A ``comlrl.algos`` preference run (MADPO, MADPO-Iter, MARLHF-Iter) behind the
recipe-trainer contract of :class:`comlrl.trainers.base.CompatTrainer`: ``train()``,
``resume(path)``, ``evaluate()``, ``step``, ``run``, ``agents``, ``optimizers``,
``output_dir``, ``config``.

The recipe's own functions do the work: ``train`` is the recipe's loop under the loop
driver (its checkpoint format), ``resume`` its resume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PreferenceRecipeRun", "OUTPUT_FIELDS", "loop_outputs"]

#: the fields :class:`~comlrl.trainers.base.CompatTrainer` adds to a recipe config that a
#: preference run takes as its loop's outputs instead
OUTPUT_FIELDS = (
    "models", "prompt_format", "output_dir", "save_every", "keep_last", "progress",
    "report_to", "wandb_project", "eval_limit",
)  # fmt: skip


def loop_outputs(config: dict[str, Any]) -> dict[str, Any]:
    """Take :data:`OUTPUT_FIELDS` out of ``config``; returns the loop's outputs among them
    (``output_dir``, ``save_every``, ``keep_last``, ``progress``)."""
    taken = {k: config.pop(k) for k in OUTPUT_FIELDS if k in config}
    keep = ("output_dir", "save_every", "keep_last", "progress")
    return {k: taken[k] for k in keep if k in taken}


class PreferenceRecipeRun:
    """One preference run.

    Args:
        front: the ``comlrl.algos`` trainer whose ``run`` holds the agents, optimizers,
            step and evaluation set (:class:`comlrl.algos.MADPOTrainer`, or MARLHF-Iter's
            RL trainer), and whose ``evaluate()`` is the run's evaluation.
        train: the recipe's loop over the whole run (from the resumed step, if any).
        resume: ``path -> step``: the recipe's resume.
        output_dir: where the run writes.
    """

    def __init__(
        self,
        front: Any,
        *,
        train: Callable[[], list[dict[str, float]]],
        resume: Callable[[str | Path], int],
        output_dir: str | Path,
    ) -> None:
        self.front = front
        self._train, self._resume, self._output_dir = train, resume, Path(output_dir)

    @property
    def run(self) -> Any:
        """The recipe's run (``step``, ``agents``, ``optimizers``, ``eval_data``, ``config``)."""
        return self.front.run

    @property
    def config(self) -> Any:
        """The recipe's validated config (as the run holds it)."""
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
        return self._output_dir

    def train(self) -> list[dict[str, float]]:
        """The recipe's loop to its last step."""
        return self._train()

    def resume(self, path: str | Path) -> int:
        """Continue from the recipe's step checkpoint ``path``; returns its step."""
        return self._resume(path)

    def evaluate(self) -> dict[str, float]:
        """The recipe's evaluation row (keys without the ``eval/`` prefix)."""
        row = self.front.evaluate()
        return {k.removeprefix("eval/"): float(v) for k, v in row.items()}
