"""Cooperative MBPP: a helper-writing agent and a main-function agent (``mbpp``).

MBPP (Austin et al. 2021, "Program Synthesis with Large Language Models", CC-BY-4.0)
problems are a one-line task text, a reference ``code`` and three ``assert`` lines
(``test_list``, plus ``test_setup_code``). This module turns each row into the HumanEval
format the sandbox scores, then reuses :class:`~comlrl.envs.code.humaneval.CoopHumanEvalTask`
(same prompts, roles, reward and multi-turn feedback):

- ``entry_point``: the reference's top-level function that the first test calls.
- ``prompt``: the reference's top-level imports, then the entry point's signature (taken
  from the reference, as the tests need it) with a docstring holding the task text and the
  first test as an example.
- ``test``: ``test_setup_code`` (full MBPP) or ``test_imports`` (sanitized) at module
  level, then ``def check(<entry_point>):`` whose body is the ``test_list`` asserts
  unchanged (the parameter takes the entry point's name, so each assert is one unit and
  reads as written). ``challenge_test_list`` is not used.
- ``reference_program``: the reference ``code``.

Accepted files: the full ``mbpp.jsonl`` (974 rows: ``text``, ``code``, ``task_id``,
``test_setup_code``, ``test_list``, ``challenge_test_list``) and ``sanitized-mbpp.json``
(427 rows: ``prompt``, ``code``, ``task_id``, ``test_imports``, ``test_list``), as
``.jsonl`` or ``.json`` (a list). Splits follow MBPP's paper by ``task_id``: ``test``
11-510, ``train`` 601-974, ``validation`` 511-600, ``prompt`` 1-10 (the sanitized file
holds a subset of each).
"""

from __future__ import annotations

import ast
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comlrl.envs.code.humaneval import CoopHumanEvalTask

__all__ = ["MbppTask", "load_mbpp", "mbpp_to_humaneval", "MBPP_SPLITS"]

MBPP_SPLITS: dict[str, tuple[int, int]] = {
    "prompt": (1, 10),
    "test": (11, 510),
    "validation": (511, 600),
    "train": (601, 974),
}
"""MBPP's standard splits as inclusive ``task_id`` ranges."""


def _read_rows(file: Path) -> list[dict[str, Any]]:
    name = file.name.lower()
    if name.endswith(".jsonl"):
        with open(file, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    if name.endswith(".json"):
        data = json.loads(file.read_text(encoding="utf-8"))
        return list(data.values()) if isinstance(data, dict) else list(data)
    raise ValueError(f"unsupported MBPP file {file}: use .jsonl or .json")


def load_mbpp(path: str | Path) -> list[dict[str, Any]]:
    """Read MBPP rows (full or sanitized) and convert them with :func:`mbpp_to_humaneval`.

    Args:
        path: ``mbpp.jsonl`` / ``sanitized-mbpp.json`` or a file in either schema.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        ValueError: for an unknown extension or a row that lacks ``task_id``, ``code``,
            ``test_list`` or a task text (``text``/``prompt``).
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"MBPP file not found: {file}; pass path= to a local mbpp.jsonl or "
            "sanitized-mbpp.json (https://github.com/google-research/google-research/tree/"
            "master/mbpp)"
        )
    return [
        mbpp_to_humaneval(row, source=str(file), index=i) for i, row in enumerate(_read_rows(file))
    ]


def _entry_point(code_module: ast.Module | None, code: str, tests: list[str]) -> str:
    defined: list[str] = []
    if code_module is not None:
        defined = [
            n.name
            for n in code_module.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
    called: list[str] = []
    for test in tests:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(test)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.append(node.func.id)
    for name in called:
        if name in defined:
            return name
    if defined:
        return defined[-1]
    if called:
        return called[0]
    raise ValueError("cannot find the function under test")


def mbpp_to_humaneval(
    row: Mapping[str, Any], *, source: str = "<row>", index: int = 0
) -> dict[str, Any]:
    """One MBPP row (full or sanitized schema) as a HumanEval-format row.

    Returns:
        A dict with ``task_id`` (``"MBPP/<id>"``), ``mbpp_id`` (int), ``prompt``,
        ``entry_point``, ``test``, ``reference_program`` and the original ``text``,
        ``test_list``.

    Raises:
        ValueError: when a required field is missing (the message names the row).
    """
    text = row.get("text", row.get("prompt"))
    missing = [k for k in ("task_id", "code", "test_list") if k not in row]
    if text is None:
        missing.append("text (or prompt)")
    if missing:
        raise ValueError(
            f"{source}: row {index} lacks field(s) {missing}; need an MBPP row "
            "(task_id, text/prompt, code, test_list)"
        )
    code = str(row["code"]).replace("\r\n", "\n")
    tests = [str(t).replace("\r\n", "\n") for t in row["test_list"]]
    try:
        with warnings.catch_warnings():  # e.g. invalid escape sequences in old code
            warnings.simplefilter("ignore")
            module: ast.Module | None = ast.parse(code)
    except SyntaxError:
        module = None
    entry = _entry_point(module, code, tests)
    imports: list[str] = []
    signature = f"def {entry}(*args):"
    if module is not None:
        for node in module.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(ast.unparse(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry:
                signature = f"def {entry}({ast.unparse(node.args)}):"
    example = tests[0] if tests else ""
    doc = f"{text.strip()}\n    Example: {example}\n    " if example else f"{text.strip()}\n    "
    doc = doc.replace('"""', "'''")
    prompt = ("\n".join(imports) + "\n\n\n" if imports else "") + f'{signature}\n    """{doc}"""\n'
    setup = str(row.get("test_setup_code") or "").replace("\r\n", "\n").strip()
    setup_lines = [setup] if setup else []
    setup_lines += [str(t) for t in row.get("test_imports") or []]
    body = "\n".join("    " + line for t in tests for line in t.strip().split("\n"))
    test = ("\n".join(setup_lines) + "\n\n\n" if setup_lines else "") + (
        f"def check({entry}):\n{body or '    pass'}\n"
    )
    return {
        "task_id": f"MBPP/{row['task_id']}",
        "mbpp_id": int(row["task_id"]),
        "prompt": prompt,
        "entry_point": entry,
        "test": test,
        "reference_program": code,
        "text": text,
        "test_list": tests,
    }


class MbppTask(CoopHumanEvalTask):
    """Two-agent MBPP (``mbpp``): agent 1 writes ``aux``, agent 2 the tested function.

    Prompts, extraction, reward (in ``[0, 1]``; levels as in
    :class:`~comlrl.envs.code.humaneval.CoopHumanEvalTask`: 0.05 helper + 0.05 main defined,
    0.1 program loaded, 0.7 x tests passed, 0.1 x tests passed when ``aux`` was called) and
    multi-turn feedback are those of ``coop_humaneval``; see :mod:`comlrl.envs.code.mbpp`
    for how MBPP rows become prompts and tests.

    Splits (disjoint, MBPP's own, by ``task_id``): ``train`` 601-974 (374 problems),
    ``test`` 11-510 (500), ``validation`` 511-600 (90), ``prompt`` 1-10 (10);
    ``"val"`` is accepted for ``validation``.

    Args:
        path: ``mbpp.jsonl`` (full) or ``sanitized-mbpp.json``, or a file in either
            schema. Required: MBPP is not bundled.
        **kwargs: as for :class:`~comlrl.envs.code.humaneval.CoopHumanEvalTask`
            (``limit``, ``timeout_s``, ``max_workers``, ``max_turns``, ...), except the
            ``*_range`` arguments.

    Raises:
        ValueError: when ``path`` is missing, or for invalid keyword arguments.
    """

    name = "mbpp"
    #: Where the examples come from (``comlrl tasks`` prints it).
    data_source = (
        "no copy ships: task.kwargs.path=<MBPP mbpp.jsonl (974 rows) or sanitized-mbpp.json>"
    )
    splits = ("train", "test", "validation", "prompt")

    def __init__(self, path: str | Path | None = None, **kwargs: Any) -> None:
        if path is None:
            raise ValueError(
                "mbpp needs its data file: pass path= to a local mbpp.jsonl (974 rows) or "
                "sanitized-mbpp.json (e.g. task.kwargs.path=/data/mbpp.jsonl on the CLI)"
            )
        for key in ("train_range", "test_range"):
            if kwargs.get(key) is not None:
                raise ValueError(f"mbpp splits follow MBPP's task ids; {key} is not supported")
        super().__init__(path, **kwargs)

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        """Rows of ``split`` (``train``/``test``/``validation``/``val``/``prompt``).

        Raises:
            ValueError: for another split name.
            FileNotFoundError: when the data file is missing.
        """
        return super().load("validation" if split == "val" else split)

    def _all_rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            assert self.path is not None
            self._rows = load_mbpp(self.path)
        return self._rows

    def _select(self, rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
        lo, hi = MBPP_SPLITS[split]
        return [r for r in rows if lo <= r["mbpp_id"] <= hi]
