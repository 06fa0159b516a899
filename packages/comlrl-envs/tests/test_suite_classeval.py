"""The classeval suite: test conversion, reference solutions, rewards, feedback."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comlrl.core import JointAction, get_task, prompt_text
from comlrl.envs import ClassEvalTask
from comlrl.envs.code.classeval import NON_STDLIB_MODULES
from comlrl.envs.sandbox import SandboxLimits, SandboxPool

SHARED_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"


def shared_file(name: str) -> Path:
    """``../shared/data/<name>`` beside the repository, or skip with the reason."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"offline data file {path} not found (see shared/README.md)")
    return path


# Reference solutions that fail for reasons outside the solution (see the README).
KNOWN_UNSOUND = {
    "ClassEval_17": "a test depends on today's date",
    "ClassEval_48": "needs the third-party netifaces and the machine's host name",
    "ClassEval_50": "expects a file permission error, which root does not get",
    "ClassEval_58": "the reference places mines at random cells that can collide, while the "
    "test expects exactly k distinct mines (fails in about 1 of 9 runs of the 3x3, k=2 case)",
}
if sys.version_info >= (3, 12):
    # Python 3.12's sum() of floats is compensated (Neumaier), so the last digit changes
    # and an exact float comparison fails (0.9819805060619655 != ...659).
    KNOWN_UNSOUND["ClassEval_31"] = "exact float equality against a pre-3.12 sum()"
# References that may run past the per-test time budget on a loaded 2-core machine.
SLOW = {"ClassEval_35": "EightPuzzle.solve searches for a long time"}


@pytest.fixture(scope="module")
def task() -> Iterator[ClassEvalTask]:
    t = ClassEvalTask(path=shared_file("ClassEval_data.json"), max_workers=2)
    yield t
    t.close()


@pytest.fixture(scope="module")
def rows(task: ClassEvalTask) -> list[dict[str, Any]]:
    return task.load("train") + task.load("test")


def _needs_third_party(row: dict[str, Any]) -> bool:
    text = "\n".join(row["import_statement"]) + row["test"] + row["solution_code"]
    return any(f"import {m}" in text or f"from {m}" in text for m in NON_STDLIB_MODULES)


def test_splits(task: ClassEvalTask, rows: list[dict[str, Any]]) -> None:
    assert (len(task.load("train")), len(task.load("test"))) == (80, 20)
    assert task.load("test")[0]["task_id"] == "ClassEval_80"
    assert len({r["task_id"] for r in rows}) == 100


@pytest.mark.slow
def test_reference_solutions_pass_where_the_tests_are_sound(
    task: ClassEvalTask, rows: list[dict[str, Any]]
) -> None:
    jobs = task.reference_jobs("train") + task.reference_jobs("test")
    with SandboxPool(max_workers=2) as pool:
        verdicts = pool.check_many(jobs, SandboxLimits(timeout_s=60), assert_timeout_s=20)
    failed = {r["task_id"] for r, v in zip(rows, verdicts) if v.status != "passed"}
    third_party = {r["task_id"] for r in rows if _needs_third_party(r)}
    assert len(third_party) == 12
    assert failed - third_party - set(KNOWN_UNSOUND) - set(SLOW) == set()
    # Unsound and slow references may pass or fail from run to run; every other one passes.
    assert sum(v.status == "passed" for v in verdicts) >= 100 - len(
        third_party | set(KNOWN_UNSOUND) | set(SLOW)
    )


def _method(code: str) -> str:
    """A ClassEval per-method ``solution_code`` (decorators and ``def`` line unindented, the
    body indented by 4 or 8) as a method indented for a class body."""
    lines = code.split("\n")
    k = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
    head = "\n".join(line.strip() for line in lines[: k + 1])
    body = textwrap.dedent("\n".join(lines[k + 1 :]))
    return textwrap.indent(head + "\n" + textwrap.indent(body, "    "), "    ")


def _reference_parts(row: dict[str, Any]) -> list[str]:
    by_name = {m["method_name"]: m["solution_code"] for m in row["methods_info"]}
    return ["\n\n".join(_method(by_name[m]) for m in row["agent_methods"][a]) for a in range(2)]


def test_agents_writing_the_reference_methods_score_one(
    task: ClassEvalTask, rows: list[dict[str, Any]]
) -> None:
    sample = [r for r in rows if r["task_id"] in ("ClassEval_0", "ClassEval_3", "ClassEval_46")]
    parts = [_reference_parts(r) for r in sample]
    batch = task.reward([[p[0] for p in parts], [p[1] for p in parts]], sample)
    assert batch.rewards == pytest.approx([1.0] * 3), [i["error"] for i in batch.infos]


def test_broken_variants_get_no_credit(task: ClassEvalTask, rows: list[dict[str, Any]]) -> None:
    row = next(r for r in rows if r["task_id"] == "ClassEval_3")
    good = _reference_parts(row)
    stubs = [
        "\n".join(f"    def {m}(self, *a):\n        pass\n" for m in row["agent_methods"][a])
        for a in range(2)
    ]
    wrong_names = [p.replace("def ", "def x_") for p in good]
    # a method that ends the process when the tests call it: no verdict, no test credit
    exit_method = (
        f"    def {row['agent_methods'][1][0]}(self, *a):\n        __import__('os')._exit(0)\n"
    )
    early_exit = [good[0], exit_method]
    batch = task.reward(
        [
            [stubs[0], wrong_names[0], early_exit[0], ""],
            [stubs[1], wrong_names[1], early_exit[1], ""],
        ],
        [row] * 4,
    )
    assert batch.infos[0]["status"] == "not_run" and batch.rewards[0] == 0.0
    assert batch.infos[1]["passed"] == 0 and batch.rewards[1] <= 0.1
    assert batch.infos[2]["status"] == "no_result" and batch.infos[2]["passed"] == 0
    assert batch.rewards[2] <= 0.1 + 1e-9
    assert batch.rewards[3] == 0.0


def test_half_the_methods_earn_partial_credit_and_feedback(
    task: ClassEvalTask, rows: list[dict[str, Any]]
) -> None:
    row = next(r for r in rows if r["task_id"] == "ClassEval_3")
    good = _reference_parts(row)
    batch = task.reward([[good[0]], [""]], [row])
    info = batch.infos[0]
    assert 0 < info["passed"] < info["total"]
    expected = 0.05 + 0.1 + 0.8 * info["passed"] / info["total"]
    assert batch.rewards[0] == pytest.approx(expected)
    fb = task.feedback(row, JointAction((0, 0), (good[0], "")), info, 0)
    assert not fb.done
    prompts = [prompt_text(p) for p in task.prompts(row, [fb])]
    assert "# Failing test: test_" in prompts[1]
    assert "(expected values hidden): def test_" in prompts[1]
    assert "(you wrote no usable code)" in prompts[1]
    assert prompts[0].endswith("class ArrangementCalculator:\n")


def test_needs_a_path() -> None:
    with pytest.raises(ValueError, match="CC BY-NC"):
        ClassEvalTask()
    assert get_task("classeval", path=shared_file("ClassEval_data.json")).name == "classeval"
