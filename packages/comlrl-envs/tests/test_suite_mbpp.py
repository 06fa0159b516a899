"""The mbpp suite: conversion, MBPP's splits, reference solutions, rewards, feedback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from comlrl.core import JointAction, get_task, prompt_text
from comlrl.envs import MbppTask
from comlrl.envs.code.mbpp import mbpp_to_humaneval
from comlrl.envs.sandbox import CheckJob, SandboxLimits, SandboxPool

SHARED_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"


def shared_file(name: str) -> Path:
    """``../shared/data/<name>`` beside the repository, or skip with the reason."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"offline data file {path} not found (see shared/README.md)")
    return path


ROW = {
    "task_id": 700,
    "text": "Write a function to add two numbers.",
    "code": "import math\ndef add_nums(a, b):\n    return a + b",
    "test_setup_code": "",
    "test_list": ["assert add_nums(1, 2) == 3", "assert add_nums(-1, 1) == 0"],
    "challenge_test_list": [],
}


@pytest.fixture(scope="module")
def mbpp_task() -> Iterator[MbppTask]:
    t = MbppTask(path=shared_file("mbpp.jsonl"), max_workers=2)
    yield t
    t.close()


def test_row_conversion_keeps_the_asserts_as_units() -> None:
    row = mbpp_to_humaneval(ROW)
    assert row["entry_point"] == "add_nums" and row["task_id"] == "MBPP/700"
    assert row["prompt"].startswith("import math\n") and "def add_nums(a, b):" in row["prompt"]
    assert "Write a function to add two numbers." in row["prompt"]
    assert row["test"].startswith("def check(add_nums):\n    assert add_nums(1, 2) == 3")


def test_user_file_and_splits(tmp_path: Path) -> None:
    rows = [dict(ROW, task_id=i) for i in (5, 20, 550, 700)]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    t = MbppTask(path=path)
    ids = {s: [r["mbpp_id"] for r in t.load(s)] for s in ("prompt", "test", "val", "train")}
    assert ids == {"prompt": [5], "test": [20], "val": [550], "train": [700]}
    with pytest.raises(ValueError, match="unknown split"):
        t.load("dev")


def test_missing_path_and_bad_rows_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="path="):
        MbppTask()
    with pytest.raises(FileNotFoundError, match="path="):
        MbppTask(path=tmp_path / "nope.jsonl").load("test")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": 1, "text": "x"}) + "\n")
    with pytest.raises(ValueError, match="lacks field"):
        MbppTask(path=bad).load("test")


def test_standard_split_sizes(mbpp_task: MbppTask) -> None:
    sizes = {s: len(mbpp_task.load(s)) for s in ("train", "test", "validation", "prompt")}
    assert sizes == {"train": 374, "test": 500, "validation": 90, "prompt": 10}


REFERENCES = {
    "mbpp.jsonl": {"train": 374, "test": 500, "validation": 90, "prompt": 10},
    "sanitized-mbpp.json": {"train": 120, "test": 257, "validation": 43, "prompt": 7},
}


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "test", "validation", "prompt"])
@pytest.mark.parametrize("name", ["mbpp.jsonl", "sanitized-mbpp.json"])
def test_every_reference_solution_of_every_split_passes(name: str, split: str) -> None:
    # sanitized train: MBPP 737, 787 and 794 return a re.Match that their tests truth-test.
    task = MbppTask(path=shared_file(name))
    jobs = task.reference_jobs(split)
    assert len(jobs) == REFERENCES[name][split]
    with SandboxPool(max_workers=2) as pool:
        # MBPP/123 (amicable numbers below 9999) needs a few seconds per assert.
        verdicts = pool.check_many(jobs, SandboxLimits(timeout_s=60), assert_timeout_s=20)
    failures = [
        (j.entry_point, v.status, v.error) for j, v in zip(jobs, verdicts) if v.status != "passed"
    ]
    assert not failures, failures[:5]
    assert all(v.passed == v.total == 3 or v.total > 0 for v in verdicts)


def test_broken_variants_get_no_test_credit(mbpp_task: MbppTask) -> None:
    rows = mbpp_task.load("test")[:20]
    jobs = []
    for r in rows:
        jobs.append(CheckJob(r["prompt"] + "    pass\n", r["test"], r["entry_point"]))
        jobs.append(CheckJob("def wrong_name(*a):\n    return 1\n", r["test"], r["entry_point"]))
        jobs.append(
            CheckJob(
                "import sys\nsys.exit(0)\n" + r["reference_program"], r["test"], r["entry_point"]
            )
        )
    with SandboxPool(max_workers=2) as pool:
        verdicts = pool.check_many(jobs, SandboxLimits(timeout_s=10))
    assert not [v for v in verdicts if v.status == "passed"]
    assert sum(v.passed for v in verdicts[1::3]) == sum(v.passed for v in verdicts[2::3]) == 0


def test_reward_levels_and_feedback(mbpp_task: MbppTask) -> None:
    ex = next(r for r in mbpp_task.load("test") if r["mbpp_id"] == 11)  # remove_Occ(s, ch)
    helper = "s, ch):\n    return s.replace(ch, '', 1)\n"
    main_ok = "    s = aux(s, ch)\n    return aux(s[::-1], ch)[::-1]\n"
    batch = mbpp_task.reward([[helper, helper, ""], [main_ok, "    return s\n", ""]], [ex] * 3)
    assert batch.rewards[0] == pytest.approx(1.0)
    assert batch.rewards[1] == pytest.approx(0.2)
    assert batch.rewards[2] == 0.0
    fb = mbpp_task.feedback(ex, JointAction((0, 0), (helper, "    return s\n")), batch.infos[1], 0)
    assert not fb.done
    prompts = [prompt_text(p) for p in mbpp_task.prompts(ex, [fb])]
    assert "# Your program: remove_Occ('hello', 'l') returned 'hello'" in prompts[1]
    assert "'heo'" not in fb.texts[1]  # the expected value is not shown
    ok = mbpp_task.feedback(ex, JointAction((0, 0), (helper, main_ok)), batch.infos[0], 0)
    assert ok.done


def test_registered() -> None:
    t = get_task("mbpp", path=shared_file("mbpp.jsonl"), limit=3)
    assert isinstance(t, MbppTask) and len(t.load("train")) == 3 and t.max_turns == 4
