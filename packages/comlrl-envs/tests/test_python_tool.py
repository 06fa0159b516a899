"""The sandboxed Python tool: what the model reads for output, errors, timeouts, floods
and escapes, and that calls share no state."""

from __future__ import annotations

import pytest
from comlrl.core.tools import PythonBlockFormat, ToolError, run_tool_call
from comlrl.envs.sandbox import ExecutionResult
from comlrl.envs.tools import python_tool
from comlrl.envs.tools.python import format_result

TOOL = python_tool(timeout_s=2.0, max_output_chars=300)


def read(code: str) -> str:
    """What the model reads for ``code``: the result, or a failed call's message."""
    try:
        return TOOL.run(code=code)
    except ToolError as e:
        return str(e)


def test_tool_declares_python_with_a_code_parameter() -> None:
    schema = TOOL.schema()["function"]
    assert schema["name"] == "python"
    assert schema["parameters"]["required"] == ["code"]
    assert TOOL.timeout_s > 2.0, "the sandbox must report its own timeout before the rollout"


def test_printed_output_comes_back() -> None:
    assert read("print(964 * 59)") == str(964 * 59)


def test_code_that_prints_nothing_gets_a_note() -> None:
    assert "no output" in read("x = 964 * 59\n")


def test_an_exception_shows_output_so_far_and_its_last_line() -> None:
    out = read("print('before')\nundefined_name + 1\n")
    assert out.splitlines()[0] == "before"
    assert out.splitlines()[-1] == "Error: NameError: name 'undefined_name' is not defined"
    assert "Traceback" not in out


def test_a_syntax_error_is_reported() -> None:
    assert read("def f(:\n").startswith("Error: SyntaxError")


def test_an_infinite_loop_is_stopped_at_the_time_limit() -> None:
    out = read("print('start', flush=True)\nwhile True:\n    pass\n")
    assert out.startswith("start")
    assert "time limit" in out


def test_huge_output_is_cut_to_the_bound() -> None:
    out = read("print('x' * 10_000_000)")
    assert len(out) < 300 + 100
    assert out.startswith("x" * 300)
    assert "cut" in out


def test_reading_host_files_fails_as_in_the_sandbox() -> None:
    out = read("print(open('/etc/passwd').read())")
    assert "root:" not in out
    assert out.startswith("Error:")


def test_network_is_unreachable() -> None:
    code = (
        "import socket\n"
        "s = socket.create_connection(('1.1.1.1', 80), timeout=1)\n"
        "print('connected')\n"
    )
    out = read(code)
    assert "connected" not in out
    assert out.startswith("Error:")


def test_calls_share_no_state() -> None:
    assert read("secret = 41\nprint(secret + 1)") == "42"
    assert "NameError" in read("print(secret)")
    read("open('state.txt', 'w').write('kept?')")
    assert "FileNotFoundError" in read("print(open('state.txt').read())")


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


@pytest.mark.parametrize("code", ["undefined_name + 1\n", "def f(:\n", "while True:\n    pass\n"])
def test_a_program_that_fails_is_a_failed_call(code: str) -> None:
    with pytest.raises(ToolError, match="^Error: "):
        TOOL.run(code=code)
    result = run_tool_call({"python": TOOL}, PythonBlockFormat(), f"```python\n{code}```")
    assert result.error == "failed" and result.content.startswith("Error: ")
