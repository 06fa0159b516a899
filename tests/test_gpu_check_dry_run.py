"""benchmarks/gpu_check.py (the GPU verification script) in CI: its --dry-run runs every
phase on the CPU and writes the JSON; its model parts join back only to the right file."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_runs_every_phase_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] is True and result["ok"] is True
    assert set(result["phases"]) == {"cuda_tests", "kernel_bench", "train"}
    bench = result["phases"]["kernel_bench"]
    for op in ("token_logprobs_fwd_bwd", "linear_token_logprobs", "group_advantages"):
        assert bench[op]["kernel_ms"] > 0 and bench[op]["max_abs_diff"] < 1e-2
    train = result["phases"]["train"]
    assert [r["step"] for r in train["rows"]] == [1, 2]  # one step, then one resumed step
    assert train["resume"]["returncode"] == 0


def test_model_parts_join_only_to_the_file_with_the_expected_sha256(tmp_path: Path) -> None:
    gpu_check = _module()
    original = tmp_path / "src" / "model.gguf"
    original.parent.mkdir()
    original.write_bytes(os.urandom(3 * 2**20 + 17))
    parts = gpu_check.split_file(original, 1)
    assert [p.name for p in parts] == [f"model.gguf.part-0{i}" for i in range(4)]
    digest = gpu_check.sha256_of(original)
    original.unlink()  # what a capped transfer leaves: the parts only
    joined, info = gpu_check.resolve_model(original, tmp_path / "joined", digest)
    assert joined.read_bytes() == b"".join(p.read_bytes() for p in parts)
    assert info["sha256"] == digest and len(info["joined_from"]) == 4
    parts[2].unlink()
    with pytest.raises(ValueError, match="a part is missing"):
        gpu_check.resolve_model(original, tmp_path / "joined2", digest)
