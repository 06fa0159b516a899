"""A task whose reward is scored on remote workers while everything else stays local."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.core import Feedback, JointAction, Prompt, RewardBatch, Task, Tool
from comlrl.envs.remote._protocol import WorkerAddress
from comlrl.envs.remote.client import RemoteReward

__all__ = ["RemoteRewardTask"]


class RemoteRewardTask(Task):
    """A task whose reward is scored on remote workers; everything else stays local.

    Loading, prompts, feedback and tools (with their call format and per-turn limit;
    tool calls run locally, inside the rollout) are the wrapped task's (the suites'
    feedback is a pure function of the example, the joint action and the reward info,
    which the workers return); :meth:`reward` goes to :class:`RemoteReward`.

    Args:
        task: the local task (its sandbox is never started by this wrapper).
        workers: ``"host:port"`` addresses of workers serving ``task.name``.
        task_kwargs: the options ``task`` was built with, checked against the workers'.
        **options: :class:`RemoteReward` options (``timeout_s``, ``max_attempts``, ...).

    Raises:
        As :class:`RemoteReward` (an unreachable worker set, a worker serving another task).
    """

    def __init__(
        self,
        task: Task,
        workers: Sequence[str | WorkerAddress],
        *,
        task_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self.local = task
        self.name = task.name
        self.num_agents = task.num_agents
        self.max_turns = task.max_turns
        self.tool_format = task.tool_format
        self.max_tool_calls = task.max_tool_calls
        self.remote = RemoteReward(
            workers,
            task_name=task.name,
            num_agents=task.num_agents,
            expect_kwargs=task_kwargs,
            **options,
        )

    def load(self, split: str = "train") -> Sequence[Mapping[str, Any]]:
        """The wrapped task's examples of ``split``."""
        return self.local.load(split)

    def tools(self, agent: int) -> Sequence[Tool]:
        """The wrapped task's tools of agent ``agent`` (they run locally)."""
        return self.local.tools(agent)

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """The wrapped task's prompts."""
        return self.local.prompts(example, history)

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions on the workers (see :meth:`RemoteReward.__call__`)."""
        return self.remote(completions, examples)

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        """The wrapped task's feedback on the remotely scored joint action."""
        return self.local.feedback(example, joint_action, info, turn)

    def close(self) -> None:
        """Close the wrapped task. Safe to call twice."""
        self.local.close()

    def __getattr__(self, name: str) -> Any:
        # task-specific helpers (e.g. reference_program) come from the wrapped task
        if name == "local":
            raise AttributeError(name)
        return getattr(self.local, name)
