from __future__ import annotations

import pytest
from comlrl.core import JointAction, RewardBatch, Task, TaskNotFoundError, get_task


class EchoTask(Task):
    name = "echo"
    num_agents = 2

    def load(self, split: str = "train"):  # type: ignore[no-untyped-def]
        return [{"q": "hi"}]

    def prompts(self, example, history=()):  # type: ignore[no-untyped-def]
        return [example["q"], example["q"] + "!"]

    def reward(self, completions, examples):  # type: ignore[no-untyped-def]
        return RewardBatch([float(a == b) for a, b in zip(*completions)])


def test_a_task_is_its_own_batched_reward() -> None:
    task = EchoTask()
    assert task([["a", "b"], ["a", "c"]], [{}, {}]).rewards == [1.0, 0.0]
    assert task.is_joint_reward


def test_single_turn_task_has_no_feedback() -> None:
    with pytest.raises(NotImplementedError, match="single-turn"):
        EchoTask().feedback({}, JointAction((0, 0), ("a", "b")), {}, 0)


def test_unknown_task_names_what_is_registered_and_what_to_install() -> None:
    with pytest.raises(
        TaskNotFoundError,
        match=r"no task named 'no-such-task'.*not on PyPI.*pip install ./packages/comlrl-core "
        r"./packages/comlrl-envs",
    ):
        get_task("no-such-task")


def test_check_joint_batch_names_the_shape_that_is_wrong() -> None:
    import pytest
    from comlrl.core import RewardBatch, Task

    class Two(Task):
        name, num_agents = "two", 2

        def load(self, split="train"):  # type: ignore[no-untyped-def]
            return []

        def prompts(self, example, history=()):  # type: ignore[no-untyped-def]
            return ["a", "b"]

        def reward(self, completions, examples):  # type: ignore[no-untyped-def]
            return RewardBatch([0.0] * self.check_joint_batch(completions, examples))

    task = Two()
    assert task.reward([["x", "y"], ["z", "w"]], [{}, {}]).rewards == [0.0, 0.0]
    with pytest.raises(ValueError, match="two has 2 agents but got 1 completion lists"):
        task.reward([["x"]], [{}])
    with pytest.raises(ValueError, match=r"got \[2, 1\] completions per agent for 2 examples"):
        task.reward([["x", "y"], ["z"]], [{}, {}])


def test_a_reward_that_returns_a_bare_list_is_told_to_return_a_reward_batch() -> None:
    from comlrl.core import RewardFunctionError, as_joint_reward

    class Bare(EchoTask):
        def reward(self, completions, examples):  # type: ignore[no-untyped-def]
            return [1.0] * len(examples)

    with pytest.raises(RewardFunctionError, match=r"Bare.reward returned a list .*RewardBatch"):
        as_joint_reward(Bare())([["a"], ["b"]], [{}])


def test_unknown_task_says_how_to_register_your_own() -> None:
    with pytest.raises(TaskNotFoundError, match=r'entry-points."comlrl.tasks".*custom-tasks.md'):
        get_task("no-such-task")


def test_feedback_needs_one_text_per_agent_not_one_string() -> None:
    from comlrl.core import Feedback

    assert Feedback(texts=("a", "b")).texts == ("a", "b")
    with pytest.raises(TypeError, match="one string per agent"):
        Feedback(texts="try again")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="one string per agent"):
        Feedback(texts=("ok", None))  # type: ignore[arg-type]
