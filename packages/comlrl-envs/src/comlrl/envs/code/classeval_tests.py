"""ClassEval's ``unittest`` classes as a HumanEval-format ``check(candidate)``.

Each ``test_*`` method becomes one test unit, run as its own ``unittest`` suite inside the
program's process (``CheckJob(same_process=True)``) by the runner code below, which the
check source carries: ``setUp``/``tearDown``/``setUpClass`` apply, skips fail, and every
``assert*`` refuses values whose comparison or truth value the program's own code would
answer. Used by :class:`~comlrl.envs.code.classeval.ClassEvalTask`.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

__all__ = ["classeval_check_source", "unittest_methods"]

_RUNNER = '''
_COMLRL_DUNDERS = (
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__",
    "__contains__", "__iter__", "__hash__", "__add__", "__radd__", "__sub__", "__rsub__",
    "__abs__", "__round__", "__float__", "__int__", "__index__",
)
_COMLRL_RESTORE = globals().get("__comlrl_restore__", lambda: None)
_COMLRL_MRO = type.__dict__["__mro__"]
_COMLRL_VARS = type.__dict__["__dict__"]
_COMLRL_C_KINDS = ("wrapper_descriptor", "method_descriptor", "builtin_function_or_method")


def _comlrl_program_answers(value, depth=0):
    """Whether comparing or truth-testing value would run code that is not the stdlib's."""
    if depth > 50:
        return True
    cls = type(value)
    for klass in _COMLRL_MRO.__get__(cls, type):
        attrs = _COMLRL_VARS.__get__(klass, type)
        for name in _COMLRL_DUNDERS:
            if name not in attrs or attrs[name] is None:
                continue
            fn = attrs[name]
            kind = type(fn)
            if kind.__name__ in _COMLRL_C_KINDS and kind.__module__ == "builtins":
                continue
            if kind is type(_comlrl_program_answers) and not fn.__code__.co_filename.startswith("<"):
                continue
            return True
    if cls in (list, tuple, set, frozenset):
        return any(_comlrl_program_answers(v, depth + 1) for v in value)
    if cls is dict:
        return any(
            _comlrl_program_answers(k, depth + 1) or _comlrl_program_answers(v, depth + 1)
            for k, v in value.items()
        )
    return False


def _comlrl_guarded(assertion):
    def guarded(*args, **kwargs):
        _COMLRL_RESTORE()
        for value in (*args, *kwargs.values()):
            if _comlrl_program_answers(value):
                raise AssertionError(
                    f"{type(value).__name__}: the test would compare a value whose comparison "
                    "the program defines"
                )
        return assertion(*args, **kwargs)

    return guarded


def _comlrl_run_test(candidate, case, method):
    """Run one unittest test method; raise AssertionError with its failure, else True.

    Run with CheckJob(same_process=True): __comlrl_restore__ (from the sandbox) puts
    unittest back as it was before the program loaded. Skips count as failures. Every
    assert* method of the test case refuses values whose comparison, truth value
    or arithmetic the program's own code would answer (a returned object whose __eq__
    is always True gets no credit).
    """
    test = case(method)
    for name in dir(test):
        if name.startswith("assert") and callable(getattr(test, name)):
            setattr(test, name, _comlrl_guarded(getattr(test, name)))
    result = unittest.TestResult()
    unittest.TestSuite([test]).run(result)
    _COMLRL_RESTORE()
    for _, trace in result.errors + result.failures:
        lines = [ln for ln in trace.strip().splitlines() if ln.strip()]
        raise AssertionError(lines[-1][:300] if lines else "test failed")
    if result.skipped or result.expectedFailures or result.unexpectedSuccesses:
        raise AssertionError(f"test {method} was skipped or marked as an expected failure")
    if result.testsRun != 1:
        raise AssertionError(f"test {method} did not run")
    return True
'''


def unittest_methods(test: str) -> list[tuple[str, str, str]]:
    """``(class_name, method_name, method_source)`` of every ``test_*`` method, in order."""
    out = []
    for node in ast.parse(test).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    out.append((node.name, item.name, ast.unparse(item)))
    return out


def classeval_check_source(test: str, imports: Sequence[str] = ()) -> str:
    """A ClassEval ``unittest`` source as a HumanEval-format test with one unit per method.

    Args:
        test: the row's ``test`` field (``unittest.TestCase`` classes).
        imports: the row's ``import_statement`` lines (the tests may use them).

    Raises:
        ValueError: when ``test`` does not parse or has no ``test_*`` methods.
    """
    try:
        module = ast.parse(test)
    except SyntaxError as exc:
        raise ValueError(f"ClassEval test source does not parse: {exc}") from exc
    kept = [
        ast.unparse(node)
        for node in module.body
        if not (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    ]
    methods = unittest_methods(test)
    if not methods:
        raise ValueError("ClassEval test source has no test_* methods")
    units = "\n".join(
        f"    assert _comlrl_run_test(candidate, {cls}, {name!r})" for cls, name, _ in methods
    )
    head = "\n".join(["import unittest", *imports])
    return f"{head}\n\n" + "\n\n".join(kept) + f"\n\n{_RUNNER}\n\ndef check(candidate):\n{units}\n"
