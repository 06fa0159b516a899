"""HumanEval-style test verdicts with partial credit, reported through an honest channel.

:func:`check_solution` runs ``program`` in the sandbox, then the ``test`` source's
``check(candidate)`` function against ``program``'s ``entry_point``, one *test unit* at a
time:

- The test source is split in the parent with :mod:`ast`. Its module-level statements
  (other than ``def check`` and calls to ``check``) run first, in order. Each top-level
  statement of ``check``'s body that contains an ``assert`` and uses the candidate (a
  plain ``assert``, or a loop or block with asserts inside) is one *unit*; the other
  statements are setup and run in order between them (so HumanEval's many
  ``assert True, "..."`` lines give no free credit). ``passed / total`` over the units
  is the partial credit.
- A unit fails when it raises anything (``AssertionError``, any exception, ``SystemExit``
  from a candidate calling ``sys.exit``) or runs past ``assert_timeout_s``.
- The tests and the program run in two processes of the same sandbox (see
  ``_runner_check.py``). The *test process* holds the result pipe, runs every test
  statement and writes the verdict; it never executes the program. It forks the
  *candidate process* before it reads the nonce and the test plan (they come second on
  stdin), so the program never has them in memory; the test process is not dumpable, so
  the program cannot ``ptrace`` it or open its memory or descriptors through ``/proc``.
  The candidate process loads the program and answers calls over a private pipe pair.
- Values cross as data: ``marshal`` bytes accepted only when every value is exactly one
  of ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes`` or a
  ``list``/``tuple``/``dict``/``set``/``frozenset`` of them (``type(x) is ...``,
  recursively; subclasses such as ``Counter`` or a namedtuple arrive as their base data,
  ``deque``/``Decimal``/``Fraction`` are rebuilt from plain data). Any other object stays
  in the candidate process as a handle that can be called, iterated, indexed, printed or
  have attributes read/set, but refuses ``==``, ``!=``, ordering and arithmetic (the
  unit raises ``TypeError`` and fails); membership in it (``x in handle``, ``assertIn``)
  is decided by the test process over the items its iteration yields, its truth by
  Python's rule in the test process (its length when its class defines ``__len__``; a
  class with its own ``__bool__`` is refused), ``isinstance`` by its class's MRO: no
  dunder of the program answers a test's question. Floats compare as the benchmark
  wrote them (``abs(a - b) < tol``, ``math.isclose``), with the test process's ``math``.
- Names the test uses but does not define are looked up in the program: modules are
  imported afresh in the test process, plain values copied, other objects become handles.
  Builtins always come from the test process. (The HumanEval suites put the prompt's own
  helpers before the test, see :func:`comlrl.envs.code.humaneval.scored_test`.)
- The verdict goes to the result pipe, tagged with the nonce, after all units ran. A
  program that exits or crashes while loading or inside a call (``os._exit``, a signal)
  gets no verdict; ``SystemExit`` raised inside a call fails that unit. A unit's time
  budget is enforced in both processes; a candidate that does not answer within it (plus
  0.25 s) is killed and the remaining calls fail. Frames on the call pipe that the
  harness's own candidate code would never send mark the run ``tampered`` (no credit).
  Stdout is never parsed.

``unittest`` tests (ClassEval): a unit ``assert __comlrl_unittest__(candidate, Case,
"test_x")`` runs that test method with ``unittest`` in the test process; the program's
objects stay in the candidate process as handles (attribute reads give lists, dicts and
sets whose changes are written back into the program's objects; a call's in-place
changes to the tests' own list/dict/set arguments are written back to them; the
program's exception classes become stand-ins that ``assertRaises`` matches; the tests'
own callables, e.g. a ``MagicMock`` set as a method, stay in the test process and run
there when the program calls them; an ``xml.etree`` element crosses as its XML text).
The unit passes only when the test reported success itself.

Threat model: with two processes, nothing a program does inside its own process decides a
comparison or reaches the verdict; what it controls is the data it returns and whether
it answers, and the process limits bound the rest. Every phase runs on the test
process's timer (the load, each unit, the call counts); a candidate that stops the test
process (``SIGSTOP``) ends the run at once, without a verdict, where the run has a PID
namespace (its init kills the stopped test process; without one the wall clock ends it).
Every run gets a new IPC namespace, so no SysV/POSIX-mq object outlives it, and a seccomp
filter refuses keyrings and shared file locks, so no run hands anything to another. Not
protected: the per-function call counts (``track_calls``, reported by the candidate
process).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from comlrl.envs.sandbox.executor import execute
from comlrl.envs.sandbox.limits import ExecutionResult, SandboxLimits

__all__ = [
    "Verdict",
    "VerdictStatus",
    "TestPlan",
    "split_test",
    "check_solution",
    "check_payload",
    "verdict_from_execution",
]

VerdictStatus = Literal[
    "passed",
    "failed",
    "error",
    "syntax_error",
    "timeout",
    "killed",
    "no_result",
    "tampered",
    "not_run",
]


@dataclass(frozen=True, slots=True)
class TestPlan:
    """A HumanEval ``test`` source split into ordered statements.

    Attributes:
        steps: ``(source, is_unit)`` pairs in execution order: module-level setup, then the
            body of ``check``; ``is_unit`` marks statements that contain an ``assert``
            and refer to the candidate.
        arg_name: the name of ``check``'s parameter (``"candidate"`` in HumanEval).
        names: the names the test source reads but never binds (sorted): those that are
            not builtins are looked up in the program (the class under test, helpers).
            The test process drops the builtins itself (with its own copy of them), so a
            program can neither shadow one nor add a name of its choosing.
    """

    steps: tuple[tuple[str, bool], ...]
    arg_name: str
    names: tuple[str, ...] = ()

    @property
    def num_units(self) -> int:
        """Number of test units (the denominator of the partial credit)."""
        return sum(1 for _, is_unit in self.steps if is_unit)


def _is_check_call(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "check"
    )


@functools.lru_cache(maxsize=2048)
def split_test(test: str) -> TestPlan:
    """Split a HumanEval-format ``test`` source into setup statements and test units.

    Raises:
        ValueError: when ``test`` does not parse, defines no ``check`` function, or
            ``check`` does not take exactly one positional parameter.
    """
    try:
        module = ast.parse(test)
    except SyntaxError as exc:
        raise ValueError(f"test source does not parse: {exc}") from exc
    steps: list[tuple[str, bool]] = []
    check: ast.FunctionDef | None = None
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            check = node
        elif not _is_check_call(node):
            steps.append((ast.unparse(node), False))
    if check is None:
        raise ValueError("test source defines no `def check(candidate):` function")
    if len(check.args.args) != 1:
        raise ValueError(
            f"check() must take exactly one parameter (the candidate), got "
            f"{[a.arg for a in check.args.args]}"
        )
    for stmt in check.body:
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            continue  # docstring / bare string
        arg = check.args.args[0].arg
        nodes = list(ast.walk(stmt))
        is_unit = any(isinstance(n, ast.Assert) for n in nodes) and any(
            isinstance(n, ast.Name) and n.id == arg for n in nodes
        )
        steps.append((ast.unparse(stmt), is_unit))
    return TestPlan(tuple(steps), check.args.args[0].arg, _free_names(module))


def _free_names(module: ast.Module) -> tuple[str, ...]:
    """The names ``module`` reads but never binds anywhere (sorted): what it may need from
    the program. Builtins are filtered out later, by the test process itself."""
    read: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
    return tuple(sorted(read - bound))


@dataclass(slots=True)
class Verdict:
    """The outcome of running one program against one test.

    Attributes:
        status: ``"passed"`` all units passed; ``"failed"`` verdict received, some unit
            failed; ``"error"`` the program raised while loading, or the entry point is
            missing; ``"syntax_error"`` the program does not compile; ``"timeout"`` /
            ``"killed"`` the process hit the wall-clock limit / was killed before a
            verdict; ``"no_result"`` the process ended without writing a verdict (e.g.
            ``sys.exit(0)`` while loading); ``"tampered"`` the result channel held lines
            the runner did not write; ``"not_run"`` the caller decided not to run the
            program (e.g. a task whose reward cannot depend on the result, see
            ``CoopHumanEvalTask(sandbox_all=...)``).
        passed: units passed (0 unless a verdict arrived through the channel).
        total: units in the test.
        program_loaded: the program's top level ran without raising.
        calls: ``{name: count}`` calls of the tracked functions made during the tests.
        errors: up to 5 short failure messages (``"assert #3: AssertionError: "``).
        observed: for up to 2 failed units, unit number (1-based) -> that unit's last call
            into the program and what came back, in the program's own words
            (``"sq(3) returned 10"``, ``"sq(-1) raised ValueError: ..."``): what a tester
            shows without the expected value (see :mod:`comlrl.envs.code.feedback`).
        error: one-line summary of why the run earned less than full credit, if so.
        duration_s: wall-clock seconds of the sandboxed run.
        execution: the underlying :class:`ExecutionResult` (stdout/stderr, isolation).
    """

    status: VerdictStatus
    passed: int
    total: int
    program_loaded: bool = False
    calls: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    error: str | None = None
    observed: dict[int, str] = field(default_factory=dict)
    duration_s: float = 0.0
    execution: ExecutionResult | None = field(default=None, repr=False)

    @property
    def fraction(self) -> float:
        """``passed / total`` in ``[0, 1]`` (0 when there are no units)."""
        return self.passed / self.total if self.total else 0.0

    def as_info(self) -> dict[str, Any]:
        """A small JSON-friendly dict for logs (no program output)."""
        return {
            "status": self.status,
            "passed": self.passed,
            "total": self.total,
            "fraction": self.fraction,
            "program_loaded": self.program_loaded,
            "calls": dict(self.calls),
            "error": self.error,
            "errors": list(self.errors),
            "observed": {str(n): text for n, text in self.observed.items()},
            "duration_s": round(self.duration_s, 4),
        }


def check_payload(
    program: str,
    plan: TestPlan,
    entry_point: str,
    *,
    track_calls: Sequence[str] = (),
    assert_timeout_s: float | None = None,
) -> dict[str, Any]:
    """The runner instructions for a check run (used by :func:`check_solution`)."""
    return {
        "mode": "check",
        "code": program,
        "plan": [[src, is_unit] for src, is_unit in plan.steps],
        "entry_point": entry_point,
        "arg_name": plan.arg_name,
        "entry_label": entry_point,
        "names": list(plan.names),
        "track_calls": list(track_calls),
        "assert_timeout_s": assert_timeout_s,
    }


def verdict_from_execution(result: ExecutionResult, total: int) -> Verdict:
    """Turn an :class:`ExecutionResult` of a check run into a :class:`Verdict`.

    ``total`` is the parent's own count of test units; the child's count is not trusted.
    """

    def make(status: VerdictStatus, passed: int = 0, **kw: Any) -> Verdict:
        return Verdict(status, passed, total, duration_s=result.duration_s, execution=result, **kw)

    if result.tampered:
        return make("tampered", error="result channel held lines not written by the harness")
    rec = next((r for r in result.records if r.get("kind") == "verdict"), None)
    if rec is None:
        if result.status in ("timeout", "killed", "syntax_error"):
            return make(result.status, error=result.error or result.status)  # type: ignore[arg-type]
        if result.status == "failed_to_start":
            return make("error", error=f"sandbox failed to start: {result.stderr[:200]}")
        return make(
            "no_result",
            error=f"process ended (exit code {result.returncode}) before the tests reported; "
            "no credit",
        )
    if rec.get("tampered"):
        return make("tampered", error="the candidate's process broke the harness protocol")
    errors = [str(e) for e in rec.get("errors", [])][:5]
    loaded = bool(rec.get("program_loaded", False))
    if "syntax_error" in rec:
        return make("syntax_error", error=str(rec["syntax_error"]), errors=errors)
    if rec.get("load_timeout"):
        return make("timeout", error=str(rec.get("program_error", "timed out while loading")))
    if "program_error" in rec:
        return make("error", program_loaded=loaded, error=str(rec["program_error"]), errors=errors)
    passed = max(0, min(int(rec.get("passed", 0)), total))
    calls = {str(k): int(v) for k, v in dict(rec.get("calls", {})).items()}
    observed = {
        int(n): str(text)[:600]
        for n, text in (p for p in rec.get("observed") or () if isinstance(p, list) and len(p) == 2)
        if isinstance(n, int) and 0 < n <= total
    }
    status: VerdictStatus = "passed" if total and passed == total else "failed"
    return make(
        status,
        passed,
        program_loaded=loaded,
        calls=calls,
        errors=errors,
        observed=observed,
        error=None if status == "passed" else (errors[0] if errors else "some tests failed"),
    )


def check_solution(
    program: str,
    test: str,
    entry_point: str,
    limits: SandboxLimits | None = None,
    *,
    track_calls: Sequence[str] = (),
    assert_timeout_s: float | None = 2.0,
) -> Verdict:
    """Run ``program`` in the sandbox and score it with ``test``'s ``check(entry_point)``.

    Args:
        program: complete Python source defining ``entry_point`` (prompt + completion).
        test: HumanEval-format test source defining ``check(candidate)``.
        entry_point: name of the function under test.
        limits: sandbox limits for the whole run (default :class:`SandboxLimits()`).
        track_calls: names of program functions whose calls during the tests are counted
            (reported in :attr:`Verdict.calls`).
        assert_timeout_s: time budget of each test unit (``SIGALRM`` in the child); a unit
            past it fails and the next one runs. ``None`` disables it (only the wall-clock
            limit applies, and a hang then costs every unit).

    Returns:
        A :class:`Verdict`; never raises for anything the program does.

    Raises:
        ValueError: when ``test`` is malformed (see :func:`split_test`).
    """
    plan = split_test(test)
    payload = check_payload(
        program,
        plan,
        entry_point,
        track_calls=track_calls,
        assert_timeout_s=assert_timeout_s,
    )
    result = execute(payload, limits or SandboxLimits())
    return verdict_from_execution(result, plan.num_units)
