"""The task (environment) interface and the task registry.

A task suite bundles what a training run needs besides the models: a loader of examples,
one prompt formatter per agent, the joint reward, and (for multi-turn tasks) a transition
that turns a joint action into feedback for the next turn. Suites register under the
entry-point group ``comlrl.tasks`` so that :func:`get_task` finds them by name without the
trainer importing any suite. Writing and registering a task of your own, step by step:
``docs/custom-tasks.md`` in the repository.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from comlrl.core.prompts import Prompt
from comlrl.core.records import Feedback, JointAction
from comlrl.core.reward import RewardBatch, RewardFunctionError
from comlrl.core.tools import Tool

__all__ = [
    "Task",
    "TaskNotFoundError",
    "get_task",
    "available_tasks",
    "ENTRY_POINT_GROUP",
    "ENVS_INSTALL",
    "REGISTER_TASK",
]

ENTRY_POINT_GROUP = "comlrl.tasks"

#: How to install the task suites (``comlrl-envs`` is not on PyPI): from a CoMLRL checkout.
ENVS_INSTALL = (
    "comlrl-envs is not on PyPI; install it from a CoMLRL checkout: "
    "`pip install ./packages/comlrl-core ./packages/comlrl-envs` (docs/install.md)"
)
#: How a task of one's own becomes known by name (``comlrl train task.name=...``).
REGISTER_TASK = (
    "a task of your own is found by name once its package declares it under "
    '[project.entry-points."comlrl.tasks"] in its pyproject.toml and is installed '
    "(docs/custom-tasks.md)"
)


class Task(abc.ABC):
    """A cooperative task for ``num_agents`` agents.

    Subclasses set :attr:`name` and :attr:`num_agents` and implement :meth:`load`,
    :meth:`prompts` and :meth:`reward`. Multi-turn tasks set :attr:`max_turns` above 1 and
    implement :meth:`feedback`; a run plays ``num_turns`` turns (its config, default 1, at
    most :attr:`max_turns`). The reward marks itself batched (``is_joint_reward``), so
    the trainer passes it all ``K`` joint actions of a step at once. A task whose agents
    call tools inside a turn returns them from :meth:`tools` and names the call format its
    prompts teach in :attr:`tool_format` (:mod:`comlrl.core.tools`).
    """

    name: str = ""
    num_agents: int = 2
    max_turns: int = 1
    is_joint_reward: bool = True
    #: the tool-call format (:data:`comlrl.core.tools.TOOL_FORMATS`) for models whose chat
    #: template does not render tools; a template that does uses its own (``"json"``).
    tool_format: str = "json"
    #: the most tool calls one agent may make in one turn; later calls get a ``"limit"``
    #: error result.
    max_tool_calls: int = 4
    #: the new-token budget a completion of this task needs (``None``: it declares none);
    #: a run on a pretrained LLM takes it as its ``max_new_tokens`` unless that is set.
    max_new_tokens: int | None = None

    def tools(self, agent: int) -> Sequence[Tool]:
        """The tools agent ``agent`` (0-based) may call inside a turn (none by default)."""
        return ()

    @abc.abstractmethod
    def load(self, split: str = "train") -> Sequence[Mapping[str, Any]]:
        """Return the examples (dataset rows as mappings) of ``split``."""

    @abc.abstractmethod
    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """Return the ``A`` agents' prompts for ``example``.

        Each prompt is a plain ``str`` (completion-style text) or a
        :class:`~comlrl.core.ChatPrompt` (chat messages for instruct models, with a ``raw``
        text form for base models); see :mod:`comlrl.core.prompts` for how an agent feeds
        either to its model (``prompt_format``: chat template or raw text).

        Args:
            example: one task example.
            history: feedback of earlier turns along this branch of the rollout tree, oldest
                first (empty on turn 0): agent ``a``'s feedback of turn ``t`` is
                ``history[t].texts[a]``.
        """

    @abc.abstractmethod
    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions.

        The trainer calls it once per turn of a step with every joint action of that turn,
        over all the step's prompts (``K = prompts x joint actions per prompt``).

        Args:
            completions: ``A`` sequences of ``K`` completion texts, agent-major:
                ``completions[a][k]`` is agent ``a``'s part of joint action ``k``.
            examples: ``K`` examples (dataset rows): ``examples[k]`` is the one joint
                action ``k`` answers (the same object for the joint actions of one prompt).

        Returns:
            ``RewardBatch(rewards, infos)``: ``K`` finite floats, and optionally ``K`` info
            dicts; :meth:`feedback` gets joint action ``k``'s ``infos[k]``.
        """

    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """:meth:`reward`, checked to return a :class:`RewardBatch`.

        Raises:
            RewardFunctionError: :meth:`reward` returned something else (e.g. a bare list
                of floats); the message says what to return instead.
        """
        batch = self.reward(completions, examples)
        if not isinstance(batch, RewardBatch):
            raise RewardFunctionError(
                f"{type(self).__name__}.reward returned a {type(batch).__name__} "
                f"({str(batch)[:100]}), not a RewardBatch; return "
                "comlrl.core.RewardBatch(rewards=[one float per joint action], infos=[one "
                "dict per joint action, optional])."
            )
        return batch

    def check_joint_batch(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> int:
        """Check the shapes a :meth:`reward` call receives and return ``K``.

        Raises:
            ValueError: when there is not one completion list per agent (``A``), or a list
                does not hold one completion per example (``K``).
        """
        if len(completions) != self.num_agents:
            raise ValueError(
                f"{self.name} has {self.num_agents} agents but got {len(completions)} "
                "completion lists; pass one list of completions per agent."
            )
        k = len(examples)
        if any(len(c) != k for c in completions):
            raise ValueError(
                f"got {[len(c) for c in completions]} completions per agent for {k} examples; "
                "each agent needs exactly one completion per joint action."
            )
        return k

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        """Turn a scored joint action into feedback for the next turn (multi-turn tasks).

        Called for each joint action whose episode goes on; the returned feedback is
        appended to the ``history`` that :meth:`prompts` gets for that joint action's next
        turn.

        Args:
            example: the example the joint action answers.
            joint_action: the scored joint action (``joint_action.completions[a]`` is agent
                ``a``'s text).
            info: the info dict :meth:`reward` returned for it (``RewardBatch.infos[k]``).
            turn: the turn just played, 0-based.

        Returns:
            :class:`Feedback` with one text per agent; ``done=True`` ends the episode.

        Raises:
            NotImplementedError: for single-turn tasks.
        """
        raise NotImplementedError(
            f"task {self.name!r} is single-turn (max_turns={self.max_turns}); it has no feedback."
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (sandbox pools, files). Safe to call twice."""


class TaskNotFoundError(LookupError):
    """No task suite is registered under the requested name."""


def available_tasks() -> dict[str, str]:
    """Return ``{name: "module:attr"}`` for every registered task suite."""
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def get_task(name: str, **kwargs: Any) -> Task:
    """Instantiate the task suite registered as ``name`` with ``kwargs``.

    Raises:
        TaskNotFoundError: when no installed package registers ``name``; the message lists
            the names that are registered and how to install ``comlrl-envs`` from the
            repository (:data:`ENVS_INSTALL`).
    """
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            factory = ep.load()
            task = factory(**kwargs)
            if not isinstance(task, Task):
                raise TypeError(
                    f"entry point {ep.value!r} for task {name!r} built a "
                    f"{type(task).__name__}, not a comlrl.core.Task."
                )
            return task
    known = sorted(available_tasks())
    raise TaskNotFoundError(
        f"no task named {name!r} is registered (registered: {known or 'none'}). "
        f"Install the suite that provides it ({ENVS_INSTALL}), or pass a Task object; "
        f"{REGISTER_TASK}."
    )
