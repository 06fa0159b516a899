"""Tool declarations, the two call formats, and run_tool_call's error kinds."""

from __future__ import annotations

import time

import pytest
from comlrl.core import (
    JsonToolFormat,
    PythonBlockFormat,
    Task,
    Tool,
    ToolCallParseError,
    ToolError,
    get_tool_format,
    run_tool_call,
)
from hypothesis import given
from hypothesis import strategies as st

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _tools(**extra: Tool) -> dict[str, Tool]:
    double = Tool("double", "twice a", SCHEMA, run=lambda a: str(2 * a))
    return {"double": double, **extra}


def test_tool_schema_is_the_openai_function_form() -> None:
    tool = _tools()["double"]
    assert tool.schema() == {
        "type": "function",
        "function": {"name": "double", "description": "twice a", "parameters": SCHEMA},
    }


@pytest.mark.parametrize("name", ["", "1abc", "a b", "x;y"])
def test_tool_refuses_an_invalid_name(name: str) -> None:
    with pytest.raises(ValueError, match="not a valid function name"):
        Tool(name, "d", SCHEMA, run=str)


def test_tool_refuses_a_non_object_schema_and_a_bad_timeout() -> None:
    with pytest.raises(ValueError, match="type 'object'"):
        Tool("t", "d", {"type": "string"}, run=str)
    with pytest.raises(ValueError, match="timeout_s"):
        Tool("t", "d", SCHEMA, run=str, timeout_s=0)


def test_json_call_runs_and_returns_the_tool_text() -> None:
    fmt = JsonToolFormat()
    text = 'I will call it <tool_call>{"name": "double", "arguments": {"a": 21}}</tool_call> ok'
    start, end = fmt.find_call(text) or (0, 0)
    result = run_tool_call(_tools(), fmt, text[start:end])
    assert (result.error, result.content, result.call.name) == (None, "42", "double")
    assert result.call.arguments == {"a": 21}


def test_json_arguments_given_as_a_json_string_are_parsed() -> None:
    call = JsonToolFormat().parse(
        '<tool_call>{"name": "double", "arguments": "{\\"a\\": 2}"}</tool_call>'
    )
    assert call.arguments == {"a": 2}


@pytest.mark.parametrize(
    "call",
    [
        "<tool_call>{not json</tool_call>",
        '<tool_call>["double"]</tool_call>',
        '<tool_call>{"name": "double", "arguments": [1]}</tool_call>',
    ],
)
def test_a_malformed_call_is_an_error_result(call: str) -> None:
    result = run_tool_call(_tools(), JsonToolFormat(), call)
    assert result.error == "malformed" and result.content.startswith("Error:")


def test_unknown_raising_and_hanging_tools_are_error_results() -> None:
    def boom(a: int) -> str:
        raise RuntimeError("no")

    def hang(a: int) -> str:
        time.sleep(30)
        return "late"

    tools = _tools(
        boom=Tool("boom", "d", SCHEMA, run=boom),
        hang=Tool("hang", "d", SCHEMA, run=hang, timeout_s=0.2),
    )
    fmt = JsonToolFormat()
    unknown = run_tool_call(tools, fmt, '<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    assert unknown.error == "unknown_tool" and "boom, double, hang" in unknown.content
    raised = run_tool_call(
        tools, fmt, '<tool_call>{"name": "boom", "arguments": {"a": 1}}</tool_call>'
    )
    assert raised.error == "raised" and "RuntimeError: no" in raised.content
    t0 = time.perf_counter()
    hung = run_tool_call(
        tools, fmt, '<tool_call>{"name": "hang", "arguments": {"a": 1}}</tool_call>'
    )
    assert hung.error == "timeout" and time.perf_counter() - t0 < 5


ADD = Tool(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": ["integer", "null"]}},
        "required": ["a"],
    },
    run=lambda a, b=None: str(a + (b or 0)),
)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('{"a": 1, "c": 2}', "Error: add has no argument 'c' (its arguments: a, b)."),
        ('{"b": 2}', "Error: add needs the argument 'a' (required: a)."),
        ('{"a": "2"}', "Error: argument 'a' of add must be an integer, got a string '2'."),
        ('{"a": true}', "Error: argument 'a' of add must be an integer, got a boolean True."),
        ('{"a": 1.5}', "Error: argument 'a' of add must be an integer, got a number 1.5."),
        (
            '{"a": 1, "b": [3]}',
            "Error: argument 'b' of add must be an integer or null, got an array [3].",
        ),
    ],
)
def test_arguments_that_do_not_fit_the_schema_are_the_models_malformed_call(
    arguments: str, message: str
) -> None:
    ran: list[object] = []
    tool = Tool("add", ADD.description, ADD.parameters, run=lambda **kw: ran.append(kw) or "")
    call = f'<tool_call>{{"name": "add", "arguments": {arguments}}}</tool_call>'
    result = run_tool_call({"add": tool}, JsonToolFormat(), call)
    assert (result.error, result.content) == ("malformed", message)
    assert ran == []  # the tool never ran


@pytest.mark.parametrize(
    ("arguments", "out"),
    [('{"a": 40, "b": 2}', "42"), ('{"a": 2.0}', "2.0"), ('{"a": 1, "b": null}', "1")],
)
def test_arguments_that_fit_the_schema_run_the_tool(arguments: str, out: str) -> None:
    call = f'<tool_call>{{"name": "add", "arguments": {arguments}}}</tool_call>'
    result = run_tool_call({"add": ADD}, JsonToolFormat(), call)
    assert (result.error, result.content) == (None, out)


def test_a_schema_that_allows_other_names_passes_them_on() -> None:
    schema = {"type": "object", "properties": {}, "additionalProperties": True}
    tool = Tool("echo", "d", schema, run=lambda **kw: ",".join(sorted(kw)))
    assert tool.check_arguments({"x": 1, "y": "z"}) is None
    closed = Tool("none", "d", {"type": "object"}, run=lambda: "ok")
    assert closed.check_arguments({"x": 1}) == "none has no argument 'x' (its arguments: none)."
    assert closed.check_arguments({}) is None


def test_a_tool_error_is_a_failed_call_whose_message_the_model_reads() -> None:
    def fails(a: int) -> str:
        raise ToolError("Error: your program raised ZeroDivisionError")

    tools = _tools(fails=Tool("fails", "d", SCHEMA, run=fails))
    call = '<tool_call>{"name": "fails", "arguments": {"a": 1}}</tool_call>'
    result = run_tool_call(tools, JsonToolFormat(), call)
    assert (result.error, result.content) == (
        "failed",
        "Error: your program raised ZeroDivisionError",
    )


def test_a_long_result_is_cut() -> None:
    tool = Tool("big", "d", {"type": "object"}, run=lambda: "x" * 50, max_result_chars=10)
    result = run_tool_call(
        {"big": tool}, JsonToolFormat(), '<tool_call>{"name": "big"}</tool_call>'
    )
    assert result.content.startswith("x" * 10 + "\n[... cut at 10")


def test_python_block_is_a_call_of_the_python_tool() -> None:
    fmt = PythonBlockFormat()
    text = "Compute:\n```python\nprint(964 * 59)\n```\nthen answer"
    start, end = fmt.find_call(text) or (0, 0)
    call = fmt.parse(text[start:end])
    assert call.name == "python" and call.arguments == {"code": "print(964 * 59)\n"}
    assert fmt.find_call("```python\nprint(1)\n") is None  # not closed yet
    assert fmt.find_call("```\nplain fence\n```") is None  # not a python block
    with pytest.raises(ToolCallParseError, match="empty"):
        fmt.parse("```python\n  \n```")


@given(st.text(max_size=40), st.text(max_size=40), st.sampled_from(["json", "python"]))
def test_a_closed_call_stays_closed_at_the_same_place_in_longer_text(
    before: str, after: str, fmt_name: str
) -> None:
    fmt = get_tool_format(fmt_name)
    call = (
        '<tool_call>{"name": "double"}</tool_call>'
        if fmt_name == "json"
        else "```python\nprint(1)\n```"
    )
    text = before + call
    found = fmt.find_call(text)
    assert found is not None
    assert fmt.find_call(text + after) == found
    # every prefix that cuts the call before its closer holds no closed call at that place
    for cut in range(found[0], found[1]):
        inner = fmt.find_call(text[:cut])
        assert inner is None or inner[1] <= cut


def test_observation_text_wraps_the_result() -> None:
    result = run_tool_call(
        _tools(),
        JsonToolFormat(),
        '<tool_call>{"name": "double", "arguments": {"a": 1}}</tool_call>',
    )
    assert JsonToolFormat().result_text(result) == "\n<tool_response>\n2\n</tool_response>\n"
    assert "```output\n2\n```" in PythonBlockFormat().result_text(result)
    assert '"name": "double"' in JsonToolFormat().describe(list(_tools().values()))


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown tool format 'xml'"):
        get_tool_format("xml")


def test_tasks_have_no_tools_by_default() -> None:
    assert Task.tools(object(), 0) == ()  # type: ignore[arg-type]
    assert Task.tool_format == "json"
