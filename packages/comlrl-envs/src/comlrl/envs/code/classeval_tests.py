"""ClassEval's ``unittest`` classes as a HumanEval-format ``check(candidate)``.

Each ``test_*`` method becomes one test unit, run as its own ``unittest`` suite by the
sandbox's test process (``__comlrl_unittest__``, see
:mod:`comlrl.envs.sandbox.harness`): the test classes and ``unittest`` live there, the
program's class and objects stay in the candidate's process and are driven through
handles (method calls and attribute reads answered with plain data, every comparison
made by the tests' own code). ``setUp``/``tearDown``/``setUpClass`` apply; a unit passes
only when its test reported success itself (skips, expected failures, errors fail). Used
by :class:`~comlrl.envs.code.classeval.ClassEvalTask`.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

__all__ = ["classeval_check_source", "unittest_methods"]


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
        f"    assert __comlrl_unittest__(candidate, {cls}, {name!r})" for cls, name, _ in methods
    )
    head = "\n".join(["import unittest", *imports])
    return f"{head}\n\n" + "\n\n".join(kept) + f"\n\n\ndef check(candidate):\n{units}\n"
