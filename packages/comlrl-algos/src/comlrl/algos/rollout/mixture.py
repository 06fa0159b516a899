"""A task mixture as one task: several task suites behind the :class:`comlrl.core.Task`
interface, so the rollout, the update and evaluation need nothing new.

:class:`MixtureTask` loads every task's split and tags each example with the task it came
from (key :data:`MIXTURE_KEY`); prompts and feedback go to that task (with the tag taken
off the example), and a reward call is split by task, scored by each task in one batched
call, and put back in order, each joint action's info naming its task (the same
:data:`MIXTURE_KEY`). Those
infos are what the metrics (``reward/<task>``, :mod:`comlrl.algos.rollout.metrics`) and
evaluation rows (:func:`comlrl.algos.rollout.evaluate.summarize_rollouts`) read. How
often each task is drawn is the data stream's job
(:class:`comlrl.algos.training.run.data_mixture.MixtureStream`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from comlrl.core import Feedback, JointAction, RewardBatch, Task, Tool
from comlrl.core.prompts import Prompt

__all__ = ["MIXTURE_KEY", "MixtureTask", "task_of", "task_reward_sums"]

#: The example key that names the task an example of a mixture came from.
MIXTURE_KEY = "mixture_task"


def task_of(example: Mapping[str, Any]) -> str | None:
    """The mixture task an example came from, or ``None`` for an example of one task."""
    name = example.get(MIXTURE_KEY)
    return name if isinstance(name, str) else None


class MixtureTask(Task):
    """Several tasks for the same agents as one task.

    Every property a runner reads comes from the tasks: prompts, feedback and rewards
    from each example's own task, and the rest as below (a test lists the members of
    :class:`comlrl.core.Task` and checks each).

    Args:
        tasks: ``{name: task}`` in the mixture's order (names as the metrics show them).

    Attributes:
        name: the task names joined by ``+``.
        num_agents: the agents every task is written for.
        max_turns: the smallest ``max_turns`` of the tasks (every task must support the
            run's turns).
        max_new_tokens: the largest new-token budget the tasks declare (each task's
            completions fit in it), ``None`` when none declares one.
        tool_format, max_tool_calls: the tasks' own (every task with tools must agree;
            without tools anywhere, the first task's).

    The tools of agent ``a`` (:meth:`tools`) are those every task gives it: the rollout
    declares one set of tools per agent in every prompt, so a task whose agent has tools
    cannot be mixed with one whose agent has none or others (it would be prompted to use
    tools that never run, or shown tools it was not written for).

    Raises:
        ValueError: no tasks, tasks written for different numbers of agents, or tasks
            whose agents have different tools (names, call format or call limit); the
            message names the tasks.
    """

    def __init__(self, tasks: Mapping[str, Task]) -> None:
        if not tasks:
            raise ValueError("a task mixture needs at least one task")
        agents = {name: int(t.num_agents) for name, t in tasks.items()}
        if len(set(agents.values())) != 1:
            raise ValueError(
                f"the tasks of a mixture must be for the same number of agents, got {agents}"
            )
        self.tasks = dict(tasks)
        self.name = "+".join(self.tasks)
        self.num_agents = next(iter(agents.values()))
        self.max_turns = min(int(t.max_turns) for t in self.tasks.values())
        budgets = [_budget(t) for t in self.tasks.values()]
        self.max_new_tokens = max((b for b in budgets if b is not None), default=None)
        self._tools = _common_tools(self.tasks, self.num_agents)
        with_tools = [
            t for t in self.tasks.values() if any(t.tools(a) for a in range(self.num_agents))
        ]
        first = (with_tools or list(self.tasks.values()))[0]
        self.tool_format = str(first.tool_format)
        self.max_tool_calls = int(first.max_tool_calls)

    def tools(self, agent: int) -> Sequence[Tool]:
        """The tools every task gives agent ``agent`` (the first task's tool objects: the
        tasks agree on their names, format and call limit)."""
        return self._tools[agent]

    def _task(self, example: Mapping[str, Any]) -> tuple[Task, Mapping[str, Any]]:
        name = task_of(example)
        if name not in self.tasks:
            raise ValueError(
                f"example has {MIXTURE_KEY}={name!r}, not one of the mixture's tasks "
                f"{list(self.tasks)}; pass examples of this mixture's load()"
            )
        return self.tasks[name], {k: v for k, v in example.items() if k != MIXTURE_KEY}

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        """Every task's ``split``, each example tagged with its task, interleaved round-robin
        (the first example of each task in the mixture's order, then the second, ...), so
        the first ``n`` examples (``eval_limit``) hold every task.

        Raises:
            ValueError: a task whose ``split`` has no examples (naming it).
        """
        parts: list[list[dict[str, Any]]] = []
        for name, task in self.tasks.items():
            examples = [{**ex, MIXTURE_KEY: name} for ex in task.load(split)]
            if not examples:
                raise ValueError(f"task {name!r} of the mixture has no examples in split {split!r}")
            parts.append(examples)
        longest = max(len(p) for p in parts)
        return [p[i] for i in range(longest) for p in parts if i < len(p)]

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        task, own = self._task(example)
        return task.prompts(own, history)

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        task, own = self._task(example)
        return task.feedback(own, joint_action, info, turn)

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions, each by its example's task (one call per task).

        Returns:
            ``K`` rewards and infos in the order given; every info names its task under
            :data:`MIXTURE_KEY`.
        """
        k = self.check_joint_batch(completions, examples)
        rewards: list[float] = [0.0] * k
        infos: list[dict[str, Any]] = [{} for _ in range(k)]
        groups: dict[str, list[int]] = {}
        own: list[Mapping[str, Any]] = []
        for i, ex in enumerate(examples):
            task, plain = self._task(ex)
            groups.setdefault(task_of(ex) or "", []).append(i)
            own.append(plain)
        for name, idx in groups.items():
            batch = self.tasks[name].reward(
                [[agent[i] for i in idx] for agent in completions], [own[i] for i in idx]
            )
            for pos, i in enumerate(idx):
                rewards[i] = batch.rewards[pos]
                infos[i] = {**batch.infos[pos], MIXTURE_KEY: name}
        return RewardBatch(rewards, infos)

    def close(self) -> None:
        """Close every task (each once, even when one fails; the first failure is raised)."""
        first: BaseException | None = None
        for task in self.tasks.values():
            try:
                task.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first


def _budget(task: Task) -> int | None:
    budget = getattr(task, "max_new_tokens", None)
    return (
        budget if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 else None
    )


def _common_tools(tasks: Mapping[str, Task], num_agents: int) -> list[tuple[Tool, ...]]:
    """Per agent, the tools every task gives it.

    Raises:
        ValueError: two tasks give an agent tools of other names, or their tools are
            called in another format or with another limit.
    """
    out: list[tuple[Tool, ...]] = []
    for a in range(num_agents):
        per_task = {name: tuple(task.tools(a)) for name, task in tasks.items()}
        names = {name: tuple(t.name for t in tools) for name, tools in per_task.items()}
        if len(set(names.values())) > 1:
            given = ", ".join(f"{n} {list(v)}" for n, v in names.items())
            raise ValueError(
                f"the tasks of a mixture give agent {a} different tools ({given}); every "
                "prompt of a run declares the same tools to an agent, so a task would be "
                "prompted to use tools that never run or shown tools it was not written "
                "for. Mix tasks whose agents have the same tools, or train them apart."
            )
        out.append(next(iter(per_task.values())))
    rules = {
        name: (str(t.tool_format), int(t.max_tool_calls))
        for name, t in tasks.items()
        if any(t.tools(a) for a in range(num_agents))
    }
    if len(set(rules.values())) > 1:
        given = ", ".join(
            f"{n}: tool_format={f!r} max_tool_calls={m}" for n, (f, m) in rules.items()
        )
        raise ValueError(
            f"the tasks of a mixture call their tools differently ({given}); the rollout "
            "runs one call format and limit per agent: mix tasks that agree."
        )
    return out


def task_reward_sums(
    infos: Sequence[Mapping[str, Any]], rewards: torch.Tensor
) -> dict[str, list[float]] | None:
    """Per task of a task mixture (the :data:`MIXTURE_KEY` of each joint action's reward info):
    ``[sum of rewards, joint actions]``; None when no info names a task.

    Args:
        infos: ``N * K`` reward infos, node-major (``n * K + j``).
        rewards: ``[N, K]`` rewards of the same joint actions.
    """
    if not infos or not any(isinstance(i, Mapping) and MIXTURE_KEY in i for i in infos):
        return None
    flat = rewards.detach().reshape(-1).float().cpu().tolist()
    sums: dict[str, list[float]] = {}
    for info, r in zip(infos, flat, strict=False):
        name = info.get(MIXTURE_KEY) if isinstance(info, Mapping) else None
        if isinstance(name, str):
            entry = sums.setdefault(name, [0.0, 0.0])
            entry[0] += r
            entry[1] += 1
    return sums
