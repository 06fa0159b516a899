"""Extraction and rewards on real chat-model output: SmolLM2-135M-Instruct's greedy answers.

``data/smollm2_completions.json`` holds what the model wrote for the first test problems
of each code suite, through its chat template (``chat``) and on the completion-style
text (``raw``); ``data/record_smollm2.py`` says how it was recorded. The model is not
needed here. The floors below are what the extraction found when the file was recorded:
a change that parses real answers worse fails them.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from comlrl.core import get_task

DATA = Path(__file__).resolve().parent / "data"
RECORDED = DATA / "smollm2_completions.json"
SHARED_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"

SUITE_FILES = {
    "coop_humaneval_che": "CoopHumanEval_che_raw.json",
    "mbpp": "mbpp.jsonl",
    "classeval": "ClassEval_data.json",
}

# suite -> (chat answers whose agent-1 code defines its function(s) with a body, same for
# agent 2), counted when the file was recorded
FLOORS = {
    "coop_humaneval": (8, 7),
    "coop_humaneval_che": (3, 3),
    "mbpp": (2, 2),
    "classeval": (3, 1),
}


def _record() -> dict[str, Any]:
    return json.loads(RECORDED.read_text(encoding="utf-8"))


def _task_and_rows(name: str, humaneval_file: Path) -> tuple[Any, list[dict[str, Any]]]:
    if name == "coop_humaneval":
        path = humaneval_file
    else:
        path = SHARED_DATA / SUITE_FILES[name]
        if not path.is_file():
            pytest.skip(f"{name} data not found at {path} (needs ../shared beside the repo)")
    task = get_task(name, path=path, max_workers=2)
    by_id = {row["task_id"]: row for row in task.load("test")}
    return task, [by_id[t] for t in _record()["suites"][name]["task_ids"]]


def test_fixture_is_small_and_says_how_it_was_made() -> None:
    assert RECORDED.stat().st_size < 100_000
    record = _record()
    assert (DATA / "record_smollm2.py").is_file()
    assert record["recorded_with"].endswith("record_smollm2.py")
    assert record["decoding"] == {"greedy": True, "max_new_tokens": 256, "split": "test"}
    assert set(record["suites"]) == set(FLOORS)
    for entry in record["suites"].values():
        for fmt in ("chat", "raw"):
            assert [len(c) for c in entry[fmt]["completions"]] == [len(entry["task_ids"])] * 2


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_chat_answers_yield_code_that_parses_and_defines_the_asked_functions(
    name: str, humaneval_file: Path
) -> None:
    task, rows = _task_and_rows(name, humaneval_file)
    try:
        helpers, mains = _record()["suites"][name]["chat"]["completions"]
        defined = [0, 0]
        for row, helper, main in zip(rows, helpers, mains, strict=True):
            if name == "classeval":
                program, methods = task.build_program([helper, main], row)
                for a in range(2):
                    defined[a] += bool(methods[a])
            else:
                program, flags = task.build_program(helper, main, row)
                defined[0] += flags["helper_defined"]
                defined[1] += flags["main_defined"]
                # no example call, print, assert or test survives at the top level
                for node in ast.parse(program).body:
                    assert not isinstance(node, (ast.Expr, ast.Assert, ast.If)), ast.unparse(node)
            ast.parse(program)
        assert defined[0] >= FLOORS[name][0] and defined[1] >= FLOORS[name][1], (name, defined)
    finally:
        task.close()


def test_recorded_coop_humaneval_programs_load_and_score_as_recorded(humaneval_file: Path) -> None:
    task, rows = _task_and_rows("coop_humaneval", humaneval_file)
    entry = _record()["suites"]["coop_humaneval"]
    try:
        batch = task.reward(entry["chat"]["completions"], rows)
    finally:
        task.close()
    # structure, not exact test verdicts (those belong to the sandbox): both functions
    # defined and the combined program loaded, as when the file was recorded
    complete = [
        info["helper_defined"] and info["main_defined"] and info["reward_parts"]["program_loaded"]
        for info in batch.infos
    ]
    assert sum(map(bool, complete)) >= 7, batch.infos
    # the acceptance bar of the chat path, and better than the same model on raw prompts
    mean = sum(batch.rewards) / len(batch.rewards)
    assert mean >= 0.2
    assert mean > entry["raw"]["reward_mean"]
