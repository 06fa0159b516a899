"""Task mixtures: the weighted, resumable example stream and the mixture as one task."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import torch
from comlrl.algos.rollout.mixture import MIXTURE_KEY, MixtureTask, task_of, task_reward_sums
from comlrl.algos.training.config.task import TaskConfig
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.data_mixture import MixtureStream
from comlrl.core import Feedback, JointAction, RewardBatch, Task, Tool


def _dataset(sizes: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"id": f"{n}/{i}", MIXTURE_KEY: n} for n, k in sizes.items() for i in range(k)]


def test_tasks_are_drawn_by_weight_and_each_task_walks_its_own_epochs() -> None:
    stream = MixtureStream(_dataset({"a": 7, "b": 5}), {"a": 3.0, "b": 1.0}, task_of, seed=1)
    drawn = [ex["id"] for _ in range(500) for ex in stream.next_batch(8)]
    counts = Counter(i.split("/")[0] for i in drawn)
    # 4000 draws at p=0.75: sd 0.0068, so 0.03 is more than 4 sd (and the seed is fixed)
    assert abs(counts["a"] / len(drawn) - 0.75) < 0.03, counts
    assert stream.drawn == dict(counts)
    a = [i for i in drawn if i.startswith("a/")]
    for epoch in range(3):  # every epoch of task a hands out each of its 7 examples once
        assert sorted(a[7 * epoch : 7 * (epoch + 1)]) == [f"a/{i}" for i in range(7)]


def test_a_restored_stream_continues_exactly_where_the_saved_one_stood() -> None:
    data = _dataset({"a": 5, "b": 3, "c": 4})
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    run = MixtureStream(data, weights, task_of, seed=0)
    for _ in range(7):
        run.next_batch(3)
    buffer = io.BytesIO()
    torch.save(run.state_dict(), buffer)  # as the step checkpoint stores it
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    expected = [ex["id"] for _ in range(10) for ex in run.next_batch(3)]
    resumed = MixtureStream(data, weights, task_of, seed=0)
    resumed.load_state_dict(state)
    assert [ex["id"] for _ in range(10) for ex in resumed.next_batch(3)] == expected
    fresh = MixtureStream(data, weights, task_of, seed=0)
    assert [ex["id"] for _ in range(10) for ex in fresh.next_batch(3)] != expected


def test_a_stream_refuses_the_state_of_another_stream() -> None:
    data = _dataset({"a": 2, "b": 2})
    stream = MixtureStream(data, {"a": 1.0, "b": 1.0}, task_of)
    with pytest.raises(ValueError, match="not this mixture"):
        stream.load_state_dict(DataStream(data).state_dict())
    other = MixtureStream(data, {"a": 2.0, "b": 1.0}, task_of)
    with pytest.raises(ValueError, match="not this mixture"):
        stream.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="no weight"):
        MixtureStream(data, {"a": 1.0}, task_of)
    with pytest.raises(ValueError, match="no examples"):
        MixtureStream(data, {"a": 1.0, "b": 1.0, "c": 1.0}, task_of)


class _Const(Task):
    """Two agents; reward = ``value`` + the example's number; prompts name the task."""

    num_agents = 2

    def __init__(self, name: str, value: float, size: int = 2, agents: int = 2) -> None:
        self.name, self.value, self.size, self.num_agents = name, value, size, agents
        self.seen: list[Mapping[str, Any]] = []
        self.closed = False

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        return [{"n": i} for i in range(self.size)]

    def prompts(self, example: Mapping[str, Any], history: Sequence[Any] = ()) -> list[Any]:
        self.seen.append(example)
        return [f"{self.name} {example['n']} agent {a}" for a in range(self.num_agents)]

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        self.seen.extend(examples)
        return RewardBatch(
            [self.value + ex["n"] for ex in examples], [{"n": ex["n"]} for ex in examples]
        )

    def close(self) -> None:
        self.closed = True


def test_the_mixture_task_routes_prompts_and_rewards_to_each_examples_task() -> None:
    a, b = _Const("a", 10.0, size=3), _Const("b", 20.0, size=1)
    mix = MixtureTask({"a": a, "b": b})
    assert (mix.name, mix.num_agents) == ("a+b", 2)
    examples = mix.load("train")
    assert [(task_of(e), e["n"]) for e in examples] == [("a", 0), ("b", 0), ("a", 1), ("a", 2)]
    assert mix.prompts(examples[1]) == ["b 0 agent 0", "b 0 agent 1"]
    order = [examples[2], examples[1], examples[0]]
    batch = mix.reward([["x"] * 3, ["y"] * 3], order)
    assert batch.rewards == [11.0, 20.0, 10.0]
    assert [i[MIXTURE_KEY] for i in batch.infos] == ["a", "b", "a"]
    assert all(MIXTURE_KEY not in ex for ex in a.seen + b.seen)  # tasks get their own rows
    sums = task_reward_sums(batch.infos, torch.tensor([batch.rewards]))
    assert sums == {"a": [21.0, 2.0], "b": [20.0, 1.0]}
    assert task_reward_sums([{}, {}], torch.zeros(1, 2)) is None
    mix.close()
    assert a.closed and b.closed
    with pytest.raises(ValueError, match="same number of agents"):
        MixtureTask({"a": a, "c": _Const("c", 0.0, agents=3)})


def test_a_mixture_config_names_the_tasks_and_rejects_what_it_cannot_mean() -> None:
    cfg = TaskConfig.model_validate(
        {"mixture": [{"name": "coop_story", "weight": 0.5}, {"name": "mbpp", "weight": 0.5}]}
    )
    assert cfg.name == "coop_story+mbpp"
    with pytest.raises(ValueError, match="two entries called 'a'.*its own label"):
        TaskConfig.model_validate({"mixture": [{"name": "a"}, {"name": "a"}]})
    # one task twice, each entry with its own label (and options)
    two = TaskConfig.model_validate(
        {
            "mixture": [
                {"name": "tool_math", "label": "add", "kwargs": {"level": "add"}},
                {"name": "tool_math", "label": "mul", "weight": 3, "kwargs": {"level": "mul"}},
            ]
        }
    )
    assert two.name == "add+mul" and [m.key for m in two.mixture] == ["add", "mul"]
    with pytest.raises(ValueError, match="two entries called 'b'"):
        TaskConfig.model_validate({"mixture": [{"name": "a", "label": "b"}, {"name": "b"}]})
    for bad in ("", " x", "a+b", "a/b"):
        with pytest.raises(ValueError, match="label"):
            TaskConfig.model_validate({"mixture": [{"name": "a", "label": bad}]})
    with pytest.raises(ValueError, match="own entry"):
        TaskConfig.model_validate({"mixture": [{"name": "a"}], "kwargs": {"limit": 2}})
    with pytest.raises(ValueError, match="greater than 0"):
        TaskConfig.model_validate({"mixture": [{"name": "a", "weight": 0}]})


def _echo(code: str) -> str:
    return code


_TOOL = Tool(
    "python", "d", {"type": "object", "properties": {"code": {"type": "string"}}}, run=_echo
)


class _Tooled(_Const):
    """A :class:`_Const` whose agent 0 has a tool, with every other property set."""

    tool_format = "python"
    max_tool_calls = 2

    def __init__(self, name: str, turns: int, budget: int | None, tools: bool = True) -> None:
        super().__init__(name, 0.0)
        self.max_turns, self.max_new_tokens, self.with_tools = turns, budget, tools

    def tools(self, agent: int) -> Sequence[Tool]:
        return (_TOOL,) if agent == 0 and self.with_tools else ()

    def feedback(self, example: Any, joint_action: Any, info: Any, turn: int) -> Feedback:
        return Feedback((f"{self.name} fb", "x"), done=turn > 0)


def test_every_task_member_a_runner_reads_comes_through_a_mixture() -> None:
    a, b = _Tooled("a", turns=3, budget=96), _Tooled("b", turns=2, budget=200)
    mix = MixtureTask({"a": a, "b": b})
    ex = mix.load()
    action = JointAction((0, 0), ("p", "q"))
    checks: dict[str, Callable[[], bool]] = {
        "name": lambda: mix.name == "a+b",
        "num_agents": lambda: mix.num_agents == 2,
        "max_turns": lambda: mix.max_turns == 2,
        "is_joint_reward": lambda: mix.is_joint_reward is True,
        "tool_format": lambda: mix.tool_format == "python",
        "max_tool_calls": lambda: mix.max_tool_calls == 2,
        "max_new_tokens": lambda: mix.max_new_tokens == 200,
        "tools": lambda: (list(mix.tools(0)), list(mix.tools(1))) == ([_TOOL], []),
        "load": lambda: [task_of(e) for e in ex] == ["a", "b", "a", "b"],
        "prompts": lambda: mix.prompts(ex[1]) == ["b 0 agent 0", "b 0 agent 1"],
        "reward": lambda: mix.reward([["x"] * 2, ["y"] * 2], ex[:2]).rewards == [0.0, 0.0],
        "__call__": lambda: mix([["x"], ["y"]], ex[3:]).infos[0][MIXTURE_KEY] == "b",
        "check_joint_batch": lambda: mix.check_joint_batch([["x"], ["y"]], ex[:1]) == 1,
        "feedback": lambda: mix.feedback(ex[1], action, {}, 0).texts[0] == "b fb",
        "close": lambda: (mix.close(), a.closed and b.closed)[1],
    }

    def holds(check: Callable[[], bool]) -> bool:
        try:
            return check()
        except Exception:  # noqa: BLE001 - a member the mixture lacks fails its check
            return False

    failed = [name for name, check in checks.items() if not holds(check)]
    assert failed == []
    members = {n for n in vars(Task) if not n.startswith("_")} | {"__call__"}
    # a member added to Task must be given a check here (and come through MixtureTask)
    assert members == set(checks), sorted(members ^ set(checks))


def test_a_mixture_of_tasks_whose_agents_have_other_tools_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"give agent 0 different tools \(a \['python'\], b \[\]\)"
    ):
        MixtureTask({"a": _Tooled("a", 1, None), "b": _Tooled("b", 1, None, tools=False)})
    other = _Tooled("b", 1, None)
    other.max_tool_calls = 5
    with pytest.raises(ValueError, match="call their tools differently"):
        MixtureTask({"a": _Tooled("a", 1, None), "b": other})
    plain = MixtureTask({"a": _Const("a", 0.0), "b": _Const("b", 0.0)})
    assert plain.tools(0) == () and plain.max_new_tokens is None
