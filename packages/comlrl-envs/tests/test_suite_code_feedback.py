"""Multi-turn feedback of the code suites (coop_humaneval here; the others share it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comlrl.core import Feedback, JointAction, prompt_text
from comlrl.envs import CoopHumanEvalTask
from comlrl.envs.code.feedback import MAX_CODE_CHARS, clip, feedback_comment_block, signatures

HELPER_OK = (
    "numbers: List[float]) -> float:\n"
    "    s = sorted(numbers)\n"
    "    return min((b - a for a, b in zip(s, s[1:])), default=float('inf'))\n"
)


@pytest.fixture(scope="module")
def task(humaneval_file: Path) -> Iterator[CoopHumanEvalTask]:
    t = CoopHumanEvalTask(path=humaneval_file, max_workers=2)
    yield t
    t.close()


def turn(task: CoopHumanEvalTask, ex: dict[str, Any], helper: str, main: str) -> Feedback:
    info = task.reward([[helper], [main]], [ex]).infos[0]
    return task.feedback(ex, JointAction((0, 0), (helper, main)), info, turn=0)


def test_failing_input_output_and_code_reach_the_next_prompts(task, rows_by_id) -> None:
    ex = rows_by_id["HumanEval/0"]
    fb = turn(task, ex, HELPER_OK, "    return False\n")
    assert not fb.done and fb.info["status"] == "failed"
    helper_prompt, main_prompt = map(prompt_text, task.prompts(ex, [fb]))
    # the first failing unit of HumanEval/0: its input and the program's own answer
    assert (
        "# Your program: has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) returned False"
        in main_prompt
    )
    assert "# Error: the check failed (its expected value is not shown)" in main_prompt
    assert "tests passed (failed)" in helper_prompt
    assert "return False" in main_prompt and "def aux(numbers" in helper_prompt.split("# Fix")[0]
    # each agent sees its teammate's signatures, not its code
    assert "Your teammate's functions: def aux(numbers: List[float]) -> float" in main_prompt
    # the prompts still end where the agents write
    assert helper_prompt.endswith("def aux(") and main_prompt.endswith(ex["prompt"].lstrip("\n"))


def test_tester_feedback_never_shows_the_expected_values(task, rows_by_id) -> None:
    # Every unit HumanEval/0 fails here expects True: a lookup table of what the feedback
    # shows could not learn one answer from it.
    fb = turn(task, rows_by_id["HumanEval/0"], HELPER_OK, "    return False\n")
    for text in fb.texts:
        assert "True" not in text and "== " not in text and "assert" not in text, text


def test_verbatim_feedback_quotes_the_failing_test_and_warns(humaneval_file, rows_by_id) -> None:
    with pytest.warns(UserWarning, match="expected values"):
        verbatim = CoopHumanEvalTask(path=humaneval_file, max_workers=1, feedback="verbatim")
    try:
        ex = rows_by_id["HumanEval/0"]
        fb = turn(verbatim, ex, HELPER_OK, "    return False\n")
    finally:
        verbatim.close()
    assert (
        "Failing test: assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True" in fb.texts[1]
    )
    assert "Error: AssertionError" in fb.texts[1]


def test_unknown_feedback_mode_is_rejected(humaneval_file) -> None:
    with pytest.raises(ValueError, match="feedback must be one of"):
        CoopHumanEvalTask(path=humaneval_file, feedback="answers")


def test_turn_zero_prompts_are_unchanged(task, rows_by_id) -> None:
    ex = rows_by_id["HumanEval/0"]
    assert task.prompts(ex) == task.prompts(ex, ())
    assert "Feedback" not in prompt_text(task.prompts(ex)[0]) + prompt_text(task.prompts(ex)[1])


def test_solved_joint_action_is_done(task, rows_by_id) -> None:
    fb = turn(task, rows_by_id["HumanEval/0"], HELPER_OK, "    return aux(numbers) < threshold\n")
    assert fb.done and fb.info["status"] == "passed"
    assert len(fb.texts) == 2


def test_load_errors_are_reported(task, rows_by_id) -> None:
    ex = rows_by_id["HumanEval/0"]
    fb = turn(task, ex, "numbers):\n    return 1 / 0\n", "    return aux(numbers)\nx = 1 / 0\n")
    assert not fb.done
    assert "ZeroDivisionError" in fb.texts[1] or "error" in fb.texts[1]


def test_feedback_is_capped(task, rows_by_id) -> None:
    ex = rows_by_id["HumanEval/0"]
    long_body = "".join(f"    x{i} = {i}\n" for i in range(400)) + "    return False\n"
    fb = turn(task, ex, HELPER_OK, long_body)
    assert len(fb.texts[1]) < MAX_CODE_CHARS + 1200
    assert fb.texts[1].count("x399") == 0


def test_helpers() -> None:
    assert clip("abc", 10) == "abc" and clip("x" * 50, 10).endswith(" ...")
    assert len(clip("x" * 50, 10)) <= 10
    assert signatures("class A:\n    def f(self, x):\n        pass\ndef g(a, b=1): pass") == [
        "def f(self, x)",
        "def g(a, b=1)",
    ]
    assert feedback_comment_block((), 0) == ""
    block = feedback_comment_block([Feedback(("a\nb", "c"))], 0)
    assert "# a\n# b\n" in block and "c" not in block.replace("# Fix", "").split("# a")[1][:5]


def test_max_turns_argument(humaneval_file: Path) -> None:
    assert CoopHumanEvalTask(path=humaneval_file).max_turns == 4
    assert CoopHumanEvalTask(path=humaneval_file, max_turns=1).max_turns == 1


def test_mask_expected_hides_constants_and_keeps_the_program_and_its_inputs() -> None:
    from comlrl.envs.code.feedback import mask_expected

    src = (
        "def test_x(self):\n"
        "    t = Tracker()\n"
        "    t.add('a', datetime.datetime(2024, 1, 2))\n"
        "    expected = [{'name': 'a', 'at': datetime.datetime(2024, 1, 2, 1, 0)}]\n"
        "    self.assertEqual(t.items(), expected)\n"
        "    self.assertEqual(len(t.items()), 17)\n"
        "    self.assertIn('zz-top', t.names())\n"
        "    self.assertAlmostEqual(t.score(-3), -1.5)\n"
    )
    masked = mask_expected(src, ("Tracker",))
    for kept in ("t = Tracker()", "t.add('a', datetime.datetime(2024, 1, 2))", "t.score(-3)"):
        assert kept in masked, masked
    for hidden in ("1, 0)", "17", "zz-top", "-1.5"):
        assert hidden not in masked, masked
    assert "expected = ..." in masked and "self.assertEqual(t.items(), expected)" in masked
    assert mask_expected("def broken(:") == "def broken(:"
