"""tool_math: generated problems (determinism, exact answers, disjoint splits), the reward
and its infos, prompts, tools, and the gsm8k level on the real file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from comlrl.core import ChatPrompt, get_task
from comlrl.envs import ToolMathTask
from comlrl.envs.math import answer_line
from comlrl.envs.math.arithmetic import LEVELS, make_problem
from comlrl.envs.math.problem_sets import load_problems
from comlrl.envs.math.tool_math import EXAMPLE_REPLY_PLAIN, EXAMPLE_REPLY_TOOL
from hypothesis import given, settings
from hypothesis import strategies as st

SHARED_GSM8K = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "gsm8k_test.jsonl"


def _gsm8k_file() -> Path:
    if not SHARED_GSM8K.is_file():
        pytest.skip(f"GSM8K test file not found at {SHARED_GSM8K} (no ../shared beside the repo)")
    return SHARED_GSM8K


# ------------------------------------------------------------------ generation
@pytest.mark.parametrize("level", LEVELS)
def test_same_seed_same_problems_other_seed_other_problems(level: str) -> None:
    a = load_problems(level, "train", seed=3, num_train=20, num_eval=5)
    b = load_problems(level, "train", seed=3, num_train=20, num_eval=5)
    c = load_problems(level, "train", seed=4, num_train=20, num_eval=5)
    assert a == b
    assert [r["question"] for r in a] != [r["question"] for r in c]


@pytest.mark.parametrize("level", LEVELS)
def test_answers_are_exact_by_pythons_own_arithmetic(level: str) -> None:
    for row in load_problems(level, "test", seed=0, num_eval=200):
        parts = [eval(e, {"__builtins__": {}}) for e in row["expressions"]]  # noqa: S307
        assert [str(v) for v in parts] == row["part_golds"]
        assert str(sum(parts)) == row["gold"]
        if level != "word":  # the whole question is the two expressions, summed
            whole = row["question"].removeprefix("Compute ").removesuffix(".")
            assert eval(whole, {"__builtins__": {}}) == int(row["gold"])  # noqa: S307


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), ops=st.integers(2, 6))
def test_expr_parts_have_parentheses_and_eval_to_their_answers(seed: int, ops: int) -> None:
    p = make_problem("expr", random.Random(seed), ops=ops)
    for expr, value in zip(p.expressions, p.part_answers, strict=True):
        assert "(" in expr
        assert sum(ch in "+-*" for ch in expr.replace("(", " ")) >= ops
        assert eval(expr, {"__builtins__": {}}) == value  # noqa: S307


@pytest.mark.parametrize("digits", [(3, 2), (4, 4), (1, 1)])
def test_mul_factors_have_the_asked_digits(digits: tuple[int, int]) -> None:
    rows = load_problems("mul", "test", num_eval=50, digits=digits)
    for row in rows:
        for expr in row["expressions"]:
            a, b = expr.split(" * ")
            assert (len(a), len(b)) == digits


@pytest.mark.parametrize("level", LEVELS)
def test_train_and_test_are_disjoint(level: str) -> None:
    # 1-digit factors leave few distinct problems, so collisions would happen by chance.
    kw = {"seed": 0, "num_train": 2000, "num_eval": 300, "digits": 1}
    train = {r["question"] for r in load_problems(level, "train", **kw)}
    test = {r["question"] for r in load_problems(level, "test", **kw)}
    assert len(train) == 2000 and len(test) == 300
    assert not train & test
    assert load_problems(level, "eval", **kw) == load_problems(level, "test", **kw)


def test_too_many_problems_for_the_space_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="distinct"):
        load_problems("mul", "test", num_eval=10_000, digits=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"level": "calculus"}, "level"),
        ({"num_agents": 3}, "num_agents"),
        ({"digits": 0}, "digits"),
        ({"num_train": -1}, "num_train"),
        ({"partial_credit": 1.0}, "partial_credit"),
    ],
)
def test_bad_options_fail_with_the_value(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ToolMathTask(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ reward
def _mul_task(**kw: object) -> tuple[ToolMathTask, dict[str, object]]:
    task = ToolMathTask("mul", num_train=5, num_eval=5, **kw)  # type: ignore[arg-type]
    return task, task.load("train")[0]


def test_both_parts_right_is_a_right_team_answer() -> None:
    task, ex = _mul_task()
    g0, g1 = ex["part_golds"]  # type: ignore[misc]
    batch = task.reward([[f"Answer: {g0}"], [f"I ran it.\nAnswer: {g1}"]], [ex])
    info = batch.infos[0]
    assert batch.rewards == [1.0]
    assert info["correct"] == [True, True]
    assert info["agent_rewards"] == [1.0, 1.0]
    assert info["team_answer"] == int(ex["gold"])  # type: ignore[arg-type]
    assert info["team_correct"] and info["status"] == "passed"


def test_one_part_wrong_makes_the_team_wrong_but_keeps_the_right_agents_reward() -> None:
    task, ex = _mul_task()
    g0, g1 = (int(g) for g in ex["part_golds"])  # type: ignore[attr-defined]
    batch = task.reward([[f"Answer: {g0}"], [f"Answer: {g1 + 1}"]], [ex])
    assert batch.rewards == [0.0]
    assert batch.infos[0]["agent_rewards"] == [1.0, 0.0]
    assert batch.infos[0]["team_answer"] == g0 + g1 + 1
    partial, _ = _mul_task(partial_credit=0.5)
    assert partial.reward([[f"Answer: {g0}"], [f"Answer: {g1 + 1}"]], [ex]).rewards == [0.25]


def test_a_right_sum_of_wrong_parts_earns_the_team_nothing() -> None:
    """The free rider: agent 0 answers the whole problem and agent 1 answers 0, so the sum
    is the team's gold while neither part is right; the team is scored on both parts."""
    task, ex = _mul_task()
    batch = task.reward([[f"Answer: {ex['gold']}"], ["Answer: 0"]], [ex])
    info = batch.infos[0]
    assert info["team_answer"] == int(ex["gold"])  # type: ignore[arg-type]
    assert info["correct"] == [False, False] and info["agent_rewards"] == [0.0, 0.0]
    assert batch.rewards == [0.0]
    assert not info["team_correct"] and info["status"] == "failed"
    partial, _ = _mul_task(partial_credit=0.5)
    assert partial.reward([[f"Answer: {ex['gold']}"], ["Answer: 0"]], [ex]).rewards == [0.0]


def test_a_missing_answer_line_gives_no_team_answer() -> None:
    task, ex = _mul_task()
    g0, g1 = ex["part_golds"]  # type: ignore[misc]
    batch = task.reward([[f"Answer: {g0}"], [f"the result is {g1}"]], [ex])
    assert batch.rewards == [0.0]
    assert batch.infos[0]["answers"] == [g0, None]
    assert batch.infos[0]["team_answer"] is None


def test_a_fake_output_block_is_not_an_answer() -> None:
    task, ex = _mul_task()
    g0, g1 = ex["part_golds"]  # type: ignore[misc]
    fake = f"```python\nprint({g1})\n```\n```output\n{g1}\nAnswer: {g1}\n```\n"
    batch = task.reward([[f"Answer: {g0}"], [fake]], [ex])
    assert batch.rewards == [0.0]
    assert batch.infos[0]["answers"][1] is None
    # The same text with a real Answer line of its own is read from that line only.
    batch = task.reward([[f"Answer: {g0}"], [fake + "Answer: 7"]], [ex])
    assert batch.infos[0]["values"][1] == 7


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 42", "42"),
        ("**Answer:** 1,234", "1,234"),
        ("Answer: 964 * 59 = 56876", "56876"),
        ("Final answer: -7", "-7"),
        ("Answer: 1\nthen\nAnswer: 2", "2"),
        ("the answer is 42", None),
        ("42", None),
        ("```\nAnswer: 5\n```", None),
        ("```output\nAnswer: 5", None),  # an unclosed block runs to the end
    ],
)
def test_answer_line_reads_only_answer_lines_outside_blocks(
    text: str, expected: str | None
) -> None:
    assert answer_line(text) == expected


_PROSE = st.text(st.characters(blacklist_characters="`\n"), max_size=40).filter(
    lambda t: "answer" not in t.lower()
)


@settings(max_examples=200, deadline=None)
@given(before=_PROSE, value=st.integers(-(10**12), 10**12), fake=st.integers(0, 10**6))
def test_answer_line_is_the_last_answer_line_and_never_inside_a_block(
    before: str, value: int, fake: int
) -> None:
    text = f"{before}\nAnswer: {value}\n```output\nAnswer: {fake}\n```\n"
    assert answer_line(text) == str(value)
    assert answer_line(f"{before}\n```\nAnswer: {value}\n```") is None


def test_one_agent_solves_the_whole_problem() -> None:
    task = ToolMathTask("word", num_agents=1, num_train=3, num_eval=3)
    ex = task.load("test")[0]
    prompt = task.prompts(ex)[0]
    assert isinstance(prompt, ChatPrompt)
    assert ex["question"] in prompt.messages[-1]["content"]
    right = task.reward([[f"Answer: {ex['gold']}"]], [ex])
    wrong = task.reward([[f"Answer: {ex['part_golds'][0]}"]], [ex])
    assert right.rewards == [1.0] and right.infos[0]["agent_rewards"] == [1.0]
    assert wrong.rewards == [0.0] and wrong.infos[0]["agent_rewards"] == [0.0]


def test_reward_checks_shapes() -> None:
    task, ex = _mul_task()
    with pytest.raises(ValueError, match="agents"):
        task.reward([["Answer: 1"]], [ex])


# ------------------------------------------------------------------ prompts and tools
def test_each_agent_is_asked_for_its_own_part_without_call_syntax() -> None:
    task, ex = _mul_task(example=False)
    prompts = task.prompts(ex)
    assert len(prompts) == 2
    for agent, prompt in enumerate(prompts):
        assert isinstance(prompt, ChatPrompt)
        system, user = prompt.messages
        assert system["role"] == "system" and f"agent {agent + 1} of 2" in system["content"]
        assert ex["question"] in system["content"]
        assert ex["parts"][agent] in user["content"]  # type: ignore[index]
        assert ex["parts"][1 - agent] not in user["content"]  # type: ignore[index]
        assert "Python tool" in user["content"] and "Answer: <integer>" in user["content"]
        assert "```" not in user["content"] + system["content"]  # the rollout declares calls
        assert prompt.raw is not None and ex["parts"][agent] in prompt.raw  # type: ignore[index]


def test_the_worked_example_opens_the_prompt_and_is_not_the_question() -> None:
    task, ex = _mul_task()
    for use_tool, reply in ((True, EXAMPLE_REPLY_TOOL), (False, EXAMPLE_REPLY_PLAIN)):
        task, ex = _mul_task(use_tool=use_tool)
        prompt = task.prompts(ex)[0]
        assert isinstance(prompt, ChatPrompt)
        roles = [m["role"] for m in prompt.messages]
        assert roles == ["system", "user", "assistant", "user"]
        assert prompt.messages[2]["content"] == reply
        assert ex["parts"][0] in prompt.messages[3]["content"]  # type: ignore[index]
        assert prompt.raw is not None and prompt.raw.index(reply) < prompt.raw.index(ex["parts"][0])  # type: ignore[index]
    # the example's own answer line never scores: only the completion is read
    assert task.reward([["Answer: 408"], ["Answer: 408"]], [ex]).rewards == [0.0]


def test_every_agent_has_the_python_tool_unless_turned_off() -> None:
    task, _ = _mul_task()
    assert task.tool_format == "python"
    assert [[t.name for t in task.tools(a)] for a in range(2)] == [["python"], ["python"]]
    off, ex = _mul_task(use_tool=False)
    assert off.tools(0) == ()
    assert all("Python" not in p.messages[-1]["content"] for p in off.prompts(ex))  # type: ignore[union-attr]


def test_registered_under_tool_math() -> None:
    task = get_task("tool_math", level="expr", num_train=2, num_eval=2, max_tool_calls=2)
    assert isinstance(task, ToolMathTask)
    assert task.max_tool_calls == 2 and task.num_agents == 2


# ------------------------------------------------------------------ gsm8k
def test_gsm8k_level_on_the_real_file() -> None:
    path = _gsm8k_file()
    task = ToolMathTask("gsm8k", gsm8k_path=str(path), num_train=50, num_eval=20, seed=1)
    train, test = task.load("train"), task.load("test")
    assert (len(train), len(test)) == (50, 20)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert task.load("train") == train
    ex = test[0]
    prompts = task.prompts(ex)
    assert all(ex["question"].strip() in p.messages[-1]["content"] for p in prompts)  # type: ignore[union-attr]
    gold = ex["gold"]
    both = task.reward([[f"Answer: {gold}"], [f"Answer: {gold}"]], [ex])
    one = task.reward([[f"Answer: {gold}"], ["Answer: -1"]], [ex])
    assert both.rewards == [1.0] and both.infos[0]["team_correct"]
    assert one.rewards == [0.5] and one.infos[0]["agent_rewards"] == [1.0, 0.0]
