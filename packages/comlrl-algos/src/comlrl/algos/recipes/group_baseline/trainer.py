"""Trainer objects: a thin front over :mod:`comlrl.algos.recipes.group_baseline.recipe`.

``MultiAgentTrainer(agents, config, task=...)`` (or ``dataset=``, ``formatters=``,
``reward_func=`` in CoMLRL's form) checks everything, builds the run state, and
:meth:`~MultiAgentTrainer.train` runs the recipe's loop. The maths and the loop live in
the recipe; this class only wires arguments to it. :class:`MAGRPOTrainer`,
:class:`MARLOOTrainer`, :class:`MAReMaxTrainer` and :class:`MAREINFORCETrainer` fix the
estimator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.environment import (
    CallbackEnvironment,
    Environment,
    TaskEnvironment,
    Transition,
)
from comlrl.algos.training import lifecycle
from comlrl.algos.training.config import ConfigError, RLConfig, TrainConfig
from comlrl.core import Task

__all__ = [
    "MultiAgentTrainer",
    "MAGRPOTrainer",
    "MARLOOTrainer",
    "MAReMaxTrainer",
    "MAREINFORCETrainer",
]


class MultiAgentTrainer:
    """Train ``A`` cooperating causal-LM agents with a group-baseline policy gradient.

    Give either a ``task`` (a :class:`comlrl.core.Task`: examples, per-agent prompts,
    batched joint reward, and for ``num_turns > 1`` its feedback) or ``dataset`` +
    ``formatters`` + ``reward_func`` (CoMLRL's form: ``reward_func(completions_agent1, ...,
    completions_agentA) -> list[float]``, optionally with ``example=`` or ``batch_items=``)
    and, for ``num_turns > 1``, ``transition`` (CoMLRL's ``external_transition``).

    Args:
        agents: ``A`` agents: :class:`HFAgent` objects, ``(model, tokenizer)`` pairs, or
            your own :class:`comlrl.core.Agent` with ``model`` and ``tokenizer``.
        config: a validated :class:`TrainConfig`; ``config.estimator`` picks the baseline.
        task: the task suite; ``task.load(config.task.split)`` gives the dataset unless
            ``dataset`` is passed.
        dataset: a sequence of examples (mappings); a ``datasets.Dataset`` works.
        formatters: ``A`` callables ``example -> prompt`` (without ``task``).
        reward_func: joint reward (without ``task``).
        transition: ``external_transition(prompt, agent_completions, num_agents,
            prompt_history_per_agent, response_history_per_agent) -> A prompts`` for turns
            after the first (with a task, it replaces the task's own prompts).
        eval_dataset: examples for evaluation (``config.eval_every``, :meth:`evaluate`);
            with a task and ``config.eval_every > 0`` it defaults to
            ``task.load(config.eval_split)``.
        eval_env: the environment evaluation plays and scores in (default: the training
            one), e.g. the task's true reward while training on a learned reward model
            (:meth:`MARLHFTrainer.rl_trainer <comlrl.algos.MARLHFTrainer.rl_trainer>`).
        environment: instead of ``task`` or ``formatters``/``transition``, a ready
            :class:`~comlrl.algos.rollout.environment.Environment` (e.g. a
            :class:`~comlrl.algos.CallbackEnvironment` subclass with its own prompts for
            later turns, as ``comlrl.trainers`` builds for CoMLRL 1.4.3 scripts); needs
            ``dataset``. ``reward_func``, when given too, is only recorded in ``config.yaml``.

    Raises:
        ConfigError: when the agents, task/formatters, dataset and config disagree
            (checked before any training work starts).
    """

    estimator: str | None = None
    #: whether ``config.estimator`` is the baseline (the actor-critic trainers: a critic)
    uses_estimator: bool = True
    #: the recipe's name in ``config.yaml`` (``None``: not recorded)
    algo: str | None = None

    def __init__(
        self,
        agents: Sequence[Any],
        config: RLConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        transition: Transition | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        eval_env: Environment | None = None,
        environment: Environment | None = None,
    ) -> None:
        from comlrl.estimators.registry import ESTIMATORS

        if (
            self.estimator is not None
            and isinstance(config, TrainConfig)
            and ESTIMATORS[config.estimator].name != self.estimator
        ):
            if "estimator" in config.model_fields_set:
                raise ConfigError(
                    f"{type(self).__name__} uses estimator={self.estimator!r} but "
                    f"config.estimator={config.estimator!r}; use MultiAgentTrainer for other estimators."
                )
            config = config.model_copy(update={"estimator": self.estimator})
        self.config = config
        self.agents = [
            a
            if not isinstance(a, tuple)
            else HFAgent(a[0], a[1], name=f"agent_{i}", **config.generation_options())
            for i, a in enumerate(agents)
        ]
        self.task = task
        env: Environment
        data: Sequence[Mapping[str, Any]]
        if environment is not None:
            if task is not None or formatters is not None or transition is not None:
                raise ConfigError(
                    "environment= replaces task=, formatters= and transition=; pass one form."
                )
            if dataset is None:
                raise ConfigError("environment= needs dataset= (the examples to train on).")
            env = environment
            data = dataset if isinstance(dataset, Sequence) else list(dataset)
        elif task is not None:
            env = TaskEnvironment(task, transition)
            data = list(dataset) if dataset is not None else list(task.load(config.task.split))
            if eval_dataset is None and config.eval_every:
                try:
                    eval_dataset = list(task.load(config.eval_split))
                except ValueError as exc:
                    raise ConfigError(f"eval_split={config.eval_split!r}: {exc}") from None
        else:
            if formatters is None or reward_func is None or dataset is None:
                raise ConfigError(
                    "without a task, pass dataset=, formatters= (one per agent) and reward_func=."
                )
            if len(formatters) != len(self.agents):
                raise ConfigError(
                    f"{len(formatters)} formatters for {len(self.agents)} agents; give one per agent."
                )
            env = CallbackEnvironment(formatters, reward_func, transition)
            data = dataset if isinstance(dataset, Sequence) else list(dataset)
        self.env = env
        #: what ``config.yaml`` records: the config, with the task or reward really used
        self.record = lifecycle.run_record(
            config, algo=self.algo, task=task, reward_func=reward_func, agents=self.agents
        )
        self.run = group_baseline.setup(
            self.agents,
            config,
            env,
            data,
            eval_dataset,
            eval_env=eval_env,
            group_baseline=self.uses_estimator,
        )

    @property
    def step(self) -> int:
        """Optimizer steps taken so far."""
        return self.run.step

    @property
    def optimizers(self) -> list[Any]:
        """One optimizer per agent."""
        return self.run.optimizers

    @property
    def output_dir(self) -> Path:
        """Where metrics, samples and checkpoints go."""
        return self.run.output_dir

    def train_step(self) -> dict[str, float]:
        """One step of :func:`comlrl.algos.recipes.group_baseline.recipe.train_step`."""
        return group_baseline.train_step(self.run)

    def save(self, tag: str) -> list[Path]:
        """Checkpoint every agent under ``output_dir/<tag>/agent_<i>`` (atomically)."""
        return group_baseline.save(self.run, tag)

    def evaluate(self) -> dict[str, float]:
        """One evaluation row (:func:`comlrl.algos.recipes.group_baseline.recipe.evaluate`)."""
        return group_baseline.evaluate(self.run)

    def resume(self, checkpoint: str | Path) -> int:
        """Continue from a step checkpoint (:func:`~comlrl.algos.recipes.group_baseline.recipe.resume`);
        returns its step."""
        return group_baseline.resume(self.run, checkpoint)

    def train(self, *, overwrite: bool = False) -> list[dict[str, float]]:
        """Run :func:`comlrl.algos.recipes.group_baseline.recipe.train`; closes the task after.

        A fresh run refuses an ``output_dir`` that holds another run (as ``comlrl train``
        does): :meth:`resume` it first, or pass ``overwrite=True`` to delete that run's
        outputs.

        Raises:
            ConfigError: ``output_dir`` holds another run and ``overwrite`` is False.
        """
        try:
            return group_baseline.train(self.run, record=self.record, overwrite=overwrite)
        finally:
            if self.task is not None:
                self.task.close()


class MAGRPOTrainer(MultiAgentTrainer):
    """Multi-agent GRPO: group-mean baseline, divided by the group std (Shao et al. 2024, eq. 3)."""

    estimator = "grpo"


class MARLOOTrainer(MultiAgentTrainer):
    """Multi-agent RLOO: leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024)."""

    estimator = "rloo"


class MAReMaxTrainer(MultiAgentTrainer):
    """Multi-agent ReMax: the best return of the other samples as the baseline (after Li et
    al. 2023; leave-one-out, so unbiased)."""

    estimator = "remax"


class MAREINFORCETrainer(MultiAgentTrainer):
    """Multi-agent REINFORCE: no baseline (Williams 1992)."""

    estimator = "reinforce"
