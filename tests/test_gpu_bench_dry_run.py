"""benchmarks/gpu_bench.py (issue 36's GPU benchmark) in CI: its --dry-run runs every phase on
the CPU with a tiny Qwen2 shape and writes the JSON with every target listed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_bench.py"


@pytest.mark.slow
def test_the_dry_run_runs_every_phase_and_lists_every_target(
    shared_dir: Path, tmp_path: Path
) -> None:
    tokenizer = shared_dir / "data" / "qwen2_tokenizer"
    if not (tokenizer / "tokenizer_config.json").is_file():
        pytest.skip(f"the Qwen2 tokenizer is not at {tokenizer}")
    out = tmp_path / "gpu_bench.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--tokenizer", str(tokenizer), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] is True
    for phase in ("bounds", "decode", "update", "compat", "agents"):
        assert isinstance(result[phase], dict) and "error" not in result[phase], phase
    decode = result["decode"]["tiny"]
    assert decode["ours"]["ms_per_step"] > 0 and decode["generate_dynamic"]["ms_per_step"] > 0
    assert decode["ours"]["decode_loop"].startswith("eager")  # the graph serves CUDA only
    assert decode["lora_r16"]["fast_decode"] == "on"  # LoRA decodes through the fast step
    assert result["update"]["update_ms"] > 0 and result["update"]["bound_ms"] > 0
    assert result["compat"]["tiny"]["ours"]["s_per_prompt"] > 0
    assert result["agents"]["2"]["step_s"] > 0
    targets = result["targets"]
    assert len(targets) == 9 and all(
        {"ratio", "target", "pass"} <= set(t) for t in targets.values()
    )
    assert targets["e2e_comlrl143_over_ours_0.5b"]["ratio"] is None  # no 1.4.3 site in CI
    assert targets["update_vs_bound_0.5b"]["ratio"] > 0
    assert all(t["pass"] is None for t in targets.values())  # a dry run passes nothing
