"""The recipes' end-to-end runs from Python (``comlrl.algos.run_recipe``): the same runs
``comlrl train`` makes, with one outputs argument (:class:`~comlrl.algos.RunOutputs`), and
resumable. A few steps of the built-in stories260k on ``coop_story`` (cross-package: the
task comes from comlrl-envs), in-process to stay fast."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from comlrl.algos import (
    ConfigError,
    MARLHFConfig,
    RewardModelConfig,
    RunOutputs,
    SFTConfig,
    TrainConfig,
    run_recipe,
)
from comlrl.algos.training.run.lifecycle import TrainingInterrupted

STORY: dict[str, Any] = {"task": {"kwargs": {"limit": 4}}, "max_new_tokens": 16}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in r.items() if not (k.startswith("time/") or k.endswith("_per_s"))}
        for r in rows
    ]


def _marlhf_config(out: Path) -> MARLHFConfig:
    return MARLHFConfig(
        output_dir=str(out),
        num_steps=2,
        progress=False,
        batch_size=2,
        num_generations=2,
        reward_model=RewardModelConfig(
            learning_rate=1e-3, num_epochs=1, num_generations=2, num_collect_batches=1
        ),
        save_every=1,
        eval_every=0,
        log_samples=1,
        parallel_agents=False,
        **STORY,
    )


def test_marlhf_runs_both_phases_from_python_and_resumes_without_refitting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from comlrl.algos.recipes.preference.marlhf.recipe import MARLHFTrainer
    from comlrl.algos.training.run.data import JsonlWriter
    from safetensors.torch import load_file

    ref = tmp_path / "ref"
    result = run_recipe("marlhf", _marlhf_config(ref))
    assert [r["step"] for r in result.history] == [1, 2]
    assert result.summary.startswith("done: 2 steps") and result.output_dir == ref
    assert (ref / "final" / "reward_model" / "head.safetensors").is_file()
    assert (ref / "checkpoints" / "reward_model" / "head.safetensors").is_file()
    assert (ref / "final" / "agent_1" / "model.safetensors").is_file()
    assert _rows(ref / "reward_model_metrics.jsonl")

    # Ctrl-C right after step 1's row: the run checkpoints step 1 and stops
    original = JsonlWriter.write

    def write(self: JsonlWriter, row: Any) -> None:
        original(self, row)
        if self.path.name == "metrics.jsonl" and row.get("step") == 1:
            os.kill(os.getpid(), signal.SIGINT)

    run = tmp_path / "run"
    config = _marlhf_config(run)
    monkeypatch.setattr(JsonlWriter, "write", write)
    with pytest.raises(TrainingInterrupted):
        run_recipe("marlhf", config)
    monkeypatch.setattr(JsonlWriter, "write", original)
    fitted = (run / "reward_model_metrics.jsonl").read_text()

    # the resume reads the saved reward model: no pairs are sampled, nothing is refit
    def refit(self: Any) -> None:
        raise AssertionError("the resumed run sampled pairs again")

    monkeypatch.setattr(MARLHFTrainer, "collect_pairs", refit)
    resumed = run_recipe("marlhf", config, RunOutputs.of(config, resume=True))
    assert [r["step"] for r in resumed.history] == [2]
    assert (run / "reward_model_metrics.jsonl").read_text() == fitted
    # the resumed run is the uninterrupted one: same rows, same final weights (1e-6, as in
    # tests/test_cli_recipes.py: the same float32 operations from bit-identical state)
    a, b = _untimed(_rows(run / "metrics.jsonl")), _untimed(_rows(ref / "metrics.jsonl"))
    assert [r["step"] for r in a] == [1, 2]
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], abs=1e-6), k
    for i in (0, 1):
        got = load_file(str(run / "final" / f"agent_{i}" / "model.safetensors"))
        want = load_file(str(ref / "final" / f"agent_{i}" / "model.safetensors"))
        for name, tensor in want.items():
            torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-6)


def test_a_run_refuses_a_used_folder_unless_told_to_overwrite_and_resume_needs_a_checkpoint(
    tmp_path: Path,
) -> None:
    data = tmp_path / "rows.jsonl"
    row = {"prompt": "Once upon a time, Lily had a ball.", "completion": " She played all day."}
    data.write_text("\n".join(json.dumps(row) for _ in range(4)) + "\n")
    out = tmp_path / "sft"
    config = SFTConfig(
        data=str(data), output_dir=str(out), num_steps=2, batch_size=2, progress=False
    )
    with pytest.raises(ConfigError, match="nothing to resume"):
        RunOutputs.of(config, resume=True)
    assert [r["step"] for r in run_recipe("sft", config).history] == [1, 2]
    with pytest.raises(
        ConfigError, match=r"already holds a run .*RunOutputs.of\(config, overwrite=True\)"
    ):
        run_recipe("sft", config)
    assert [
        r["step"] for r in run_recipe("sft", config, RunOutputs.of(config, overwrite=True)).history
    ] == [
        1,
        2,
    ]
    assert len(_rows(out / "metrics.jsonl")) == 2  # the earlier run's rows are gone


def test_the_outputs_argument_replaces_the_configs_output_fields(tmp_path: Path) -> None:
    unused = tmp_path / "unused"
    config = TrainConfig(
        output_dir=str(unused), num_steps=1, batch_size=2, num_generations=2, **STORY
    )
    elsewhere = tmp_path / "elsewhere"
    result = run_recipe("magrpo", config, RunOutputs(output_dir=elsewhere, progress=False))
    assert result.output_dir == elsewhere and len(result.history) == 1
    assert len(_rows(elsewhere / "metrics.jsonl")) == 1
    assert f"output_dir: {elsewhere}" in (elsewhere / "config.yaml").read_text()
    assert not unused.exists()
