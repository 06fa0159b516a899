"""A data-parallel (torchrun, two ranks, gloo on CPU) run of a task with tools: the tool
loop runs on every rank and the step logs its tool metrics (issue 29, item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.slow
def test_two_ranks_train_tool_math(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "comlrl", "train", "task.name=tool_math", "num_steps=1", "batch_size=2",
        "num_generations=2", "max_new_tokens=16", "progress=false", "parallel_agents=false",
        "log_samples=1", "reward_curve=false", f"output_dir={tmp_path}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (row,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for a in range(2):  # both agents have the sandboxed Python tool
        assert f"tool_calls_mean/agent_{a}" in row, sorted(row)
    assert "tool_error_fraction" in row
    assert (tmp_path / "samples.jsonl").read_text().strip()
