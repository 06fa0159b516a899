"""The ``comlrl`` command line's parsing and checks that need no model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from comlrl.algos.cli.main import main, parse_args
from comlrl.algos.training.config.rl import ConfigError, TrainConfig
from comlrl.algos.training.config.task_setup import (
    TaskInfo,
    check_model_names,
    check_task_fits,
    task_options,
)


def test_options_and_overrides_may_be_intermixed() -> None:
    args = parse_args(
        ["train", "num_steps=2", "--model", "X", "output_dir=y", "--print-config", "seed=3"]
    )
    assert args.command == "train"
    assert args.overrides == ["num_steps=2", "output_dir=y", "seed=3"]
    assert args.model == ["X"] and args.print_config


def test_tasks_subcommand_still_parses() -> None:
    assert parse_args(["tasks"]).command == "tasks"
    with pytest.raises(SystemExit):
        parse_args(["nonsense"])


class _Task:
    num_agents = 3
    max_turns = 1


def test_a_task_for_other_agent_counts_is_caught_before_models_load() -> None:
    with pytest.raises(
        ConfigError, match="written for 3 agents but num_agents=2; set num_agents=3"
    ):
        check_task_fits(TrainConfig(), _Task())
    with pytest.raises(ConfigError, match="supports at most 1 turn"):
        check_task_fits(TrainConfig(num_agents=3, num_turns=2), _Task())
    check_task_fits(TrainConfig(num_agents=3), _Task())


def test_task_options_come_from_the_constructor_signature() -> None:
    class Suite:
        def __init__(
            self, path: str, *, limit: int | None = None, bonus: float = 0.1, **extra: Any
        ) -> None: ...

    options = task_options(Suite)
    assert list(options) == ["path", "limit", "bonus"]
    info = TaskInfo("suite", "m:Suite", "A suite.", options, 2)
    assert info.signature() == "path, limit=None, bonus=0.1"


def test_model_names_are_checked_without_loading(tmp_path: Path) -> None:
    check_model_names(["builtin:stories260k", "Qwen/Qwen2.5-0.5B", str(tmp_path)])
    with pytest.raises(ConfigError, match="'./no/such': no such directory"):
        check_model_names(["builtin:stories260k", "./no/such"])
    with pytest.raises(ConfigError, match="unknown built-in model 'builtin:qwen'"):
        check_model_names(["builtin:qwen"])


class _HubTask:
    """A suite with no shipped copy of its data."""

    num_agents = 2
    data_source = "no copy ships: task.kwargs.path=FILE, else the Hub's org/set"

    def __init__(self, path: str | None = None) -> None:
        self.path = path


class _QuietTask:
    """A suite that does not say where its data comes from."""

    num_agents = 2


def test_comlrl_tasks_says_where_a_suites_data_comes_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from comlrl.algos.training.config import task_setup as preflight

    class _EntryPoint:
        def __init__(self, name: str, factory: type) -> None:
            self.name, self.value, self._factory = name, f"tests:{factory.__name__}", factory

        def load(self) -> type:
            return self._factory

    points = [_EntryPoint("hub_task", _HubTask), _EntryPoint("quiet_task", _QuietTask)]
    monkeypatch.setattr(preflight.metadata, "entry_points", lambda group: points)
    assert main(["tasks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("hub_task ")))
    assert lines[at + 2 : at + 4] == [
        "    options: path=None",
        "    data: no copy ships: task.kwargs.path=FILE, else the Hub's org/set",
    ]
    assert not any("data:" in x for x in lines[at + 4 :])  # the quiet suite says nothing
