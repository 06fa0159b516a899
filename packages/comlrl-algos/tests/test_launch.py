"""The pieces every recipe run shares (:mod:`comlrl.algos.recipes.launch`): the
evaluation split loader, the agents loader's naming and seeds, the resume line, the
outputs argument (:class:`~comlrl.algos.recipes.launch.RunOutputs`), and the exit codes
of a ``comlrl train`` run that training stopped (:func:`comlrl.algos.cli.main.stopped`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from comlrl.algos.cli.main import stopped
from comlrl.algos.recipes import launch
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.run.lifecycle import TrainingInterrupted
from comlrl.core import RewardFunctionError


class _Task:
    def load(self, split: str) -> list[dict[str, Any]]:
        if split != "test":
            raise KeyError(f"no split {split!r}")
        return [{"i": i} for i in range(5)]


def test_the_eval_split_is_cut_to_its_limit_and_a_missing_split_names_eval_split() -> None:
    assert launch.load_eval_split(_Task(), "test", 2) == [{"i": 0}, {"i": 1}]
    assert len(launch.load_eval_split(_Task(), "test")) == 5
    with pytest.raises(ConfigError, match=r"eval_split='dev': .*no split 'dev'"):
        launch.load_eval_split(_Task(), "dev")


def test_agents_are_named_by_index_and_seeded_from_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads: list[tuple[str, int]] = []

    def fake_load(name: str, config: Any, seed: int) -> tuple[Any, Any]:
        loads.append((name, seed))
        return object(), object()

    made: list[dict[str, Any]] = []

    class FakeAgent:
        def __init__(self, model: Any, tok: Any, **kw: Any) -> None:
            made.append(kw)

    monkeypatch.setattr(launch, "load_model", fake_load)
    monkeypatch.setattr("comlrl.algos.rollout.agent.HFAgent", FakeAgent)
    config = SimpleNamespace(num_agents=3, seed=10, model_for=lambda i: f"m{i}")
    assert len(launch.load_agents(config, prompt_format="raw")) == 3
    assert loads == [("m0", 10), ("m1", 11), ("m2", 12)]
    assert made[2] == {"name": "agent_2", "prompt_format": "raw"}
    launch.load_agents(config, 1)
    assert loads[-1] == ("m0", 10) and len(loads) == 4


def test_agents_on_one_gguf_file_read_it_once_and_get_their_own_copies(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"")  # is_gguf_file: an existing file named *.gguf
    folder = tmp_path / "folder"
    folder.mkdir()
    loads: list[str] = []

    def fake_load(name: str, config: Any, seed: int) -> tuple[Any, Any]:
        loads.append(name)
        return torch.nn.Linear(2, 2), {"pad": 0}

    built: list[tuple[Any, Any]] = []

    class FakeAgent:
        def __init__(self, model: Any, tok: Any, **kw: Any) -> None:
            built.append((model, tok))
            model.weight.data.add_(1.0)  # an agent that changes its model

    monkeypatch.setattr(launch, "load_model", fake_load)
    monkeypatch.setattr("comlrl.algos.rollout.agent.HFAgent", FakeAgent)
    names = [str(gguf), str(gguf), str(folder), str(folder), str(gguf)]
    config = SimpleNamespace(num_agents=5, seed=0, model_for=lambda i: names[i])
    launch.load_agents(config)
    # the GGUF file is read once; a folder (fast to load) is loaded per agent as before
    assert loads == [str(gguf), str(folder), str(folder)]
    models = [m for m, _ in built]
    assert len({id(m) for m in models}) == 5 and len({id(t) for _, t in built}) == 5
    # copies were taken before any agent changed its model: every GGUF agent got +1 once
    for i in (1, 4):
        torch.testing.assert_close(models[i].weight, models[0].weight, rtol=0, atol=0)


def test_a_stopped_run_exits_130_on_ctrl_c_and_1_when_the_reward_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctrl_c = TrainingInterrupted(3, tmp_path / "checkpoints" / "step-000003", tmp_path)
    assert stopped(ctrl_c) == 130
    assert f"comlrl train --resume {tmp_path}" in capsys.readouterr().err
    assert stopped(RewardFunctionError("boom")) == 1
    assert "the reward function failed, training stopped: boom" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="a bug"):
        stopped(RuntimeError("a bug"))
    line = launch.resuming_line(tmp_path, 3, 8, tmp_path / "ck")
    assert line == f"resuming {tmp_path} at step 3 of 8 (from {tmp_path / 'ck'})"


def test_a_failed_reward_prints_where_the_last_completed_step_was_saved(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from comlrl.algos.training.run.lifecycle import add_note, failure_note

    exc = RewardFunctionError("boom")
    saved = tmp_path / "checkpoints" / "step-000003"
    add_note(exc, failure_note(3, saved, tmp_path))
    assert stopped(exc) == 1
    err = capsys.readouterr().err
    assert f"training failed in step 4; step 3 (the last completed step) was saved: {saved}" in err
    assert f"resume with: comlrl train --resume {tmp_path}" in err


def test_run_outputs_read_a_config_and_the_record_says_where_the_run_writes(
    tmp_path: Path,
) -> None:
    from comlrl.algos import MADPOConfig, RunOutputs, SFTConfig, TrainConfig

    config = TrainConfig(output_dir=str(tmp_path / "a"), save_every=2, report_to="tensorboard")
    outputs = RunOutputs.of(config)
    assert outputs.output_dir == tmp_path / "a" and outputs.save_every == 2
    assert outputs.report_to == ("jsonl", "tensorboard") and outputs.resume_from is None
    moved = RunOutputs(output_dir=tmp_path / "b", keep_last=1).record(config.model_dump())
    assert (moved["output_dir"], moved["keep_last"], moved["save_every"]) == (
        str(tmp_path / "b"), 1, 0,
    )  # fmt: skip
    assert config.output_dir == str(tmp_path / "a")  # the config is unchanged
    for other in (MADPOConfig, SFTConfig):  # every recipe's config carries the same keys
        made = other(output_dir=str(tmp_path / "m"), reward_curve=False, keep_last=3)
        assert RunOutputs.of(made) == RunOutputs(
            output_dir=tmp_path / "m", keep_last=3, reward_curve=False
        )
    with pytest.raises(ConfigError, match="save_every must be >= 0, got -1"):
        RunOutputs(output_dir=tmp_path, save_every=-1)
