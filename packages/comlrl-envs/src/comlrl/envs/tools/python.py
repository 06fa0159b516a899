"""The sandboxed Python tool: an agent runs code inside its turn and reads what it printed.

:func:`python_tool` builds a :class:`comlrl.core.tools.Tool` named ``python`` with one
parameter, ``code``. Each call runs ``code`` as a fresh program in the sandbox
(:func:`comlrl.envs.sandbox.executor.run_python`), with the same isolation and limits as
any model-written code (own process group, network / PID / mount namespaces where the OS
allows, rlimits, a private work directory, see :mod:`comlrl.envs.sandbox.executor`).

The tool is **stateless**: nothing persists between calls. Variables, imports and files
of one call are gone at the next one, and no kernel state links two calls (keyrings and
file locks are refused, :mod:`comlrl.envs.sandbox.syscall_filter`), whether that is the same agent's next call in the
same turn or a call in a later joint action; code that needs a value from an earlier call
must compute it again. The observation is what the program printed (see
:func:`format_result`), never a value the tool keeps.
"""

from __future__ import annotations

import dataclasses

from comlrl.core.tools import Tool, ToolError
from comlrl.envs.sandbox.executor import run_python
from comlrl.envs.sandbox.limits import ExecutionResult, SandboxLimits

__all__ = ["python_tool", "format_result", "PYTHON_TOOL_NAME", "DEFAULT_MAX_OUTPUT_CHARS"]

#: The name the model calls the tool by (also what a fenced ``python`` block calls).
PYTHON_TOOL_NAME = "python"
#: Characters of observation an agent reads from one call by default.
DEFAULT_MAX_OUTPUT_CHARS = 1000
# Seconds the rollout waits past the sandbox's own wall-clock limit before it gives up on a
# call (start-up of the sandboxed process, reaping): the sandbox reports its own timeouts.
_GRACE_S = 5.0
_NO_OUTPUT = "(no output: print the values you want to see)"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... output cut at {limit} characters]"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def format_result(result: ExecutionResult, max_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> str:
    """The text an agent reads for one sandboxed run (at most ``max_chars`` characters of
    program output, plus a short note).

    - ran to the end (``"ok"``): its stdout (a note when it printed nothing);
    - raised or did not compile (``"error"``, ``"syntax_error"``): its stdout so far, then
      ``Error: <the exception's last line>`` (e.g. ``NameError: name 'x' is not defined``);
    - ran past the time limit (``"timeout"``): stdout so far and a note that it was stopped;
    - killed by a limit (``"killed"``: CPU time, memory) or not started: stdout so far and a
      note saying which.

    Output the sandbox dropped past ``max_output_bytes``, or past ``max_chars`` here, is
    marked as cut.

    Raises:
        ValueError: for ``max_chars`` < 1.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    out = result.stdout
    if result.stdout_truncated:
        out += "\n[... output cut by the sandbox]"
    out = _cut(out.rstrip("\n"), max_chars) if out.strip() else ""
    notes: list[str] = []
    if result.status in ("error", "syntax_error"):
        last = _last_line(result.stderr)
        if not last and result.error_type:
            last = f"{result.error_type}: {result.error or ''}".rstrip(": ")
        notes.append(f"Error: {_cut(last or 'the program exited with an error', 300)}")
    elif result.status == "timeout":
        notes.append(
            f"Error: the program was stopped after {result.duration_s:.1f} s (time limit)."
        )
    elif result.status == "killed":
        notes.append("Error: the program was killed (CPU time or memory limit).")
    elif result.status == "failed_to_start":
        notes.append("Error: the sandbox could not start the program.")
    elif not out:
        notes.append(_NO_OUTPUT)
    return "\n".join(part for part in (out, *notes) if part)


def python_tool(
    limits: SandboxLimits | None = None,
    *,
    timeout_s: float = 5.0,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> Tool:
    """A :class:`~comlrl.core.tools.Tool` named ``python`` that runs ``{"code": str}`` in the
    sandbox and returns what the program printed (:func:`format_result`). A program that
    does not end well (raises, does not compile, runs out of time or memory) raises
    :class:`~comlrl.core.tools.ToolError` with that same text: the model reads it, and the
    call counts as a ``"failed"`` tool call in the metrics.

    Stateless: every call is a fresh sandboxed process; an agent's Python state does not
    persist between its calls in a turn, nor across joint actions (module docstring).

    Args:
        limits: the sandbox's limits and isolation (default :class:`SandboxLimits()`:
            isolated filesystem, no network, 1 GiB address space); its ``timeout_s`` is
            replaced by ``timeout_s`` here.
        timeout_s: wall-clock seconds one call may run before the sandbox kills it. The
            rollout waits ``timeout_s + 5`` s (the tool's own ``timeout_s``) before it
            reports a ``"timeout"`` itself.
        max_output_chars: characters of program output the model reads from one call.

    Raises:
        ValueError: for a non-positive ``timeout_s`` or ``max_output_chars`` < 1.

    A run that the OS cannot isolate raises
    :class:`~comlrl.envs.sandbox.limits.SandboxUnavailableError` inside the call, which the
    rollout reports to the model as a ``"raised"`` tool error.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    if max_output_chars < 1:
        raise ValueError(f"max_output_chars must be >= 1, got {max_output_chars!r}")
    run_limits = dataclasses.replace(limits or SandboxLimits(), timeout_s=float(timeout_s))

    def run(code: str) -> str:
        if not isinstance(code, str):
            raise TypeError(f'"code" must be a string of Python source, got {type(code).__name__}')
        result = run_python(code, run_limits)
        text = format_result(result, max_output_chars)
        if result.status != "ok":  # the program failed: the model reads why, a "failed" call
            raise ToolError(text)
        return text

    return Tool(
        name=PYTHON_TOOL_NAME,
        description=(
            "Run Python 3 code (standard library only) and read what it prints. Each call "
            "starts fresh: variables do not carry over between calls."
        ),
        parameters={
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python source; print the results."}
            },
            "required": ["code"],
        },
        run=run,
        timeout_s=float(timeout_s) + _GRACE_S,
        max_result_chars=max_output_chars + 400,
    )
