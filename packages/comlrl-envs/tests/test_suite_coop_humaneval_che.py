"""The coop_humaneval_che suite (OpenMLRL's CoopHumanEval)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from comlrl.core import JointAction, get_task
from comlrl.envs import CoopHumanEvalCheTask
from comlrl.envs.sandbox import split_test

SHARED_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"


def shared_file(name: str) -> Path:
    """``../shared/data/<name>`` beside the repository, or skip with the reason."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"offline data file {path} not found (see shared/README.md)")
    return path


@pytest.fixture(scope="module")
def task() -> Iterator[CoopHumanEvalCheTask]:
    t = CoopHumanEvalCheTask(path=shared_file("CoopHumanEval_che_raw.json"), max_workers=2)
    yield t
    t.close()


def test_splits_are_disjoint(task: CoopHumanEvalCheTask) -> None:
    train, test = task.load("train"), task.load("test")
    assert (len(train), len(test)) == (66, 16)
    assert test[0]["task_id"] == "CoopHumanEval/66"
    assert not {r["task_id"] for r in train} & {r["task_id"] for r in test}


def test_every_test_source_splits_into_units(task: CoopHumanEvalCheTask) -> None:
    rows = task.load("train") + task.load("test")
    assert all(split_test(r["test"]).num_units >= 1 for r in rows)


def test_reward_and_feedback_on_x_or_y(task: CoopHumanEvalCheTask) -> None:
    ex = task.load("train")[0]
    assert ex["entry_point"] == "x_or_y"
    helper = "k):\n    return k > 1 and all(k % d for d in range(2, int(k ** 0.5) + 1))\n"
    good = "    return x if aux(n) else y\n"
    bad = "    return x\n"
    batch = task.reward([[helper, helper], [good, bad]], [ex, ex])
    assert batch.rewards[0] == pytest.approx(1.0)
    assert 0.2 < batch.rewards[1] < 1.0
    fb = task.feedback(ex, JointAction((0, 1), (helper, bad)), batch.infos[1], 0)
    assert not fb.done and "Your program: x_or_y(15, 8, 5) returned 8" in fb.texts[1]
    assert "== 5" not in fb.texts[1]  # the expected value is not shown
    assert task.feedback(ex, JointAction((0, 0), (helper, good)), batch.infos[0], 0).done


def test_no_reference_solutions_in_the_file(task: CoopHumanEvalCheTask) -> None:
    with pytest.raises(ValueError, match="no reference solution"):
        task.reference_jobs("test")


def test_needs_a_path() -> None:
    with pytest.raises(ValueError, match="path="):
        CoopHumanEvalCheTask()
    t = get_task("coop_humaneval_che", path=shared_file("CoopHumanEval_che_raw.json"))
    assert t.name == "coop_humaneval_che"
