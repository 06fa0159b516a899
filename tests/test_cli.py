"""The ``comlrl`` command as a user runs it: default experiment, overrides, bad configs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _comlrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("comlrl")
    cmd = [exe] if exe else [sys.executable, "-m", "comlrl.algos.cli"]
    return subprocess.run(
        [*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


def test_default_experiment_writes_metrics_verdicts_and_loadable_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _comlrl(
        "train", "--num-steps", "2", f"output_dir={out}", "task.kwargs.limit=4", "progress=false",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward_mean", "reward_std", "loss/agent_0", "loss/agent_1",
                "completion_len_mean/agent_0", "tokens_per_s", "prompts_per_s"):
        assert all(isinstance(r[key], float) for r in rows), key
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples, "no samples were logged"
    # Every logged joint action carries the sandbox verdict of the real HumanEval tests.
    for s in samples:
        assert s["example_id"].startswith("HumanEval/")
        assert "status" in s["info"], s["info"]
        assert 0.0 <= s["reward"] <= 1.0

    from transformers import AutoModelForCausalLM, AutoTokenizer

    for agent in ("agent_0", "agent_1"):
        path = out / "final" / agent
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        assert model.config.model_type == "qwen2"
        assert model.get_input_embeddings().weight.shape[0] == len(tok)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("num_generations=0", "num_generations"),
        ("estimator=ppo2", "unknown estimator 'ppo2'"),
        ("no_such_field=1", "no_such_field"),
        ("joint_mode=diagonal", "joint_mode"),
        ("task.kwargs.bogus=1", "rejected task.kwargs"),
        ("models=[/no/such/model/dir]", "could not load model '/no/such/model/dir'"),
    ],
)
def test_a_bad_config_fails_before_training_and_names_the_field(
    tmp_path: Path, override: str, message: str
) -> None:
    out = tmp_path / "run"
    proc = _comlrl("train", override, f"output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not out.exists(), "a rejected config must not start a run"


def test_config_file_and_overrides_combine(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("num_generations: 8\nlearning_rate: 0.001\ntask:\n  name: coop_humaneval\n")
    proc = _comlrl("train", "--config", str(cfg), "num_generations=3", "--print-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "num_generations: 3" in proc.stdout and "learning_rate: 0.001" in proc.stdout
