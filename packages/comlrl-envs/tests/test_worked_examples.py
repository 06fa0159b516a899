"""The worked exchanges of each level (``example=<level>`` of tool_math and debate_math):
exact answers, the rendered reply, what ``example=true`` keeps, and bad values."""

from __future__ import annotations

import pytest
from comlrl.core import ChatPrompt
from comlrl.envs import DebateMathTask, ToolMathTask
from comlrl.envs.math import answer_line
from comlrl.envs.math.arithmetic import LEVELS
from comlrl.envs.math.problem_sets import load_problems
from comlrl.envs.math.tool_math import example_messages
from comlrl.envs.math.worked_examples import (
    EXAMPLE_CHOICES,
    WORKED_EXAMPLES,
    example_level,
    worked_example_messages,
)


def test_every_generated_level_has_a_worked_example() -> None:
    assert set(EXAMPLE_CHOICES) == set(LEVELS)


@pytest.mark.parametrize("level", EXAMPLE_CHOICES)
def test_each_example_is_exact_and_its_reply_reads_back_its_answer(level: str) -> None:
    ex = WORKED_EXAMPLES[level]
    assert eval(ex.expression, {"__builtins__": {}}) == ex.answer  # noqa: S307
    tool_reply = ex.reply(use_tool=True)
    assert f"```python\nprint({ex.expression})\n```" in tool_reply
    assert f"```output\n{ex.answer}\n```" in tool_reply
    for reply in (tool_reply, ex.reply(use_tool=False)):
        assert answer_line(reply) == str(ex.answer)


@pytest.mark.parametrize("level", EXAMPLE_CHOICES)
def test_no_example_is_a_problem_of_either_split(level: str) -> None:
    question = WORKED_EXAMPLES[level].question
    for split in ("train", "test"):
        rows = load_problems(level, split, seed=0, num_train=1000, num_eval=200)
        assert all(question not in (row["question"], *row["parts"]) for row in rows)


def test_example_true_keeps_the_mul_exchange_every_prompt_opened_with() -> None:
    for use_tool in (True, False):
        old = example_messages(use_tool)
        task = ToolMathTask("word", use_tool=use_tool, num_train=4, num_eval=4)
        prompt = task.prompts(task.load("test")[0])[0]
        assert isinstance(prompt, ChatPrompt)
        assert list(prompt.messages[1:3]) == old


@pytest.mark.parametrize("level", EXAMPLE_CHOICES)
def test_a_level_name_opens_tool_math_and_debate_prompts_with_that_levels_exchange(
    level: str,
) -> None:
    tm = ToolMathTask("word", example=level, num_train=4, num_eval=4)
    db = DebateMathTask("word", num_agents=2, example=level, num_train=4, num_eval=4)
    for task in (tm, db):
        prompts = task.prompts(task.load("test")[0])
        for prompt in prompts:
            assert isinstance(prompt, ChatPrompt)
            roles = [m["role"] for m in prompt.messages]
            assert roles[:4] == ["system", "user", "assistant", "user"]
            assert prompt.messages[1]["content"].startswith(WORKED_EXAMPLES[level].question)
            assert prompt.messages[2]["content"] == WORKED_EXAMPLES[level].reply(task.use_tool)
            assert prompt.raw is not None and WORKED_EXAMPLES[level].question in prompt.raw


def test_example_false_opens_with_no_exchange() -> None:
    task = ToolMathTask("expr", example=False, num_train=4, num_eval=4)
    prompt = task.prompts(task.load("test")[0])[0]
    assert isinstance(prompt, ChatPrompt)
    assert [m["role"] for m in prompt.messages] == ["system", "user"]
    assert (task.example, task.example_level) == (False, None)


@pytest.mark.parametrize("bad", ["gsm8k", "words", 1, None])
def test_an_unknown_example_fails_at_construction_naming_the_choices(bad: object) -> None:
    for cls in (ToolMathTask, DebateMathTask):
        with pytest.raises(ValueError, match="example must be true, false or a level"):
            cls("mul", example=bad, num_train=2, num_eval=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no worked example for level 'gsm8k'"):
        worked_example_messages("gsm8k", True, "Answer.")


def test_example_level_of_each_accepted_value() -> None:
    assert example_level(True) == "mul"
    assert example_level(False) is None
    assert [example_level(level) for level in EXAMPLE_CHOICES] == list(EXAMPLE_CHOICES)
