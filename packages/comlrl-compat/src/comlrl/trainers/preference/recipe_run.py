"""A ``comlrl.algos`` preference recipe (MADPO, MADPO-Iter, MARLHF-Iter) behind the
recipe-trainer contract of :class:`comlrl.trainers.base.CompatTrainer`: ``train()``,
``resume(path)``, ``evaluate()``, ``global_step``, ``run``, ``agents``, ``optimizers``,
``output_dir``, ``config``, ``eval_data``.

The recipe's own methods do the work: ``train`` runs it under the loop driver (its
checkpoint format), ``resume`` is its resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["PreferenceRecipeRun"]


class PreferenceRecipeRun:
    """One preference run.

    Args:
        recipe: the ``comlrl.algos`` recipe (:class:`comlrl.algos.MADPOTrainer`,
            :class:`comlrl.algos.MADPOIterRecipe`, :class:`comlrl.algos.MARLHFIterRecipe`).
        front: what holds the agents, optimizers, step and evaluation set and whose
            ``evaluate()`` is the run's evaluation (default ``recipe``; MARLHF-Iter: its RL
            phase, ``recipe.rl``).
    """

    def __init__(self, recipe: Any, front: Any = None) -> None:
        self.recipe = recipe
        self.front = front if front is not None else recipe

    @property
    def run(self) -> Any:
        """What holds the agents, optimizers, step and evaluation set."""
        return self.front

    @property
    def config(self) -> Any:
        """The recipe's validated config."""
        return self.recipe.config

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return int(self.front.global_step)

    @property
    def agents(self) -> list[Any]:
        """The recipe's ``A`` agents."""
        return list(self.front.agents)

    @property
    def optimizers(self) -> list[Any]:
        """One optimizer per agent."""
        return list(self.front.optimizers)

    @property
    def output_dir(self) -> Path:
        """Where metrics, evaluation rows and step checkpoints go."""
        return Path(self.recipe.output_dir)

    @property
    def eval_data(self) -> Any:
        """The run's evaluation examples."""
        return self.front.eval_data

    @eval_data.setter
    def eval_data(self, rows: Any) -> None:
        self.front.eval_data = rows

    def train(self) -> list[dict[str, float]]:
        """The recipe under the loop driver to its last step."""
        return list(self.recipe.train())

    def resume(self, path: str | Path) -> int:
        """Continue from the recipe's step checkpoint ``path``; returns its step."""
        return int(self.recipe.resume(path))

    def evaluate(self) -> dict[str, float]:
        """The recipe's evaluation row (keys without the ``eval/`` prefix)."""
        row = self.front.evaluate()
        return {k.removeprefix("eval/"): float(v) for k, v in row.items()}
