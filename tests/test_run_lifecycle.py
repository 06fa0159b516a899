"""A training run as researchers live it: killed and resumed, Ctrl-C, reruns, evaluation.

The runs that are killed, interrupted or compared with the uninterrupted run are real
``comlrl`` processes on the built-in tiny model; the refusals, ``--overwrite`` and
``comlrl eval`` call the command's entry point (``comlrl.algos.cli.main.main``) in the test
process, which is the same code without a new interpreter importing torch and transformers
(~5 CPU-s a process). The kill and interrupt tests pause the run at a chosen place (``tests/_lifecycle_driver.py``: it runs
the real CLI entry point with one function wrapped to wait on stdin), so where the signal
lands is fixed by the pause, never by a clock.

Tolerance of the resume comparisons: 1e-6 absolute on rewards, losses and every other
metric. A resumed process runs the same float32 operations in the same order on one
thread (``OMP_NUM_THREADS=1``, ``parallel_agents=false``) from bit-identical weights,
optimizer moments and random streams, so the rows should match bit for bit (they do on
the build machine); 1e-6 only leaves room for a BLAS that picks another kernel in a new
process (e.g. by memory alignment), which moves float32 sums of O(1) terms by ~1e-7.
Any lost state (optimizer moments, data order, a sampling stream) changes rewards or
losses by far more: other completions, other updates.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
NUM_STEPS = 5
RUN_ARGS = [
    "task.name=coop_story",
    "task.kwargs.limit=8",
    "batch_size=2",
    "num_generations=2",
    "max_new_tokens=8",
    f"num_steps={NUM_STEPS}",
    "save_every=1",
    "keep_last=2",
    "eval_every=2",
    "eval_limit=2",
    "log_samples=2",
    "progress=false",
    "parallel_agents=false",
    "seed=3",
]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
GUARD_S = 900  # only against a hung child; nothing here measures time


def _comlrl_cmd() -> list[str]:
    exe = shutil.which("comlrl", path=str(Path(sys.executable).parent)) or shutil.which("comlrl")
    return [exe] if exe else [sys.executable, "-m", "comlrl.algos.cli.main"]


def _comlrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_comlrl_cmd(), *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=False,
    )


def _paused_run(where: str, step: int, out: Path) -> tuple[subprocess.Popen[str], Path]:
    """Start ``comlrl train`` under the driver; return once it is paused at ``where``."""
    err = out.parent / f"{out.name}.stderr"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "_lifecycle_driver.py"),
            where,
            str(step),
            "--",
            "train",
            *RUN_ARGS,
            f"output_dir={out}",
        ],
        cwd=out.parent,
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err.open("w"),
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = "-"
    while line and not line.startswith("PAUSED"):  # skip anything else a library prints
        ready, _, _ = select.select([proc.stdout], [], [], GUARD_S)
        line = proc.stdout.readline() if ready else ""
    assert line.startswith(f"PAUSED {where}"), (
        f"the run never paused: {line!r}\n{err.read_text()[-3000:]}"
    )
    return proc, err


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _assert_same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]], what: str) -> None:
    assert [r.get("step") for r in got] == [r.get("step") for r in want], what
    assert want, f"no {what} rows to compare"
    for g, w in zip(got, want, strict=True):
        keys = {k for k in w if not k.startswith("time/") and not k.endswith("_per_s")}
        assert keys == {k for k in g if not k.startswith("time/") and not k.endswith("_per_s")}
        for k in sorted(keys):
            if isinstance(w[k], float):
                assert abs(g[k] - w[k]) <= 1e-6, (
                    f"{what} step {w.get('step')} {k}: {g[k]} != {w[k]}"
                )
            else:
                assert g[k] == w[k], f"{what} step {w.get('step')} {k}: {g[k]!r} != {w[k]!r}"


def _assert_same_run(out: Path, reference: Path) -> None:
    for name in ("metrics.jsonl", "samples.jsonl", "eval.jsonl"):
        _assert_same_rows(_rows(out / name), _rows(reference / name), name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run every interrupted one is compared with."""
    out = tmp_path_factory.mktemp("reference") / "run"
    proc = _comlrl("train", *RUN_ARGS, f"output_dir={out}", cwd=out.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == list(range(1, NUM_STEPS + 1))
    assert [r["step"] for r in _rows(out / "eval.jsonl")] == [2, 4]
    return out


def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_rows(
    reference: Path, tmp_path: Path
) -> None:
    rng = random.Random()
    where = rng.choice(["after_checkpoint", "mid_step", "mid_checkpoint", "after_metrics"])
    k = rng.randint(1, NUM_STEPS - 2)
    note = f"(killed {where}, k={k})"
    out = tmp_path / "run"
    proc, err = _paused_run(where, k, out)
    proc.kill()
    assert proc.wait() == -signal.SIGKILL
    steps = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert steps[-1] == f"step-{k:06d}", f"{note} {steps}"
    if where == "mid_checkpoint":
        assert list((out / "checkpoints").glob(".step-*.tmp-*")), (
            "the half-written checkpoint should be there"
        )
    resumed = _comlrl("train", "--resume", str(out), cwd=tmp_path)
    assert resumed.returncode == 0, f"{note}\n{resumed.stderr[-3000:]}"
    assert f"resuming {out} at step {k} of {NUM_STEPS}" in resumed.stdout, note
    _assert_same_run(out, reference)
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert left == [f"step-{NUM_STEPS - 1:06d}", f"step-{NUM_STEPS:06d}"], (
        f"{note} keep_last=2 left {left}"
    )


def test_ctrl_c_finishes_the_step_checkpoints_and_exits_130(
    reference: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    proc, err = _paused_run("mid_step", 1, out)  # inside step 2
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=GUARD_S) == 130
    ckpt = out / "checkpoints" / "step-000002"
    stderr = err.read_text()
    assert (
        f"interrupted at step 2; checkpoint: {ckpt}; resume with: comlrl train --resume {out}"
        in stderr
    ), stderr[-3000:]
    from transformers import AutoModelForCausalLM

    for agent in ("agent_0", "agent_1"):
        model = AutoModelForCausalLM.from_pretrained(ckpt / agent)
        assert model.config.model_type == "llama"  # the default agents: builtin:stories260k
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1, 2], (
        "the interrupted step must finish"
    )
    assert not (out / "final").exists()
    resumed = _comlrl("train", "--resume", str(out), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_run(out, reference)


def test_sigterm_finishes_the_step_checkpoints_and_exits_143(tmp_path: Path) -> None:
    """What Slurm and Kubernetes send before they kill a job: treated as Ctrl-C is (the step
    in progress finishes, a checkpoint, the resume command), exit code 128 + 15."""
    out = tmp_path / "run"
    proc, err = _paused_run("mid_step", 1, out)  # inside step 2
    os.kill(proc.pid, signal.SIGTERM)  # to the run's process, as a scheduler does
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=GUARD_S) == 128 + signal.SIGTERM
    ckpt = out / "checkpoints" / "step-000002"
    stderr = err.read_text()
    assert (
        f"interrupted by SIGTERM at step 2; checkpoint: {ckpt}; resume with: comlrl train "
        f"--resume {out}"
    ) in stderr, stderr[-3000:]
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1, 2]
    # the checkpoint is the one Ctrl-C writes (the same handler after the signal), whose
    # resume to the uninterrupted rows the Ctrl-C test checks
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-000001",
        "step-000002",
    ]
    assert not (out / "final").exists()


def test_an_exception_in_step_4_saves_step_3_and_resume_finishes_the_run(
    reference: Path, tmp_path: Path, comlrl_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """save_every=0: the reward raises in step 4; the run keeps step 3 and says how to
    resume; --resume (the reward works again) ends with the rows of the unbroken run."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "_lifecycle_driver.py"),
            "raise_in_reward",
            "3",
            "--",
            "train",
            *RUN_ARGS,
            "save_every=0",
            f"output_dir={out}",
        ],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=False,
    )
    assert proc.returncode != 0
    saved = out / "checkpoints" / "step-000003"
    assert (
        f"training failed in step 4; step 3 (the last completed step) was saved: {saved}; "
        f"after fixing the cause, resume with: comlrl train --resume {out}"
    ) in proc.stderr, proc.stderr[-3000:]
    assert "ZeroDivisionError" in proc.stderr
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1, 2, 3]
    refused = comlrl_here("train", *RUN_ARGS, f"output_dir={out}", cwd=tmp_path)
    assert refused.returncode == 2 and f"({saved}) with: comlrl train --resume" in refused.stderr
    resumed = _comlrl("train", "--resume", str(out), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {out} at step 3 of {NUM_STEPS}" in resumed.stdout
    _assert_same_run(out, reference)


def test_training_into_a_used_output_dir_is_refused_before_any_model_loads(
    reference: Path, tmp_path: Path, comlrl_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    proc = comlrl_here(
        "train",
        *RUN_ARGS,
        f"output_dir={reference}",
        "models=[/no/such/model]",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert (
        "already holds a run" in proc.stderr
        and "--resume" in proc.stderr
        and "--overwrite" in proc.stderr
    )
    assert "could not load model" not in proc.stderr, "the refusal must come before models load"
    unsafe = comlrl_here("train", "--resume", str(reference), "learning_rate=0.5", cwd=tmp_path)
    assert unsafe.returncode == 2 and "cannot change learning_rate" in unsafe.stderr, unsafe.stderr
    done = comlrl_here("train", "--resume", str(reference), cwd=tmp_path)
    assert done.returncode == 0 and f"finished at step {NUM_STEPS}" in done.stdout, done.stderr


def test_overwrite_clears_the_earlier_run_and_nothing_else(
    reference: Path, tmp_path: Path, comlrl_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "notes.txt").write_text("mine")
    proc = comlrl_here(
        "train",
        "--overwrite",
        *RUN_ARGS,
        f"output_dir={out}",
        "num_steps=1",
        "save_every=0",
        "eval_every=0",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1]
    assert not (out / "checkpoints").exists() and not (out / "eval.jsonl").exists()
    assert (out / "notes.txt").read_text() == "mine"


def test_comlrl_eval_scores_a_trained_checkpoint_with_pass_at_k(
    tmp_path: Path, comlrl_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    out = tmp_path / "run"
    train = comlrl_here(
        "train",
        f"output_dir={out}",
        "task.name=coop_humaneval",
        "models=[builtin:tiny-qwen2]",
        "task.kwargs.limit=4",
        "task.kwargs.sandbox_all=false",  # an option coop_story lacks (below)
        "num_steps=1",
        "batch_size=2",
        "num_generations=2",
        "max_new_tokens=16",
        "eval_every=1",
        "eval_limit=2",
        "progress=false",
        cwd=tmp_path,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    (during,) = _rows(out / "eval.jsonl")
    assert during["step"] == 1 and during["num_problems"] == 2.0
    assert 0.0 <= during["pass@1"] <= during["pass@1/final"] <= during["solved_rate"] <= 1.0
    final = [a for i in (0, 1) for a in ("--model", str(out / "final" / f"agent_{i}"))]
    ev = comlrl_here(
        "eval", *final, "eval_limit=2", "eval_greedy=false", "eval_num_samples=2", cwd=tmp_path
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "eval coop_humaneval:test (2 problems, sampled, k=2" in ev.stdout, ev.stdout
    (row,) = _rows(out / "evals" / "final" / "eval.jsonl")
    assert row["step"] == 1 and row["split"] == "test" and row["num_samples"] == 2
    assert 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0
    assert row["turn_0/num_nodes"] == 2.0
    # the evaluated joint actions, with their verdicts, beside eval.jsonl (2 problems x 2)
    samples = _rows(out / "evals" / "final" / "eval_samples.jsonl")
    assert len(samples) == 4 and all("status" in s["info"] for s in samples)
    assert "eval:" in ev.stderr  # the progress bar
    # on another task: the run's sampling settings stay, its task's options do not follow
    other = comlrl_here("eval", *final, "task.name=coop_story", "eval_limit=2", cwd=tmp_path)
    assert other.returncode == 0, other.stderr[-3000:]
    assert "the run's task settings {'kwargs': {'limit': 4, 'sandbox_all': False}}" in other.stderr
    row = _rows(out / "evals" / "final" / "eval.jsonl")[-1]
    assert row["task"] == "coop_story" and row["num_problems"] == 2.0
