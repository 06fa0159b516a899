"""Tools an agent may call inside a turn: their declaration, the call formats, and running a call.

A task gives each agent a set of :class:`Tool` s (:meth:`comlrl.core.Task.tools`). While the
agent writes its completion it may close a *tool call*; generation pauses, the call is
parsed and run by :func:`run_tool_call`, the result is appended to the agent's context as an
*observation* (the tool's message), and generation resumes. Observations are context the
model reads, never text it is trained to write.

How a call looks in the model's text is a :class:`ToolFormat`:

- :class:`JsonToolFormat` (``"json"``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  the format of Qwen2.5 and Hermes chat templates. With a tokenizer whose chat template
  renders tools, the tools are declared and the results rendered through the template; with
  one that does not, :meth:`ToolFormat.describe` writes the declaration as plain text and
  :meth:`ToolFormat.result_text` the result.
- :class:`PythonBlockFormat` (``"python"``): a fenced ````python`` block is a call of the
  tool named ``python`` with ``{"code": <the block>}``; its output comes back as a fenced
  ````output`` block. The fallback for small chat models without tool templates
  (SmolLM2), which write fenced Python on their own.

Every failure of a call is a :class:`ToolResult` with an :attr:`ToolResult.error` kind and a
message the model reads, never an exception out of the rollout: a call that does not parse,
or whose arguments do not fit the tool's schema (:meth:`Tool.check_arguments`: a name the
schema does not list, a required one missing, a value of the wrong JSON type), is the
model's mistake (``"malformed"``, and the tool never runs); a name no tool has
(``"unknown_tool"``), a tool that reports a failed
call by raising :class:`ToolError` (``"failed"``: e.g. the program the model wrote raised),
a tool that raises anything else (``"raised"``: a fault of the tool) or runs past its
timeout (``"timeout"``), a call past the turn's limit (``"limit"``).

Nothing here imports torch or a tokenizer.
"""

from __future__ import annotations

import abc
import concurrent.futures
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TOOL_ERROR_KINDS",
    "TOOL_FORMATS",
    "JsonToolFormat",
    "PythonBlockFormat",
    "Tool",
    "ToolCall",
    "ToolCallParseError",
    "ToolError",
    "ToolFormat",
    "ToolResult",
    "get_tool_format",
    "run_tool_call",
]

#: The kinds of :attr:`ToolResult.error`, in the order metrics list them.
TOOL_ERROR_KINDS = ("malformed", "unknown_tool", "failed", "raised", "timeout", "limit")


class ToolError(Exception):
    """Raised by a tool's ``run`` to report that the call failed (bad arguments, the
    model's program raised): the model reads the message as it is, and the result's
    :attr:`ToolResult.error` is ``"failed"``."""


#: JSON schema ``type`` names and the Python values of parsed JSON each admits.
_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (
        not isinstance(v, bool)
        and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
    ),
    "number": lambda v: not isinstance(v, bool) and isinstance(v, int | float),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list | tuple),
    "object": lambda v: isinstance(v, Mapping),
    "null": lambda v: v is None,
}
_ARTICLE = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def _json_type(value: Any) -> str:
    """The JSON type of a parsed value, with its article (for messages)."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return "a number"
    for name in ("boolean", "integer", "string", "array", "object"):
        if _JSON_TYPES[name](value):
            return _ARTICLE[name]
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class Tool:
    """A function an agent may call inside a turn.

    Attributes:
        name: the name the model calls it by (``[A-Za-z_][A-Za-z0-9_.-]*``).
        description: one or two sentences the model reads.
        parameters: a JSON schema of the arguments (``{"type": "object", "properties":
            {...}, "required": [...]}``), shown to the model as is.
        run: ``run(**arguments) -> str``: the result text the model reads. It runs in the
            task's process (a thread of the rollout); code the model wrote must not run
            here but in a sandbox (``comlrl.envs.tools.python_tool`` does that).
        timeout_s: seconds after which the call is reported as a ``"timeout"`` (the
            rollout stops waiting for it; a sandboxed tool also kills its process).
        max_result_chars: a longer result is cut to this many characters (with a note).

    Raises:
        ValueError: an invalid name, a non-object schema, or a non-positive timeout.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    run: Callable[..., str]
    timeout_s: float = 10.0
    max_result_chars: int = 2000

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", self.name or ""):
            raise ValueError(
                f"tool name {self.name!r} is not a valid function name; use letters, digits, "
                "'_', '.' or '-', starting with a letter or '_'."
            )
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type") != "object":
            raise ValueError(
                f"tool {self.name!r}: parameters must be a JSON schema with type 'object', got "
                f"{self.parameters!r}."
            )
        if not self.timeout_s > 0:
            raise ValueError(f"tool {self.name!r}: timeout_s must be > 0, got {self.timeout_s}.")

    def check_arguments(self, arguments: Mapping[str, Any]) -> str | None:
        """What is wrong with ``arguments`` for this tool's :attr:`parameters`, as a sentence
        for the model, or None when they fit.

        The check covers what calling ``run(**arguments)`` needs and what a model most often
        gets wrong: every name must be one of the schema's ``properties`` (unless
        ``additionalProperties`` is true or a schema), every name in ``required`` must be
        given, and a value whose property declares a JSON ``type`` (a name or a list of
        names) must be of it (``integer``: a whole number, not a boolean; ``number``: any
        number, not a boolean). Other keywords (``enum``, ranges, patterns, nested
        ``items``/``properties``) are the tool's to check: it raises :class:`ToolError` with
        a message for the model.
        """
        declared = self.parameters.get("properties") or {}
        extra = self.parameters.get("additionalProperties", False)
        if extra is False:
            unknown = [name for name in arguments if name not in declared]
            if unknown:
                listed = ", ".join(declared) or "none"
                return f"{self.name} has no argument {unknown[0]!r} (its arguments: {listed})."
        missing = [name for name in self.parameters.get("required", ()) if name not in arguments]
        if missing:
            required = ", ".join(self.parameters.get("required", ()))
            return f"{self.name} needs the argument {missing[0]!r} (required: {required})."
        for name, value in arguments.items():
            spec = declared.get(name)
            wanted = spec.get("type") if isinstance(spec, Mapping) else None
            names = [wanted] if isinstance(wanted, str) else list(wanted or ())
            known = [n for n in names if n in _JSON_TYPES]
            if known and not any(_JSON_TYPES[n](value) for n in known):
                shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
                return (
                    f"argument {name!r} of {self.name} must be "
                    f"{' or '.join(_ARTICLE[n] for n in known)}, got {_json_type(value)} {shown}."
                )
        return None

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema chat templates take (``tools=[...]``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote.

    Attributes:
        name: the tool it names (``None`` when the call did not parse that far).
        arguments: the parsed arguments.
        text: the model's own text of the call, markers included.
    """

    name: str | None
    arguments: Mapping[str, Any]
    text: str


@dataclass(frozen=True)
class ToolResult:
    """What one call returned to the model.

    Attributes:
        call: the call.
        content: the text the model reads (the tool's result or the error message).
        error: ``None`` on success, else one of :data:`TOOL_ERROR_KINDS`.
        seconds: wall time spent running the call (0 for calls that never ran).
        result_tokens: tokens of the observation appended to the context (set by the
            rollout; 0 before).
    """

    call: ToolCall
    content: str
    error: str | None = None
    seconds: float = 0.0
    result_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form (for ``samples.jsonl``)."""
        return {
            "name": self.call.name,
            "arguments": dict(self.call.arguments),
            "call": self.call.text,
            "result": self.content,
            "error": self.error,
            "seconds": round(self.seconds, 4),
            "result_tokens": self.result_tokens,
        }


class ToolCallParseError(ValueError):
    """The text of a closed tool call is not a valid call in its format."""


class ToolFormat(abc.ABC):
    """How tool calls look in a model's text and how their results come back."""

    #: the format's name (:data:`TOOL_FORMATS`).
    name: str = ""
    #: the strings that close a call: generation may pause only after one of them.
    closers: tuple[str, ...] = ()

    @abc.abstractmethod
    def find_call(self, text: str) -> tuple[int, int] | None:
        """``(start, end)`` of the first *closed* call in ``text`` (``text[start:end]`` is
        the call, markers included), or ``None``. Once a call is closed in a prefix of a
        text it is closed, at the same place, in every longer text."""

    @abc.abstractmethod
    def parse(self, call_text: str) -> ToolCall:
        """The call in ``call_text`` (as :meth:`find_call` delimits it).

        Raises:
            ToolCallParseError: the call is malformed; the message says why, for the model.
        """

    @abc.abstractmethod
    def describe(self, tools: Sequence[Tool]) -> str:
        """Plain-text instructions declaring ``tools`` (for chat templates without tools)."""

    @abc.abstractmethod
    def result_text(self, result: ToolResult) -> str:
        """The observation text appended after a call (for chat templates without tools)."""


class JsonToolFormat(ToolFormat):
    """``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` (Qwen2.5 / Hermes style)."""

    name = "json"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    closers = (close_tag,)

    def find_call(self, text: str) -> tuple[int, int] | None:
        start = text.find(self.open_tag)
        if start < 0:
            return None
        end = text.find(self.close_tag, start + len(self.open_tag))
        return None if end < 0 else (start, end + len(self.close_tag))

    def parse(self, call_text: str) -> ToolCall:
        body = call_text.strip()
        body = body.removeprefix(self.open_tag).removesuffix(self.close_tag).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            raise ToolCallParseError(f"the tool call is not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ToolCallParseError('the tool call must be a JSON object with a string "name"')
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                raise ToolCallParseError('"arguments" is a string that is not JSON') from None
        if not isinstance(args, dict):
            raise ToolCallParseError('"arguments" must be a JSON object')
        return ToolCall(obj["name"], args, call_text)

    def describe(self, tools: Sequence[Tool]) -> str:
        schemas = "\n".join(json.dumps(t.schema()) for t in tools)
        return (
            "You can call these tools:\n"
            f"{schemas}\n"
            "To call one, write a JSON object with its name and arguments between tags:\n"
            f'{self.open_tag}{{"name": "<tool name>", "arguments": {{...}}}}{self.close_tag}\n'
            "The result comes back between <tool_response> tags."
        )

    def result_text(self, result: ToolResult) -> str:
        return f"\n<tool_response>\n{result.content}\n</tool_response>\n"


class PythonBlockFormat(ToolFormat):
    """A fenced ````python`` block calls the tool ``python`` with ``{"code": block}``;
    the result comes back as a fenced ````output`` block."""

    name = "python"
    tool_name = "python"
    _open = re.compile(r"```(?:python|py)[ \t]*\n")
    closers = ("```",)

    def find_call(self, text: str) -> tuple[int, int] | None:
        m = self._open.search(text)
        if m is None:
            return None
        end = text.find("```", m.end())
        return None if end < 0 else (m.start(), end + 3)

    def parse(self, call_text: str) -> ToolCall:
        m = self._open.match(call_text)
        if m is None or not call_text.endswith("```"):
            raise ToolCallParseError("a Python call is a block between ```python and ```")
        code = call_text[m.end() : -3]
        if not code.strip():
            raise ToolCallParseError("the ```python block is empty")
        return ToolCall(self.tool_name, {"code": code}, call_text)

    def describe(self, tools: Sequence[Tool]) -> str:
        lines = [f"- {t.name}: {t.description}" for t in tools]
        return (
            "You can run Python: write code in a ```python block and stop; what it prints "
            "comes back in an ```output block. For example:\n"
            "```python\nprint(12 * 34)\n```\n```output\n408\n```\n"
            "Tools:\n" + "\n".join(lines)
        )

    def result_text(self, result: ToolResult) -> str:
        return f"\n```output\n{result.content}\n```\n"


#: Tool-call formats by name.
TOOL_FORMATS: dict[str, type[ToolFormat]] = {"json": JsonToolFormat, "python": PythonBlockFormat}


def get_tool_format(name: str) -> ToolFormat:
    """The :class:`ToolFormat` named ``name``.

    Raises:
        ValueError: no format has that name; the message lists the names.
    """
    cls = TOOL_FORMATS.get(name)
    if cls is None:
        raise ValueError(f"unknown tool format {name!r}; use one of {sorted(TOOL_FORMATS)}")
    return cls()


# In-process tools run on daemon threads of their own, so that one that never returns is
# abandoned after its timeout instead of holding a pool worker (or the interpreter's exit).
def _run_with_timeout(fn: Callable[[], str], timeout_s: float) -> str:
    box: concurrent.futures.Future[str] = concurrent.futures.Future()

    def target() -> None:
        try:
            box.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - reported to the model as "raised"
            box.set_exception(e)

    threading.Thread(target=target, daemon=True, name="comlrl-tool").start()
    return box.result(timeout=timeout_s)


def run_tool_call(tools: Mapping[str, Tool], fmt: ToolFormat, call_text: str) -> ToolResult:
    """Parse and run one closed call; every failure becomes a :class:`ToolResult` with an
    ``error`` kind and a message for the model (see the module docstring), never an
    exception.

    Args:
        tools: the agent's tools by name.
        fmt: the format the call is written in.
        call_text: the call as :meth:`ToolFormat.find_call` delimits it.
    """
    try:
        call = fmt.parse(call_text)
    except ToolCallParseError as e:
        return ToolResult(ToolCall(None, {}, call_text), f"Error: {e}.", "malformed")
    tool = tools.get(call.name or "")
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return ToolResult(
            call, f"Error: there is no tool named {call.name!r} (tools: {known}).", "unknown_tool"
        )
    problem = tool.check_arguments(call.arguments)
    if problem is not None:
        return ToolResult(call, f"Error: {problem}", "malformed")
    t0 = time.perf_counter()
    try:
        out = _run_with_timeout(lambda: tool.run(**call.arguments), tool.timeout_s)
    except ToolError as e:
        return ToolResult(call, str(e), "failed", time.perf_counter() - t0)
    except concurrent.futures.TimeoutError:
        return ToolResult(
            call,
            f"Error: {tool.name} did not return within {tool.timeout_s:g} s.",
            "timeout",
            time.perf_counter() - t0,
        )
    except Exception as e:  # noqa: BLE001 - the model reads what went wrong
        return ToolResult(
            call, f"Error: {type(e).__name__}: {e}", "raised", time.perf_counter() - t0
        )
    seconds = time.perf_counter() - t0
    text = out if isinstance(out, str) else str(out)
    if len(text) > tool.max_result_chars:
        text = text[: tool.max_result_chars] + f"\n[... cut at {tool.max_result_chars} characters]"
    return ToolResult(call, text, None, seconds)
