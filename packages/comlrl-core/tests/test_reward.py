from __future__ import annotations

import math
import re

import pytest
from comlrl.core import RewardBatch, RewardFunctionError, as_joint_reward, check_rewards
from hypothesis import given
from hypothesis import strategies as st


def _length_reward(c1: list[str], c2: list[str]) -> list[float]:
    return [float(len(a) + len(b)) for a, b in zip(c1, c2)]


def test_comlrl_form_is_called_once_per_prompt_with_that_prompts_joint_actions() -> None:
    calls: list[tuple[list[str], list[str]]] = []

    def reward(c1: list[str], c2: list[str]) -> list[float]:
        calls.append((c1, c2))
        return _length_reward(c1, c2)

    ex_a, ex_b = {"id": "a"}, {"id": "b"}
    out = as_joint_reward(reward)([["x", "yy", "zzz"], ["1", "2", "3"]], [ex_a, ex_a, ex_b])
    assert out.rewards == [2.0, 3.0, 4.0]
    assert calls == [(["x", "yy"], ["1", "2"]), (["zzz"], ["3"])]


def test_example_and_batch_items_keywords_receive_the_example() -> None:
    seen = {}

    def reward(c1, c2, *, example=None, batch_items=None):  # type: ignore[no-untyped-def]
        seen["example"], seen["batch_items"] = example, batch_items
        return [1.0] * len(c1)

    ex = {"task_id": "T/0"}
    as_joint_reward(reward)([["a"], ["b"]], [ex])
    assert seen == {"example": ex, "batch_items": [ex]}


def test_a_raising_reward_is_reported_with_the_sample() -> None:
    def reward(c1, c2):  # type: ignore[no-untyped-def]
        raise KeyError("boom")

    with pytest.raises(RewardFunctionError, match="raised KeyError") as info:
        as_joint_reward(reward)([["helper code"], ["main code"]], [{"task_id": "HumanEval/7"}])
    assert info.value.completions == ("helper code", "main code")
    assert "HumanEval/7" in str(info.value)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "high"])
def test_non_finite_or_non_numeric_rewards_are_rejected_with_the_sample(bad: object) -> None:
    with pytest.raises(RewardFunctionError, match="joint action #1") as info:
        check_rewards([0.5, bad], [["a", "b"], ["c", "d"]], [{"i": 0}, {"i": 1}])  # type: ignore[list-item]
    assert info.value.completions == ("b", "d")
    assert info.value.example == {"i": 1}


def test_wrong_number_of_rewards_is_rejected() -> None:
    with pytest.raises(RewardFunctionError, match="returned 1 values for 2 joint actions"):
        ex: dict = {}
        as_joint_reward(lambda c1, c2: [1.0])([["a", "b"], ["c", "d"]], [ex, ex])


def test_joint_reward_objects_pass_through_unwrapped() -> None:
    class Batched:
        is_joint_reward = True

        def __call__(self, completions, examples):  # type: ignore[no-untyped-def]
            return RewardBatch([0.0] * len(examples))

    obj = Batched()
    assert as_joint_reward(obj) is obj


def test_non_callable_reward_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be callable"):
        as_joint_reward(3)  # type: ignore[arg-type]


def test_reward_batch_requires_one_info_per_reward() -> None:
    with pytest.raises(ValueError, match="2 rewards but 1 infos"):
        RewardBatch([1.0, 2.0], [{}])


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_check_rewards_keeps_finite_values_exactly(values: list[float]) -> None:
    comps = [["x"] * len(values)]
    assert check_rewards(values, comps, [{}] * len(values)) == values


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("1.0", "(str) for joint action #1, which is not a number; return a number, not text"),
        (True, "(bool) for joint action #1, which is not a number; return 1.0 / 0.0"),
        (None, "(NoneType) for joint action #1, which is not a number"),
        (b"1", "(bytes) for joint action #1"),
    ],
)
def test_strings_bools_and_none_are_not_numbers(bad: object, needle: str) -> None:
    with pytest.raises(RewardFunctionError, match=re.escape(needle)) as info:
        check_rewards([0.5, bad], [["a", "b"], ["c", "d"]], [{"i": 0}, {"i": 1}])  # type: ignore[list-item]
    assert info.value.completions == ("b", "d") and info.value.index == 1


def test_number_like_values_are_accepted() -> None:
    from decimal import Decimal
    from fractions import Fraction

    assert check_rewards([1, Fraction(1, 2), Decimal("0.25")], [["a", "b", "c"]], [{}] * 3) == [
        1.0,
        0.5,
        0.25,
    ]


@pytest.mark.parametrize("returned", [None, "0.5", 7j])
def test_a_reward_function_returning_no_list_is_reported_with_the_sample(returned: object) -> None:
    def reward(c1, c2):  # type: ignore[no-untyped-def]
        return returned

    with pytest.raises(RewardFunctionError, match="instead of a list of 2 floats") as info:
        as_joint_reward(reward)([["x", "y"], ["z", "w"]], [{"task_id": "T/1"}] * 2)
    assert info.value.completions == ("x", "z")
    assert "T/1" in str(info.value)
