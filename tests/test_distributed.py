"""Data parallel training under torchrun gives one process's update over the global batch.

Every run here is a real ``comlrl train`` process (``python -m comlrl``, the module that
``torchrun -m comlrl`` launches) on the built-in stories260k, CPU and gloo, with prompt-keyed
sampling (``sampling_rng=prompt``), so a prompt's completions depend only on (seed, step,
its place in the global batch): one process and two ranks roll out the same completions.

- one process, 3 steps, a checkpoint every step (the reference);
- two ranks (``torchrun --nproc-per-node=2``), 2 steps, DDP, the explicit all-reduce and
  FSDP2 (``fully_shard``: sharded parameters and optimizer state, weights gathered for
  sampling, checkpoints gathered to rank 0): their final weights equal the reference's
  step-2 checkpoint;
- the 2-rank run resumed on one process to step 3: its final weights equal the reference's.

Every run scales the advantages by the std of the whole batch's returns
(``advantage_scale=batch``, RLOO): each rank must divide by the std of the global batch,
not of its own shard (the old behaviour gave agent 0 an advantage_std of 1.161 on 2 ranks
against 0.914 in one process, far outside the tolerances), so the advantage statistics of
every 2-rank row are compared with the reference's too.

Tolerance: ``atol=2e-6, rtol=1e-5`` on float32 weights of O(0.1-1). The ranks compute the
same float32 maths as the single process but on other batch shapes (2 of the 4 prompts,
left-padded to their own longest prompt; gradients summed by an all-reduce or FSDP2's
reduce-scatter instead of in one backward), which moves logits and gradients by float32
round-off (~1e-7 relative);
after 2-3 SGD steps of lr 0.5 (gradient norm clipped to 1, so a step moves a weight by at
most 0.5) the weights differ by round-off of the same order, well inside 2e-6. Dropping the
global normaliser (each rank normalising by its own count) fails this test (checked). The test also checks that training moved the
weights by far more than the tolerance, and a per-rank normaliser (the bug this guards
against) would change each rank's loss weight by a factor 2, i.e. the update by ~1e-3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

NUM_AGENTS = 2
ARGS = [
    "task.name=coop_story",
    "task.kwargs.limit=8",
    "batch_size=4",
    "num_generations=2",
    "max_new_tokens=8",
    "progress=false",
    "parallel_agents=false",
    "sampling_rng=prompt",
    "log_samples=1",
    "reward_curve=false",
    "seed=5",
    "optimizer=sgd",  # a linear step: weight differences stay those of the gradients
    "learning_rate=0.5",
    "advantage_scale=batch",  # the std of the global batch on every rank
    "estimator=rloo",
]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
GUARD_S = 600  # only against a hung child; nothing here measures time
ATOL, RTOL = 2e-6, 1e-5


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd, env=ENV, capture_output=True, text=True, timeout=GUARD_S, check=False
    )
    assert proc.returncode == 0, (
        f"{' '.join(cmd)}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    )
    return proc


def _comlrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "comlrl", *args]


def _torchrun(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "comlrl",
        *args,
    ]


def _weights(folder: Path) -> list[dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return [load_file(folder / f"agent_{i}" / "model.safetensors") for i in range(NUM_AGENTS)]


def _assert_same(got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]]) -> None:
    for a, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.keys() == w.keys()
        for name in w:
            torch.testing.assert_close(
                g[name],
                w[name],
                atol=ATOL,
                rtol=RTOL,
                msg=lambda m, a=a, n=name: f"agent {a} {n}: {m}",
            )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, 3 steps, a checkpoint after every step."""
    out = tmp_path_factory.mktemp("one_rank")
    _run(_comlrl("train", *ARGS, "num_steps=3", "save_every=1", f"output_dir={out}"))
    return out


@pytest.mark.parametrize("mode", ["ddp", "none", "fsdp2"])
def test_two_ranks_give_the_one_process_update_and_resume_on_one(
    reference: Path, tmp_path: Path, mode: str
) -> None:
    out = tmp_path / "two_ranks"
    proc = _run(
        _torchrun(
            "train",
            *ARGS,
            "num_steps=2",
            "save_every=1",
            f"data_parallel={mode}",
            f"output_dir={out}",
        )
    )

    assert f"data parallel over 2 processes ({mode})" in proc.stderr

    start = _weights(reference / "checkpoints" / "step-000001")
    want = _weights(reference / "checkpoints" / "step-000002")
    moved = max(
        float((w[n] - s[n]).abs().max()) for w, s in zip(want, start, strict=True) for n in w
    )
    assert moved > 100 * ATOL, (
        f"training barely moved the weights ({moved}); the comparison would be empty"
    )
    _assert_same(_weights(out / "final"), want)

    # rank 0 alone wrote the logs, with numbers of the global batch (4 prompts x 2 joint actions)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ref_rows = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row, ref in zip(rows, ref_rows[:2], strict=True):
        assert row["num_joint_actions"] == ref["num_joint_actions"] == 8
        assert row["reward_mean"] == pytest.approx(ref["reward_mean"], abs=1e-6)  # same completions
        assert ref["reward_std"] > 0  # a real division by the batch's std, not 0 / eps
        for a in range(NUM_AGENTS):
            for key in (f"advantage_std/agent_{a}", f"advantage_mean/agent_{a}"):
                # float32 advantages of O(1) divided by the same float64 std: round-off only
                assert row[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
            # loss of the global batch: float32 sums in another order (|loss| ~ 0.1-10)
            assert row[f"loss/agent_{a}"] == pytest.approx(
                ref[f"loss/agent_{a}"], rel=1e-4, abs=1e-6
            )

    # the 2-rank run continues on one process exactly where the 1-process run went
    _run(_comlrl("train", "--resume", str(out), "num_steps=3"))
    _assert_same(_weights(out / "final"), _weights(reference / "final"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["reward_mean"] == pytest.approx(ref_rows[2]["reward_mean"], abs=1e-6)
