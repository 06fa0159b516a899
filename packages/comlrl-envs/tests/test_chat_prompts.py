"""Chat prompts of the code suites, the multi-turn conversation, and the roles in extraction."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comlrl.core import ChatPrompt, Feedback, JointAction, chat_messages, prompt_text
from comlrl.envs import CoopHumanEvalTask
from comlrl.envs.code.chat_prompts import RETRY_REQUEST, continue_conversation, helper_messages

HELPER_ANSWER = """Here is the helper:

```python
def aux(numbers):
    s = sorted(numbers)
    return min(b - a for a, b in zip(s, s[1:]))

def has_close_elements(numbers, threshold):
    return False
```

Example: `aux([1.0, 2.0])` gives 1.0."""

MAIN_ANSWER = """```python
from typing import List


def aux(numbers):
    return 0.0


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    return aux(numbers) < threshold


print(has_close_elements([1.0, 2.0], 0.5))
```
This calls the helper."""


@pytest.fixture(scope="module")
def task(humaneval_file: Path) -> Iterator[CoopHumanEvalTask]:
    t = CoopHumanEvalTask(path=humaneval_file, max_workers=2)
    yield t
    t.close()


def test_turn_zero_chat_prompts_give_each_agent_its_role(task, rows_by_id) -> None:
    ex = rows_by_id["HumanEval/0"]
    helper, main = task.prompts(ex)
    assert isinstance(helper, ChatPrompt) and isinstance(main, ChatPrompt)
    (h_sys, h_user), (m_sys, m_user) = chat_messages(helper), chat_messages(main)
    assert [h_sys["role"], h_user["role"]] == ["system", "user"]
    assert "You write a helper function named `aux`" in h_sys["content"]
    assert "You write the function `has_close_elements`" in m_sys["content"]
    # agent 1 is told the problem in words (signature + docstring) and the answer's shape
    assert h_user["content"].startswith(
        "Your teammate's function `has_close_elements(numbers: List[float], threshold: "
        "float) -> bool`:\nCheck if in given list of numbers"
    )
    assert "Reply with only the function `aux`" in h_user["content"]
    assert "```python\ndef aux(...):" in h_user["content"]
    assert "(not `has_close_elements` itself)" in h_user["content"]
    assert "```python\nfrom typing import List" in m_user["content"]
    assert "Write the whole function `has_close_elements`" in m_user["content"]
    assert "do not define it" in m_user["content"]
    # base models keep the completion-style texts
    assert prompt_text(helper).endswith("def aux(")
    assert prompt_text(main).endswith(ex["prompt"].lstrip("\n"))


def test_feedback_turns_continue_the_conversation(task, rows_by_id) -> None:
    ex = rows_by_id["HumanEval/0"]
    info = task.reward([[HELPER_ANSWER], ["    return False\n"]], [ex]).infos[0]
    fb = task.feedback(ex, JointAction((0, 0), (HELPER_ANSWER, "    return False\n")), info, 0)
    assert fb.info["completions"] == (HELPER_ANSWER, "    return False\n")
    helper, main = task.prompts(ex, [fb])
    first = task.prompts(ex)
    for agent, prompt in enumerate((helper, main)):
        messages = chat_messages(prompt)
        assert messages[:2] == chat_messages(first[agent])
        assert [m["role"] for m in messages[2:]] == ["assistant", "user"]
        assert messages[2]["content"] == fb.info["completions"][agent]
        assert fb.texts[agent] in messages[3]["content"]
        assert messages[3]["content"].endswith(RETRY_REQUEST)
    # base models: the rebuilt text with the feedback as comments (unchanged behaviour)
    assert "# Feedback on your team's previous attempt:" in prompt_text(main)
    assert prompt_text(helper).endswith("def aux(")
    # a second turn adds one more assistant/user pair
    again = task.prompts(ex, [fb, fb])
    assert [m["role"] for m in chat_messages(again[1])] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


def test_helper_prompt_falls_back_to_the_code_when_there_is_no_docstring() -> None:
    prompt = helper_messages("def f(x):\n    pass\n", "f", "aux", raw="def aux(")
    assert "`f(...)`:\n```python\ndef f(x):\n    pass\n```" in chat_messages(prompt)[1]["content"]
    assert prompt.raw == "def aux("


def test_feedback_without_completions_is_folded_into_the_user_message() -> None:
    first = ChatPrompt(
        ({"role": "system", "content": "S"}, {"role": "user", "content": "U"}), raw="r"
    )
    fb = Feedback(("note for agent 0", "note for agent 1"))
    prompt = continue_conversation(first, [fb], 1, raw="rebuilt")
    messages = chat_messages(prompt)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert (
        messages[1]["content"].startswith("U\n\n") and "note for agent 1" in messages[1]["content"]
    )
    assert prompt.raw == "rebuilt"
    assert continue_conversation(first, [], 0, raw="r0") == ChatPrompt(first.messages, "r0")


def test_roles_agent_one_aux_wins_and_no_one_writes_the_others_function(task, rows_by_id) -> None:
    ex = rows_by_id["HumanEval/0"]
    helper_code = task.extract_helper(HELPER_ANSWER, ex["entry_point"])
    main_code = task.extract_main(MAIN_ANSWER, ex)
    assert "def aux(numbers)" in helper_code and "has_close_elements" not in helper_code
    assert "def has_close_elements" in main_code and "def aux" not in main_code
    assert "print(" not in main_code and "from typing import List" in main_code
    program, flags = task.build_program(HELPER_ANSWER, MAIN_ANSWER, ex)
    assert flags == {"helper_defined": True, "main_defined": True}
    assert [n.name for n in ast.parse(program).body if isinstance(n, ast.FunctionDef)] == [
        "aux",
        "has_close_elements",
    ]
    batch = task.reward([[HELPER_ANSWER], [MAIN_ANSWER]], [ex])
    assert batch.infos[0]["calls_helper"] and batch.rewards[0] == pytest.approx(1.0)


def _classeval_row(shared_data: Path) -> dict[str, Any]:
    from comlrl.envs import ClassEvalTask

    path = shared_data / "ClassEval_data.json"
    if not path.is_file():
        pytest.skip(f"ClassEval data not found at {path}")
    return ClassEvalTask(path=path).load("test")[0]


def test_classeval_chat_prompt_names_both_shares() -> None:
    from comlrl.envs import ClassEvalTask

    shared_data = Path(__file__).resolve().parents[3].parent / "shared" / "data"
    row = _classeval_row(shared_data)
    task = ClassEvalTask(path=shared_data / "ClassEval_data.json")
    mine, theirs = row["agent_methods"]
    for agent, prompt in enumerate(task.prompts(row)):
        system, user = chat_messages(prompt)
        assert f"You write the methods `{(mine, theirs)[agent][0]}`" in system["content"]
        assert f"inside `class {row['class_name']}:`" in user["content"]
        assert prompt_text(prompt).endswith(f"class {row['class_name']}:\n")
    # a fenced whole-class answer with prose around it
    first = mine[0]
    answer = (
        f"Sure:\n```python\nclass {row['class_name']}:\n    def __init__(self):\n        pass\n\n"
        f"    def {first}(self, *args):\n        return 1\n```\nDone."
    )
    _, methods, defined = task.extract_methods(answer, row, 0)
    assert defined == [first] and len(methods) == 1
