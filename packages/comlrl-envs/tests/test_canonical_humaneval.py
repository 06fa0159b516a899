"""Every canonical HumanEval solution passes every test unit through the sandbox pool."""

from __future__ import annotations

import time
from typing import Any

import pytest
from comlrl.envs.sandbox import CheckJob, SandboxLimits, SandboxPool


def _run(
    rows: list[dict[str, Any]], body: str | None, executor: str = "fork"
) -> tuple[list[Any], float]:
    jobs = [
        CheckJob(
            r["prompt"] + (r["canonical_solution"] if body is None else body),
            r["test"],
            r["entry_point"],
        )
        for r in rows
    ]
    start = time.perf_counter()
    with SandboxPool(max_workers=2) as pool:
        verdicts = pool.check_many(jobs, SandboxLimits(timeout_s=10.0, executor=executor))
    return verdicts, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["fork", "exec"])
def test_all_164_canonical_solutions_pass_every_unit(
    humaneval_rows: list[dict[str, Any]], executor: str
) -> None:
    verdicts, elapsed = _run(humaneval_rows, None, executor)
    failures = [
        (r["task_id"], v.status, v.error)
        for r, v in zip(humaneval_rows, verdicts, strict=True)
        if v.status != "passed" or v.passed != v.total or v.total == 0
    ]
    assert not failures, failures[:5]
    assert {v.execution.isolation.get("executor") for v in verdicts} == {executor}
    assert elapsed < 60, f"164 canonical solutions took {elapsed:.1f}s on the pool"


def test_stub_solutions_pass_no_problem(humaneval_rows: list[dict[str, Any]]) -> None:
    # Control: the same harness on `return None` bodies must not call anything solved.
    verdicts, _ = _run(humaneval_rows, "    return None\n")
    assert not [v for v in verdicts if v.status == "passed"]
    passed = sum(v.passed for v in verdicts)
    total = sum(v.total for v in verdicts)
    assert passed / total < 0.05, (passed, total)
