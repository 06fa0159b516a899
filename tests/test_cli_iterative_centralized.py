"""``comlrl train algo=centralized_magrpo | madpo_iter | marlhf_iter``: the recipes that were
only reachable through ``comlrl.trainers`` run end to end from the command line (a few
steps of the built-in stories260k, in-process) and write the loop driver's outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from comlrl.algos.cli.main import main

sys.path.insert(0, str(Path(__file__).parent))
from test_cli_recipes import (  # noqa: E402  (the shared run checks)
    STORY,
    _assert_same_outputs,
    _check_final,
    _interrupted_and_resumed,
)


def _rows(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_centralized_magrpo_trains_one_joint_policy_and_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "central"
    argv = ["train", "algo=centralized_magrpo", "num_steps=3", "progress=false", *STORY]
    argv += ["batch_size=2", "log_samples=2", "save_every=1", "eval_every=2", "eval_limit=2"]
    assert main([*argv, f"output_dir={out}"]) == 0
    cap = capsys.readouterr()
    assert "centralized MAGRPO (one joint policy, sentences role format)" in cap.err
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # one trained policy, and the sentence split gives the story reward something to score
    assert "completion_len_mean/agent_0" in rows[0] and "completion_len_mean/agent_1" not in rows[0]
    assert max(r["reward_max"] for r in rows) > 0.0
    _check_final(out, 1)
    assert not (out / "final" / "agent_1").exists()
    assert [r["step"] for r in _rows(out / "eval.jsonl")] == [2]
    sample = _rows(out / "samples.jsonl")[0]
    assert len(sample["prompts"]) == 1 and "In the end," in sample["prompts"][0]
    assert (out / "config.yaml").read_text().startswith("algo: centralized_magrpo\n")
    run = tmp_path / "central-interrupted"
    _interrupted_and_resumed(argv, run, monkeypatch, capsys, 3)
    _assert_same_outputs(run, out)


def test_centralized_magrpo_checks_its_keys_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["train", "algo=centralized_magrpo", f"output_dir={tmp_path / 'x'}"]
    assert main([*base, "models=[a,b]"]) == 2
    assert "trains one joint policy but models lists 2" in capsys.readouterr().err
    assert main([*base, "role_format=xml"]) == 2
    assert "role_format" in capsys.readouterr().err
    assert main([*base, "estimator=rloo"]) == 2
    assert "fixes estimator='grpo'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
