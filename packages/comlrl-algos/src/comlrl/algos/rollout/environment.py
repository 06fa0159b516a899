"""The environment a rollout talks to: prompts, joint reward, and the transition between turns.

Two ways to describe a task, one interface (:class:`Environment`) for the rollout:

- a :class:`comlrl.core.Task` (:class:`TaskEnvironment`): ``task.prompts(example,
  history)`` builds every agent's prompt from the feedback of earlier turns,
  ``task.reward`` scores joint actions, ``task.feedback`` answers a joint action;
- CoMLRL's form (:class:`CallbackEnvironment`): one formatter per agent, a
  ``reward_func``, and for multi-turn an ``external_transition(prompt,
  agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent)``
  returning the agents' next prompts (CoMLRL 1.4.3's contract).

:func:`build_environment` is the one rule set every recipe builds its environment and
training examples with (a task, a ready environment, or CoMLRL's callbacks).

A :class:`Branch` is the state of one node of the rollout tree: the agents' current
prompts and the prompts, responses and feedback along the path from the root.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from comlrl.algos.rollout.toolbox import ToolBox
from comlrl.core import (
    Feedback,
    JointAction,
    RewardBatch,
    Task,
    Tool,
    as_joint_reward,
    check_reward_arity,
)
from comlrl.core.prompts import ChatPrompt, Prompt, prompt_text

__all__ = [
    "Branch",
    "Environment",
    "TaskEnvironment",
    "CallbackEnvironment",
    "Transition",
    "build_environment",
    "check_environment",
]

#: CoMLRL 1.4.3's ``external_transition`` signature; returns the ``A`` next prompts.
Transition = Callable[..., Sequence[str]]


@dataclass(frozen=True)
class Branch:
    """The state of one rollout-tree node.

    Attributes:
        prompts: the ``A`` agents' prompts at this node (``str`` or
            :class:`comlrl.core.ChatPrompt`; the agent renders them).
        prompt_history: per agent, the prompts of earlier turns on this path, oldest first.
        response_history: per agent, its completions on this path, oldest first.
        feedback: the feedback of earlier turns on this path, oldest first.
    """

    prompts: tuple[Prompt, ...]
    prompt_history: tuple[tuple[Prompt, ...], ...] = ()
    response_history: tuple[tuple[str, ...], ...] = ()
    feedback: tuple[Feedback, ...] = ()


class Environment(Protocol):
    """What :func:`comlrl.algos.rollout.tree.rollout` needs from a task."""

    num_agents: int
    #: the most turns the environment supports (``None``: no limit).
    max_turns: int | None
    #: per agent, its tools for calls inside a turn (``None``: an agent without tools);
    #: an environment without the attribute has no tools.
    toolboxes: tuple[ToolBox | None, ...]

    def root(self, example: Mapping[str, Any]) -> Branch:
        """The turn-0 node of ``example``."""
        ...

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions (agent-major texts ``[A][K]``, ``K`` examples)."""
        ...

    def step(
        self,
        example: Mapping[str, Any],
        branch: Branch,
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> tuple[Branch, Feedback]:
        """The child node after ``joint_action`` at ``turn``, and the feedback given."""
        ...


def _extend(
    branch: Branch, texts: Sequence[str]
) -> tuple[tuple[tuple[Prompt, ...], ...], tuple[tuple[str, ...], ...]]:
    n = len(branch.prompts)
    prompts = branch.prompt_history or tuple(() for _ in range(n))
    responses = branch.response_history or tuple(() for _ in range(n))
    return (
        tuple(prompts[a] + (branch.prompts[a],) for a in range(n)),
        tuple(responses[a] + (texts[a],) for a in range(n)),
    )


def _check_prompts(prompts: Any, num_agents: int, source: str) -> tuple[Prompt, ...]:
    if not isinstance(prompts, (list, tuple)) or len(prompts) != num_agents:
        raise ValueError(
            f"{source} must return one prompt per agent ({num_agents} prompts: strings or "
            f"comlrl.core.ChatPrompt), got {prompts!r:.300}"
        )
    bad = [p for p in prompts if not isinstance(p, (str, ChatPrompt))]
    if bad:
        raise ValueError(
            f"{source} returned prompts that are neither strings nor ChatPrompts {bad!r:.300}; "
            f"return {num_agents} of them"
        )
    return tuple(prompts)


def _toolboxes(
    tools: Sequence[Sequence[Tool]], fallback_format: str, max_tool_calls: int
) -> tuple[ToolBox | None, ...]:
    return tuple(
        ToolBox(tuple(t), fallback_format=fallback_format, max_tool_calls=max_tool_calls)
        if t
        else None
        for t in tools
    )


class _RewardEnvironment:
    """The reward call shared by both environments (a batched :class:`JointReward`)."""

    num_agents: int
    _reward: Any
    toolboxes: tuple[ToolBox | None, ...] = ()

    def close(self) -> None:
        """Shut the tools' thread pools down."""
        for box in self.toolboxes:
            if box is not None:
                box.close()

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions (agent-major texts ``[A][K]``, ``K`` examples)."""
        return self._reward(completions, examples)  # type: ignore[no-any-return]


class TaskEnvironment(_RewardEnvironment):
    """A :class:`comlrl.core.Task` as an :class:`Environment`.

    Args:
        task: the task suite.
        transition: optional CoMLRL-style ``external_transition`` that replaces the
            task's own ``prompts(example, history)`` for turns after the first (the
            task's ``feedback`` is still called, for ``done`` and the logs, when the task
            implements it).
    """

    def __init__(self, task: Task, transition: Transition | None = None) -> None:
        self.task = task
        self.num_agents = int(task.num_agents)
        self.max_turns: int | None = None if transition is not None else int(task.max_turns)
        self._reward = as_joint_reward(task)
        self._transition = transition
        self.toolboxes = _toolboxes(
            [tuple(task.tools(a)) for a in range(self.num_agents)],
            getattr(task, "tool_format", "json"),
            int(getattr(task, "max_tool_calls", 4)),
        )

    def root(self, example: Mapping[str, Any]) -> Branch:
        return Branch(
            _check_prompts(
                self.task.prompts(example, ()), self.num_agents, f"task {self.task.name!r}.prompts"
            )
        )

    def step(
        self,
        example: Mapping[str, Any],
        branch: Branch,
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> tuple[Branch, Feedback]:
        prompt_history, response_history = _extend(branch, joint_action.completions)
        if self._transition is None:
            feedback = self.task.feedback(example, joint_action, info, turn)
            history = (*branch.feedback, feedback)
            prompts: Sequence[Prompt] = self.task.prompts(example, history)
        else:
            try:
                feedback = self.task.feedback(example, joint_action, info, turn)
            except NotImplementedError:
                feedback = Feedback(texts=("",) * self.num_agents)
            history = (*branch.feedback, feedback)
            prompts = _call_transition(
                self._transition, example, joint_action, prompt_history, response_history
            )
        checked = _check_prompts(prompts, self.num_agents, "the transition")
        return Branch(checked, prompt_history, response_history, history), feedback


class CallbackEnvironment(_RewardEnvironment):
    """CoMLRL's form: per-agent formatters, a ``reward_func``, an optional transition.

    Args:
        formatters: ``A`` callables ``example -> prompt``.
        reward_func: CoMLRL-style ``reward_func(completions_agent1, ...)`` or a batched
            :class:`comlrl.core.JointReward` (see :func:`comlrl.core.as_joint_reward`).
        transition: CoMLRL's ``external_transition(prompt=..., agent_completions=...,
            num_agents=..., prompt_history_per_agent=..., response_history_per_agent=...)``
            returning the ``A`` next prompts; ``prompt`` is ``example.get("prompt", "")``,
            the histories run along this branch up to and including the current turn.
            Without it the environment is single-turn.
        tools: per agent, the :class:`comlrl.core.Tool` s it may call inside a turn
            (``None``: no tools).
        tool_format: the call format for chat templates that do not render tools
            (``"json"`` or ``"python"``; see :mod:`comlrl.core.tools`).
        max_tool_calls: calls per completion per turn.

    Raises:
        ValueError: ``tools`` not one list per agent.
        TypeError: ``reward_func`` cannot take one completions list per agent
            (:func:`comlrl.core.check_reward_arity`), before anything is generated.
    """

    def __init__(
        self,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]],
        reward_func: Callable[..., Any],
        transition: Transition | None = None,
        *,
        tools: Sequence[Sequence[Tool]] | None = None,
        tool_format: str = "json",
        max_tool_calls: int = 4,
    ) -> None:
        self.formatters = list(formatters)
        self.num_agents = len(self.formatters)
        self.max_turns: int | None = None if transition is not None else 1
        check_reward_arity(reward_func, self.num_agents)  # now, not after the first generation
        self._reward = as_joint_reward(reward_func)
        self._transition = transition
        if tools is not None and len(tools) != self.num_agents:
            raise ValueError(
                f"tools must hold one list of tools per agent ({self.num_agents}), got "
                f"{len(tools)}; give [] to an agent without tools"
            )
        self.toolboxes = _toolboxes(tools or [()] * self.num_agents, tool_format, max_tool_calls)

    def root(self, example: Mapping[str, Any]) -> Branch:
        return Branch(
            _check_prompts([f(example) for f in self.formatters], self.num_agents, "the formatters")
        )

    def step(
        self,
        example: Mapping[str, Any],
        branch: Branch,
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> tuple[Branch, Feedback]:
        if self._transition is None:
            raise ValueError("this environment is single-turn: pass transition= for num_turns > 1")
        prompt_history, response_history = _extend(branch, joint_action.completions)
        external = _call_transition(
            self._transition, example, joint_action, prompt_history, response_history
        )
        prompts = self.next_prompts(example, external)
        checked = _check_prompts(prompts, self.num_agents, "external_transition")
        feedback = Feedback(
            texts=tuple(prompt_text(p) for p in checked), info={"source": "external_transition"}
        )
        return Branch(
            checked, prompt_history, response_history, (*branch.feedback, feedback)
        ), feedback

    def next_prompts(self, example: Mapping[str, Any], external: Sequence[str]) -> Sequence[str]:
        """The agents' next prompts from what the transition returned (here: as they are;
        a subclass may format them, e.g. CoMLRL's formatters in ``comlrl.trainers``)."""
        return external


def _call_transition(
    transition: Transition,
    example: Mapping[str, Any],
    joint_action: JointAction,
    prompt_history: tuple[tuple[Prompt, ...], ...],
    response_history: tuple[tuple[str, ...], ...],
) -> Sequence[str]:
    return transition(
        prompt=example.get("prompt", ""),
        agent_completions=list(joint_action.completions),
        num_agents=len(joint_action.completions),
        prompt_history_per_agent=[[prompt_text(p) for p in h] for h in prompt_history],
        response_history_per_agent=[list(h) for h in response_history],
    )


def build_environment(
    num_agents: int,
    *,
    task: Task | None = None,
    dataset: Sequence[Mapping[str, Any]] | None = None,
    formatters: Sequence[Callable[[Mapping[str, Any]], Any]] | None = None,
    reward_func: Callable[..., Any] | None = None,
    transition: Transition | None = None,
    environment: Environment | None = None,
    split: str = "train",
) -> tuple[Environment, Sequence[Mapping[str, Any]]]:
    """The environment and training examples of a recipe, in one of three forms:

    - ``task``: a :class:`comlrl.core.Task` (:class:`TaskEnvironment`; ``transition``, when
      given, replaces the task's own prompts after the first turn); the examples are
      ``dataset`` or else the task's ``split``;
    - ``environment``: a ready :class:`Environment` (e.g. one joint policy's, or a
      :class:`CallbackEnvironment` subclass); needs ``dataset``;
    - ``formatters`` (one per agent) + ``reward_func`` (+ ``transition`` for later turns):
      CoMLRL's form (:class:`CallbackEnvironment`); needs ``dataset``.

    ``reward_func`` may come with a task or an environment too (a caller records it);
    it is then not played. A ``datasets.Dataset`` is kept as it is; any other iterable of
    examples becomes a list.

    Raises:
        ValueError: two forms, none, a form without ``dataset`` that needs one, or a
            number of formatters other than ``num_agents``.
    """
    if environment is not None:
        if task is not None or formatters is not None or transition is not None:
            raise ValueError(
                "environment= replaces task=, formatters= and transition=; pass one form."
            )
        if dataset is None:
            raise ValueError("environment= needs dataset= (the examples to train on).")
        return environment, _examples(dataset)
    if task is not None:
        if formatters is not None:
            raise ValueError("pass either task= or formatters= + reward_func=, not both.")
        examples = dataset if dataset is not None else list(task.load(split))
        return TaskEnvironment(task, transition), _examples(examples)
    if formatters is None or reward_func is None or dataset is None:
        raise ValueError(
            "without a task, pass dataset=, formatters= (one per agent) and reward_func=."
        )
    if len(formatters) != num_agents:
        raise ValueError(
            f"{len(formatters)} formatters for {num_agents} agents; give one per agent."
        )
    return CallbackEnvironment(formatters, reward_func, transition), _examples(dataset)


def check_environment(
    env: Environment, num_agents: int, num_turns: int, eval_env: Environment | None = None
) -> None:
    """Check that ``env`` (and ``eval_env``, where evaluation plays) is for ``num_agents``
    agents and supports ``num_turns`` turns.

    Raises:
        ValueError: naming the mismatch and what to do.
    """
    if eval_env is not None and eval_env.num_agents != num_agents:
        raise ValueError(
            f"eval_env is for {eval_env.num_agents} agents but {num_agents} agents were given; "
            "evaluate in an environment of the same task."
        )
    if env.num_agents != num_agents:
        raise ValueError(
            f"the task is for {env.num_agents} agents but {num_agents} agents were given."
        )
    if env.max_turns is not None and num_turns > env.max_turns:
        raise ValueError(
            f"num_turns={num_turns} but the task supports at most {env.max_turns} turn(s); "
            "lower num_turns, use a multi-turn task, or pass a transition callback."
        )


def _examples(dataset: Any) -> Sequence[Mapping[str, Any]]:
    return dataset if isinstance(dataset, Sequence) else list(dataset)
