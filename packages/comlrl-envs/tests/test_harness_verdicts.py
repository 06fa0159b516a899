"""Honest verdicts: partial credit per assert, and no credit for the usual tricks.

Every test that runs the sandbox runs with both executor kinds (``"fork"``, ``"exec"``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from comlrl.envs.sandbox import SandboxLimits, check_solution, split_test

_KIND = {"executor": "fork"}


@pytest.fixture(autouse=True, params=["fork", "exec"])
def executor_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    _KIND["executor"] = request.param
    yield request.param
    _KIND["executor"] = "fork"


def lim(**kw: Any) -> SandboxLimits:
    """Sandbox limits for the executor kind under test."""
    return SandboxLimits(executor=_KIND["executor"], **kw)  # type: ignore[arg-type]


TEST = textwrap.dedent(
    """
    METADATA = {"author": "test"}


    def check(candidate):
        assert candidate(1) == 2
        assert candidate(2) == 3
        assert abs(candidate(-1) - 0) < 1e-9
    """
)
GOOD = "def inc(x):\n    return x + 1\n"


def verdict(program: str, test: str = TEST, **kw: Any):  # type: ignore[no-untyped-def]
    v = check_solution(program, test, "inc", lim(timeout_s=5.0), **kw)
    if v.execution is not None and v.execution.isolation:
        assert v.execution.isolation.get("executor") == _KIND["executor"]
    return v


def test_correct_program_passes_every_assert() -> None:
    v = verdict(GOOD)
    assert (v.status, v.passed, v.total) == ("passed", 3, 3)
    assert v.fraction == 1.0 and v.program_loaded


def test_partial_credit_counts_asserts_separately() -> None:
    v = verdict("def inc(x):\n    return 2 if x == 1 else 0\n")
    assert (v.status, v.passed, v.total) == ("failed", 2, 3)  # asserts 1 and 3 pass
    assert v.errors and v.errors[0].startswith("assert #2")


def test_hanging_assert_fails_alone_with_a_unit_timeout() -> None:
    program = "def inc(x):\n    while x == 2:\n        pass\n    return x + 1\n"
    v = verdict(program, assert_timeout_s=0.5)
    assert (v.passed, v.total) == (2, 3)
    assert any("timed out" in e for e in v.errors)


def test_hang_without_unit_timeout_costs_everything() -> None:
    program = "def inc(x):\n    while x == 2:\n        pass\n    return x + 1\n"
    v = check_solution(program, TEST, "inc", lim(timeout_s=1.0), assert_timeout_s=None)
    assert (v.status, v.passed) == ("timeout", 0)


@pytest.mark.parametrize(
    "program",
    [
        "def inc(x):\n    pass\n",
        "def inc(x):\n    return None\n",
        "def inc(x):\n    return 7\n",
        "def dec(x):\n    return x - 1\n",
        "",
    ],
    ids=["pass-body", "returns-none", "constant", "wrong-name", "empty"],
)
def test_non_solutions_get_no_credit(program: str) -> None:
    v = verdict(program)
    assert v.passed == 0
    assert v.status in ("failed", "error")


@pytest.mark.parametrize(
    "exit_line",
    [
        "import os; os._exit(0)",
        "import sys; sys.exit(0)",
        "raise SystemExit(0)",
        "exit(0)",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    ],
)
def test_exiting_before_the_tests_gets_no_credit(exit_line: str) -> None:
    v = verdict(GOOD + exit_line + "\n")
    assert v.passed == 0
    assert v.status in ("no_result", "killed")
    assert v.error


def test_exiting_inside_the_candidate_gets_no_credit() -> None:
    v = verdict("import os\ndef inc(x):\n    os._exit(0)\n")
    assert (v.status, v.passed) == ("no_result", 0)


def test_sys_exit_inside_the_candidate_fails_that_assert_only() -> None:
    v = verdict("import sys\ndef inc(x):\n    if x == 2:\n        sys.exit(0)\n    return x + 1\n")
    assert (v.status, v.passed, v.total) == ("failed", 2, 3)


def test_atexit_hooks_cannot_add_credit() -> None:
    program = (
        "import atexit, os\n"
        "def inc(x):\n    return 99\n"
        "def fake():\n"
        "    for fd in range(3, 64):\n"
        "        try:\n"
        '            os.write(fd, b\'{"kind": "verdict", "passed": 3, "total": 3}\\n\')\n'
        "        except OSError:\n"
        "            pass\n"
        "atexit.register(fake)\n"
    )
    v = verdict(program)
    assert v.passed == 0


def test_fake_result_printed_to_stdout_is_ignored() -> None:
    fake = '{"kind": "verdict", "passed": 3, "total": 3, "program_loaded": true}'
    program = f"print({fake!r})\nprint('PASSED 3/3')\ndef inc(x):\n    return None\n"
    v = verdict(program)
    assert v.passed == 0 and v.status == "failed"
    assert "PASSED 3/3" in v.execution.stdout  # it printed; we just did not listen


def test_writing_fake_records_to_inherited_fds_is_tampering() -> None:
    program = (
        "import os\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        '        os.write(fd, b\'{"kind": "verdict", "passed": 3, "total": 3}\\n\')\n'
        "    except OSError:\n"
        "        pass\n"
        "def inc(x):\n    return x + 1\n"
    )
    v = verdict(program)
    assert (v.status, v.passed) == ("tampered", 0)


def test_overwriting_builtins_does_not_bend_the_tests() -> None:
    program = (
        "import builtins\n"
        "builtins.abs = lambda *a, **k: 0\n"
        "builtins.print = None\n"
        "builtins.exit = None\n"
        "builtins.isinstance = lambda *a: True\n"
        "builtins.len = lambda *a: 0\n"
        "def inc(x):\n    return 2 if x == 1 else 99\n"
    )
    v = verdict(program)
    # Only assert 1 is genuinely right; assert 3 would pass with the fake abs.
    assert (v.status, v.passed, v.total) == ("failed", 1, 3)


def test_clearing_builtins_does_not_break_the_harness() -> None:
    v = verdict("import builtins\nbuiltins.__dict__.clear()\ndef inc(x):\n    return x + 1\n")
    assert (v.status, v.passed) == ("passed", 3)


def test_program_error_while_loading_gets_no_credit() -> None:
    v = verdict(GOOD + "1 / 0\n")
    assert (v.status, v.passed, v.program_loaded) == ("error", 0, False)
    assert "ZeroDivisionError" in (v.error or "")


def test_syntax_error_verdict() -> None:
    v = verdict("def inc(x):\n    return (x +\n")
    assert (v.status, v.passed) == ("syntax_error", 0)


def test_infinite_loop_at_load_times_out_without_credit() -> None:
    v = check_solution(GOOD + "while True:\n    pass\n", TEST, "inc", lim(timeout_s=1))
    assert (v.status, v.passed) == ("timeout", 0)


def test_truth_test_of_a_handle_is_decided_by_the_test_process() -> None:
    # sanitized MBPP 737/787/794: the reference returns a re.Match, the test truth-tests it.
    test = "def check(candidate):\n    assert candidate('ab')\n    assert not candidate('x')\n"
    program = "import re\ndef inc(s):\n    return re.match('a', s)\n"
    v = check_solution(program, test, "inc", lim(timeout_s=5.0))
    assert (v.status, v.passed) == ("passed", 2), v.errors
    # The program's own __bool__ never answers a test: such an object is refused.
    liar = "class _T:\n    __bool__ = lambda s: True\ndef inc(s):\n    return _T()\n"
    v = check_solution(liar, test, "inc", lim(timeout_s=5.0))
    assert (v.status, v.passed) == ("failed", 0), v.errors
    # A class with __len__ only: its length (plain data) decides, in the test process.
    sized = "class _L:\n    def __len__(self):\n        return 1\ndef inc(s):\n    return _L()\n"
    v = check_solution(sized, test, "inc", lim(timeout_s=5.0))
    assert (v.status, v.passed) == ("failed", 1), v.errors


def test_a_program_that_loads_past_the_unit_budget_times_out_on_the_tests_timer() -> None:
    for program in ("import time\ntime.sleep(30)\n" + GOOD, "while True:\n    pass\n" + GOOD):
        v = check_solution(program, TEST, "inc", lim(timeout_s=20.0), assert_timeout_s=0.5)
        assert (v.status, v.passed) == ("timeout", 0), v.error
        assert v.duration_s < 10, "the load phase ran on the wall clock, not the tests' timer"


@pytest.mark.parametrize("where", ["at-load", "in-a-call"])
def test_a_program_that_stops_the_test_process_ends_at_once_without_credit(where: str) -> None:
    stop = "os.kill(os.getppid(), signal.SIGSTOP)"
    program = (
        "import os, signal\n"
        + (stop + "\n" if where == "at-load" else "")
        + "def inc(x):\n"
        + ("    " + stop + "\n" if where == "in-a-call" else "")
        + "    return x + 1\n"
    )
    v = check_solution(program, TEST, "inc", lim(timeout_s=20.0), assert_timeout_s=0.5)
    if v.execution is not None and not v.execution.isolation.get("pidns"):
        pytest.skip("no PID namespace: a stopped test process ends on the wall clock only")
    assert v.passed == 0 and v.status in ("killed", "timeout"), (v.status, v.error)
    assert v.duration_s < 10, "a stopped test process held the run for its wall clock"


def test_a_program_cannot_change_the_tests_own_arguments() -> None:
    # Plain check units keep T's values T's: only unittest tests (ClassEval) see a call's
    # in-place changes to their arguments, as they would in one process.
    test = "def check(candidate):\n    xs = [3, 1, 2]\n    assert candidate(xs) == sorted(xs)\n"
    program = "def inc(xs):\n    xs.clear()\n    return []\n"
    v = check_solution(program, test, "inc", lim(timeout_s=5.0))
    assert (v.status, v.passed) == ("failed", 0), v.errors


def test_tracked_helper_calls_are_counted_in_the_sandbox() -> None:
    program = "def aux(x):\n    return x + 1\n\ndef inc(x):\n    return aux(x)\n"
    v = verdict(program, track_calls=("aux",))
    assert v.status == "passed" and v.calls == {"aux": 3}
    v2 = verdict("def aux(x):\n    return 0\n" + GOOD, track_calls=("aux",))
    assert v2.status == "passed" and v2.calls == {}


def test_split_test_finds_units_and_setup() -> None:
    test = textwrap.dedent(
        """
        import math
        def check(candidate):
            "doc"
            xs = [1, 2]
            assert candidate(1) == 2
            for x in xs:
                assert candidate(x) > x
            print("not a unit")
        check(None)
        """
    )
    plan = split_test(test)
    assert plan.arg_name == "candidate"
    assert plan.num_units == 2
    assert [u for _, u in plan.steps] == [False, False, True, True, False]
    assert not any("check(None)" in s for s, _ in plan.steps)


@pytest.mark.parametrize("bad", ["def f(:", "x = 1", "def check(a, b):\n    assert a"])
def test_split_test_rejects_malformed_tests(bad: str) -> None:
    with pytest.raises(ValueError):
        split_test(bad)


def test_humaneval_units_match_the_assert_structure(rows_by_id: dict[str, Any]) -> None:
    assert split_test(rows_by_id["HumanEval/151"]["test"]).num_units == 7
    assert split_test(rows_by_id["HumanEval/32"]["test"]).num_units == 1
    assert split_test(rows_by_id["HumanEval/0"]["test"]).num_units == 7


def test_a_failed_unit_reports_its_last_call_into_the_program_not_its_expected_value() -> None:
    from comlrl.envs.code.classeval_tests import classeval_check_source

    test = "def check(candidate):\n    assert candidate(2) == 4\n    for x in [3, 5]:\n" + (
        "        assert candidate(x) == x * x\n    assert candidate(-1) == 1\n"
    )
    program = (
        "def sq(x):\n    if x < 0:\n        raise ValueError('neg')\n    return x * x + (x == 5)\n"
    )
    v = check_solution(program, test, "sq", lim(timeout_s=5.0))
    assert (v.passed, v.observed) == (
        1,
        {2: "sq(5) returned 26", 3: "sq(-1) raised ValueError: neg"},
    )
    # unittest: the call before the failing assertion, not tearDown's
    unit = (
        "import unittest\nclass T(unittest.TestCase):\n    def setUp(self):\n        self.c = C()\n"
        "    def test_add(self):\n        self.c.add(3)\n        self.assertEqual(self.c.total(), 3)\n"
        "    def tearDown(self):\n        self.c.reset()\n"
    )
    program = (
        "class C:\n    n = 0\n    def add(self, x):\n        self.n += x + 1\n"
        "    def total(self):\n        return self.n\n    def reset(self):\n        self.n = 0\n"
    )
    v = check_solution(program, classeval_check_source(unit), "C", lim(timeout_s=5.0))
    assert v.observed == {1: "total() returned 4"}, (v.errors, v.observed)
