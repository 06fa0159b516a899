"""MADPO's trainer object: ``A`` agents on a task (or CoMLRL's ``dataset`` + ``formatters``
+ ``reward_func`` form), a thin front over :mod:`comlrl.algos.recipes.preference.madpo.recipe`
that checks its arguments and config when built and calls the recipe's loop in ``train``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.algos.recipes.preference.config import MADPOConfig
from comlrl.algos.recipes.preference.inputs import as_agents, check_config, environment
from comlrl.algos.recipes.preference.madpo.recipe import (
    madpo_checkpoint,
    madpo_evaluate,
    madpo_resume,
    madpo_setup,
    madpo_step,
    train_madpo,
)
from comlrl.core import Task

__all__ = ["MADPOTrainer"]


class MADPOTrainer:
    """Multi-agent DPO (:func:`comlrl.algos.recipes.preference.madpo.recipe.madpo_step`): each step
    samples ``K`` candidates per agent, pairs joint actions by reward gap and steps every
    agent on its own term of the joint DPO loss, against a frozen reference per agent.
    CoMLRL 1.4.3's MADPO (``comlrl.trainers.MADPOTrainer``, the same algorithm with 1.4.3's
    arguments) is this trainer with ``pair_source="initial"``, ``num_epochs`` and
    ``reference_free=True`` (:class:`MADPOConfig`).

    Args:
        agents: ``A`` :class:`~comlrl.algos.HFAgent` s or ``(model, tokenizer)`` pairs,
            each with its own model object.
        config: a :class:`MADPOConfig`.
        task: a single-turn use of a :class:`comlrl.core.Task` (its ``train`` split unless
            ``dataset`` is given); or ``dataset`` + ``formatters`` + ``reward_func``.
        eval_dataset: held-out examples (reward and held-out pair margin).
        ref_models: one frozen reference per agent (default: copies made at setup).

    Raises:
        ConfigError: as :func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_setup`, or a
            missing task / formatters / reward function.
    """

    def __init__(
        self,
        agents: Sequence[Any],
        config: MADPOConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        ref_models: Sequence[Any] | None = None,
    ) -> None:
        check_config(config, MADPOConfig)
        self.config = config
        self.agents = as_agents(agents)
        self.env, data = environment(len(self.agents), task, dataset, formatters, reward_func)
        self.run = madpo_setup(
            self.agents, config, self.env, data, eval_dataset, ref_models=ref_models
        )

    def train_step(self) -> dict[str, float]:
        """One step; its metrics row."""
        return madpo_step(self.run)

    def evaluate(self) -> dict[str, float]:
        """Held-out reward and pair metrics."""
        return madpo_evaluate(self.run)

    def train(self, **outputs: Any) -> list[dict[str, float]]:
        """Run the steps up to ``config.num_steps`` (from the resumed step, if any);
        ``outputs`` (``output_dir``, ``save_every``, ``keep_last``, ``resume_from``,
        ``record``, ``progress``) as in
        :func:`~comlrl.algos.recipes.preference.madpo.recipe.train_madpo`."""
        return train_madpo(self.run, **outputs)

    def checkpoint(self, path: str | Path) -> Path:
        """Write a resumable step checkpoint now at ``path``
        (:func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_checkpoint`); returns it."""
        return madpo_checkpoint(self.run, path)

    def resume(self, checkpoint: str | Path, output_dir: str | Path | None = None) -> int:
        """Continue from a step checkpoint (agents, optimizers, data and random streams;
        :func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_resume`); returns its step. Build
        the trainer on the run's initial weights first: the reference models are copies
        of them.

        Raises:
            CheckpointError: the checkpoint is incomplete or does not fit this run.
        """
        return madpo_resume(self.run, checkpoint, output_dir)
