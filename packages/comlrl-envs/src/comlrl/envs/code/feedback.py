"""Multi-turn feedback for the code suites: sandbox verdict -> short text per agent.

The trainer calls ``task.feedback(example, joint_action, info, turn)`` after scoring a joint
action (``info`` is that joint action's reward info, i.e. the sandbox verdict plus task
fields) and builds the next turn's prompts with ``task.prompts(example, history)``. The
helpers here make the feedback text compact (every piece is capped) and render it as Python
comments, so a completion-style code prompt stays valid Python up to where the agent writes.

Two modes (a suite's ``feedback=`` argument; :data:`FEEDBACK_MODES`):

- ``"tester"`` (the default of every code suite: ``coop_humaneval``,
  ``coop_humaneval_che``, ``mbpp``, ``classeval``): what a tester shows a colleague, never
  the key. For each of the first failing tests, the failing input and the program's own
  output or error: the test's last call into the program and what came back
  (:attr:`comlrl.envs.sandbox.Verdict.observed`), and the error when it is the program's
  own (an assertion's message, which names the expected value, is not shown). ClassEval
  also names the failing test method and shows its source with the expected values of its
  assertions replaced by ``...`` (:func:`mask_expected`)::

      Turn 0: 2 of 7 tests passed (failed).
      Your program: has_close_elements([1.0, 2.0, 3.9], 0.3) returned True
      Error: the check failed (its expected value is not shown)
      Your previous code:
      def aux(numbers):
          ...
      Your teammate's functions: def has_close_elements(numbers, threshold)

- ``"verbatim"``: CoMLRL 1.4.3's feedback, the failing test quoted as written with its
  error (``Failing test: assert candidate([1.0, 2.0], 0.5) == False``). It hands the
  expected values of scored tests to the next turn: a program that is a lookup table of
  what it was shown scores on those tests at the next turn without solving anything.
  Kept for comparisons with CoMLRL; a suite made with it warns.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from comlrl.core import Feedback

__all__ = [
    "FEEDBACK_MODES",
    "check_feedback_mode",
    "mask_expected",
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
FEEDBACK_MODES: tuple[str, ...] = ("tester", "verbatim")
"""The feedback modes of the code suites (see the module docs)."""
_ASSERTION = re.compile(r"^(AssertionError: )*AssertionError\b")


def check_feedback_mode(mode: str, suite: str) -> str:
    """``mode`` checked (one of :data:`FEEDBACK_MODES`); ``"verbatim"`` warns what it allows.

    Raises:
        ValueError: for another mode.
    """
    if mode not in FEEDBACK_MODES:
        raise ValueError(f"feedback must be one of {FEEDBACK_MODES}, got {mode!r}")
    if mode == "verbatim":
        warnings.warn(
            f"{suite}: feedback='verbatim' quotes the scored tests with their expected values "
            "in the next turn's prompt: a program that returns what it was shown passes "
            "them at the next turn without solving the problem (use feedback='tester')",
            UserWarning,
            stacklevel=3,
        )
    return mode


def mask_expected(source: str, program_names: Collection[str] = ()) -> str:
    """``source`` (a test method) with the expected values of its assertions hidden.

    An argument of a ``self.assert*(...)`` call that is built from constants alone (a
    literal, a container of them, a constructor such as ``datetime.datetime(2024, 1, 2)``
    with constant arguments) becomes ``...``, and so does such a value assigned to a name
    that an assertion then reads; what involves the program (a call of one of
    ``program_names``, e.g. the class under test, or of a method of ``self`` or of a local
    variable) stays, with its inputs. ``source`` unchanged when it does not parse.
    """
    try:
        module = ast.parse(source)
    except SyntaxError:
        return source
    program = set(program_names) | {"self"}
    for node in ast.walk(module):  # local variables may hold the program's objects
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            program.add(node.id)
        elif isinstance(node, ast.arg):
            program.add(node.arg)

    def root(node: ast.AST) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    def constant(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.UnaryOp):
            return constant(node.operand)
        if isinstance(node, ast.BinOp):
            return constant(node.left) and constant(node.right)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return all(constant(e) for e in node.elts)
        if isinstance(node, ast.Dict):
            return all(k is None or constant(k) for k in node.keys) and all(
                constant(v) for v in node.values
            )
        if isinstance(node, ast.Call):  # a stdlib value built from constants
            name = root(node.func)
            return (
                name is not None
                and name not in program
                and isinstance(node.func, ast.Attribute | ast.Name)
                and all(constant(a) for a in node.args)
                and all(constant(k.value) for k in node.keywords)
            )
        return False

    checked: set[str] = set()
    for node in ast.walk(module):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("assert")
        ):
            args = list(node.args) + [k.value for k in node.keywords]
            checked.update(a.id for a in args if isinstance(a, ast.Name))
            node.args = [ast.Constant(...) if constant(a) else a for a in node.args]
            for kw in node.keywords:
                if constant(kw.value):
                    kw.value = ast.Constant(...)
    for node in ast.walk(module):
        if isinstance(node, ast.Assign) and constant(node.value):
            if any(isinstance(t, ast.Name) and t.id in checked for t in node.targets):
                node.value = ast.Constant(...)
    return ast.unparse(module)


def _tester_error(message: str) -> str:
    """The program's own error, or a note that a check failed (its message would name the
    expected value)."""
    text = message.strip().rstrip(":").strip()
    if not text or _ASSERTION.match(text):
        return "the check failed (its expected value is not shown)"
    while text.startswith("AssertionError: "):  # a unittest error wrapped by the harness
        text = text[len("AssertionError: ") :]
    return clip(text, MAX_ERROR_CHARS)


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
    mode: str = "tester",
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
        describe_unit: 1-based test-unit number -> what to show of that test (``"verbatim"``:
            its source; ``"tester"``: a view without expected values, or ``None``).
        mode: ``"tester"`` or ``"verbatim"`` (see the module docs).
        empty_note: shown instead of the code when ``own_code`` is empty.
    """
    lines = [verdict_line(info, turn)]
    if info.get("status") != "passed" and mode == "verbatim":
        for unit, message in failing_units(list(info.get("errors") or []), describe_unit):
            if unit:
                lines.append("Failing test: " + clip(unit, MAX_TEST_CHARS))
            lines.append("Error: " + clip(message.rstrip().rstrip(":"), MAX_ERROR_CHARS))
    elif info.get("status") != "passed":
        observed = {int(k): str(v) for k, v in dict(info.get("observed") or {}).items()}
        reported = 0
        for err in info.get("errors") or []:
            match = _UNIT_ERROR.match(str(err))
            if not match:
                continue  # a setup statement of the tests: nothing of the program's
            number, message = int(match.group(1)), match.group(2)
            unit = describe_unit(number)
            if unit:
                lines.append("Failing test: " + clip(unit, MAX_TEST_CHARS))
            if number in observed:
                lines.append("Your program: " + clip(observed[number], MAX_ERROR_CHARS))
            lines.append("Error: " + _tester_error(message))
            reported += 1
            if reported >= 2:
                break
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
