"""Multi-turn feedback for the code suites: sandbox verdict -> short text per agent.

The trainer calls ``task.feedback(example, joint_action, info, turn)`` after scoring a joint
action (``info`` is that joint action's reward info, i.e. the sandbox verdict plus task
fields) and builds the next turn's prompts with ``task.prompts(example, history)``. The
helpers here make the feedback text compact (every piece is capped) and render it as Python
comments, so a completion-style code prompt stays valid Python up to where the agent writes.

One agent's feedback text reads::

    Turn 0: 2 of 7 tests passed (failed).
    Failing test: assert candidate([1.0, 2.0], 0.5) == False
    Error: AssertionError
    Your previous code:
    def aux(numbers):
        ...
    Your teammate's functions: def has_close_elements(numbers, threshold)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.core import Feedback

__all__ = [
    "clip",
    "failing_units",
    "signatures",
    "strip_docstrings",
    "verdict_line",
    "agent_feedback_text",
    "feedback_comment_block",
    "MAX_CODE_CHARS",
    "MAX_TEST_CHARS",
    "MAX_ERROR_CHARS",
]

MAX_CODE_CHARS = 1200
"""Characters of an agent's previous code kept in its feedback."""
MAX_TEST_CHARS = 400
"""Characters of one failing test kept in the feedback."""
MAX_ERROR_CHARS = 240
"""Characters of one error message kept in the feedback."""

_UNIT_ERROR = re.compile(r"^assert #(\d+): (.*)$", re.DOTALL)


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters (``" ..."`` marks a cut)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 4)].rstrip() + " ..."


def failing_units(
    errors: Sequence[str], describe_unit: Callable[[int], str | None], limit: int = 2
) -> list[tuple[str | None, str]]:
    """Parse the sandbox's ``errors`` (``"assert #3: AssertionError: ..."``) into pairs.

    Args:
        errors: :attr:`comlrl.envs.sandbox.Verdict.errors` strings, in run order.
        describe_unit: maps a 1-based test-unit number to that unit's source (or ``None``).
        limit: at most this many pairs.

    Returns:
        ``(unit_source_or_None, error_message)`` pairs; setup errors come with ``None``.
    """
    out: list[tuple[str | None, str]] = []
    for err in errors:
        match = _UNIT_ERROR.match(err)
        if match:
            out.append((describe_unit(int(match.group(1))), match.group(2)))
        else:
            out.append((None, err))
        if len(out) >= limit:
            break
    return out


def signatures(code: str) -> list[str]:
    """``def name(args)`` lines of the top-level functions (and class methods) in ``code``."""
    try:
        module = ast.parse(code)
    except SyntaxError:
        return []
    out = []
    for node in module.body:
        funcs = [node]
        if isinstance(node, ast.ClassDef):
            funcs = list(node.body)
        for func in funcs:
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                returns = f" -> {ast.unparse(func.returns)}" if func.returns else ""
                out.append(f"def {func.name}({ast.unparse(func.args)}){returns}")
    return out


def strip_docstrings(code: str) -> str:
    """``code`` without the docstrings of its functions and classes (the prompt already
    shows them); ``code`` unchanged when it does not parse."""
    try:
        module = ast.parse(code)
    except SyntaxError:
        return code
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(module)


def verdict_line(info: Mapping[str, Any], turn: int) -> str:
    """One line summing a sandbox verdict up, e.g. ``"Turn 0: 2 of 7 tests passed (failed)."``
    (``turn`` counted from 0, as the training metrics count turns: ``turn_0/reward_mean``)."""
    status = info.get("status", "unknown")
    passed, total = info.get("passed", 0), info.get("total", 0)
    line = f"Turn {turn}: {passed} of {total} tests passed ({status})."
    if status in ("error", "syntax_error", "timeout", "killed", "no_result", "not_run"):
        error = info.get("error")
        if error:
            line += " " + clip(str(error), MAX_ERROR_CHARS)
    return line


def agent_feedback_text(
    info: Mapping[str, Any],
    turn: int,
    own_code: str,
    teammate_code: str,
    describe_unit: Callable[[int], str | None],
    *,
    empty_note: str = "(you wrote no usable code)",
) -> str:
    """The feedback text of one agent (see the module docstring for the layout).

    Args:
        info: the joint action's reward info (sandbox verdict fields ``status``,
            ``passed``, ``total``, ``error``, ``errors``).
        turn: the 0-based turn the joint action belongs to.
        own_code: the code extracted from this agent's completion (shown without
            docstrings).
        teammate_code: the code extracted from the other agent's completion (only its
            function signatures are shown).
        describe_unit: 1-based test-unit number -> that test's source, for the failing test.
        empty_note: shown instead of the code when ``own_code`` is empty.
    """
    lines = [verdict_line(info, turn)]
    if info.get("status") != "passed":
        for unit, message in failing_units(list(info.get("errors") or []), describe_unit):
            if unit:
                lines.append("Failing test: " + clip(unit, MAX_TEST_CHARS))
            lines.append("Error: " + clip(message.rstrip().rstrip(":"), MAX_ERROR_CHARS))
    lines.append("Your previous code:")
    shown = strip_docstrings(own_code)
    lines.append(clip(shown, MAX_CODE_CHARS) if shown.strip() else empty_note)
    sigs = signatures(teammate_code)
    lines.append("Your teammate's functions: " + ("; ".join(sigs) if sigs else "(none usable)"))
    return "\n".join(lines)


def feedback_comment_block(history: Sequence[Feedback], agent: int) -> str:
    """Agent ``agent``'s latest feedback as Python comment lines (``""`` on turn 0).

    Only the last feedback is shown: it already carries the agent's latest code, and older
    turns would only lengthen the prompt.
    """
    if not history:
        return ""
    text = history[-1].texts[agent]
    body = "\n".join(("# " + ln).rstrip() for ln in text.split("\n"))
    return (
        "# Feedback on your team's previous attempt:\n"
        + body
        + "\n# Fix the problem and write your part again in full.\n"
    )
