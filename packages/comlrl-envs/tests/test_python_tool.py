"""The sandboxed Python tool: what the model reads for output, errors, timeouts, floods
and escapes, and that calls share no state."""

from __future__ import annotations

from comlrl.core.tools import PythonBlockFormat, run_tool_call
from comlrl.envs.sandbox import ExecutionResult
from comlrl.envs.tools import python_tool
from comlrl.envs.tools.python import format_result

TOOL = python_tool(timeout_s=2.0, max_output_chars=300)


def test_tool_declares_python_with_a_code_parameter() -> None:
    schema = TOOL.schema()["function"]
    assert schema["name"] == "python"
    assert schema["parameters"]["required"] == ["code"]
    assert TOOL.timeout_s > 2.0, "the sandbox must report its own timeout before the rollout"


def test_printed_output_comes_back() -> None:
    assert TOOL.run(code="print(964 * 59)") == str(964 * 59)


def test_code_that_prints_nothing_gets_a_note() -> None:
    assert "no output" in TOOL.run(code="x = 964 * 59\n")


def test_an_exception_shows_output_so_far_and_its_last_line() -> None:
    out = TOOL.run(code="print('before')\nundefined_name + 1\n")
    assert out.splitlines()[0] == "before"
    assert out.splitlines()[-1] == "Error: NameError: name 'undefined_name' is not defined"
    assert "Traceback" not in out


def test_a_syntax_error_is_reported() -> None:
    assert TOOL.run(code="def f(:\n").startswith("Error: SyntaxError")


def test_an_infinite_loop_is_stopped_at_the_time_limit() -> None:
    out = TOOL.run(code="print('start', flush=True)\nwhile True:\n    pass\n")
    assert out.startswith("start")
    assert "time limit" in out


def test_huge_output_is_cut_to_the_bound() -> None:
    out = TOOL.run(code="print('x' * 10_000_000)")
    assert len(out) < 300 + 100
    assert out.startswith("x" * 300)
    assert "cut" in out


def test_reading_host_files_fails_as_in_the_sandbox() -> None:
    out = TOOL.run(code="print(open('/etc/passwd').read())")
    assert "root:" not in out
    assert out.startswith("Error:")


def test_network_is_unreachable() -> None:
    code = (
        "import socket\n"
        "s = socket.create_connection(('1.1.1.1', 80), timeout=1)\n"
        "print('connected')\n"
    )
    out = TOOL.run(code=code)
    assert "connected" not in out
    assert out.startswith("Error:")


def test_calls_share_no_state() -> None:
    assert TOOL.run(code="secret = 41\nprint(secret + 1)") == "42"
    assert "NameError" in TOOL.run(code="print(secret)")
    TOOL.run(code="open('state.txt', 'w').write('kept?')")
    assert "FileNotFoundError" in TOOL.run(code="print(open('state.txt').read())")


def test_a_fenced_block_runs_through_run_tool_call() -> None:
    text = "```python\nprint(2 ** 10)\n```"
    result = run_tool_call({"python": TOOL}, PythonBlockFormat(), text)
    assert result.error is None
    assert result.content == "1024"


def test_killed_and_unstarted_programs_are_explained() -> None:
    killed = ExecutionResult("killed", -9, stdout="partial\n")
    assert format_result(killed).splitlines() == [
        "partial",
        "Error: the program was killed (CPU time or memory limit).",
    ]
    assert "could not start" in format_result(ExecutionResult("failed_to_start", None))
