"""What the preference trainers (in :mod:`.supervised.recipe`, :mod:`.madpo.recipe`, :mod:`.marlhf.recipe`) check and
build from their arguments: the config's type, the environment (a task, or CoMLRL's
formatters and reward function) and the agents."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.algos.rollout.environment import CallbackEnvironment, Environment, TaskEnvironment
from comlrl.algos.training.config.rl import ConfigError
from comlrl.core import Task

__all__ = ["check_config", "environment", "as_agents"]


def check_config(config: Any, cls: type) -> None:
    """Raise :class:`ConfigError` unless ``config`` is a ``cls``."""
    if not isinstance(config, cls):
        raise ConfigError(
            f"expected a {cls.__name__}, got {type(config).__name__}; build it with {cls.__name__}.build(...)"
        )


def environment(
    num_agents: int,
    task: Task | None,
    dataset: Sequence[Mapping[str, Any]] | None,
    formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None,
    reward_func: Callable[..., Any] | None,
) -> tuple[Environment, list[Mapping[str, Any]]]:
    """The environment and training examples of a task (its ``train`` split unless
    ``dataset`` is given) or of ``dataset`` + ``formatters`` + ``reward_func``.

    Raises:
        ConfigError: both forms, neither, or a formatter count other than ``num_agents``.
    """
    if task is not None:
        if formatters is not None or reward_func is not None:
            raise ConfigError("pass either task= or formatters= + reward_func=, not both.")
        return TaskEnvironment(task), list(dataset) if dataset is not None else list(
            task.load("train")
        )
    if formatters is None or reward_func is None or dataset is None:
        raise ConfigError(
            "without a task, pass dataset=, formatters= (one per agent) and reward_func=."
        )
    if len(formatters) != num_agents:
        raise ConfigError(
            f"{len(formatters)} formatters for {num_agents} agents; give one per agent."
        )
    return CallbackEnvironment(formatters, reward_func), list(dataset)


def as_agents(agents: Sequence[Any]) -> list[Any]:
    """``(model, tokenizer)`` pairs as :class:`~comlrl.algos.rollout.agent.HFAgent` s;
    agent objects as they are."""
    from comlrl.algos.rollout.agent import HFAgent

    return [
        a if not isinstance(a, tuple) else HFAgent(a[0], a[1], name=f"agent_{i}")
        for i, a in enumerate(agents)
    ]
