"""Recipes that cannot train agents with tools refuse a task with tools before any model
loads, saying why (issue 29, item 1); needs comlrl-envs' ``tool_math``."""

from __future__ import annotations

from typing import Any

import pytest
from comlrl.algos.cli.main import main


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    import comlrl.algos.models.loading as loading

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a model was loaded before the tool refusal")

    for name in ("load_model_and_tokenizer", "build_default_model"):
        monkeypatch.setattr(loading, name, refuse)


@pytest.mark.parametrize("algo", ["madpo", "centralized_magrpo"])
def test_a_recipe_without_tool_support_refuses_tool_math_before_loading(
    algo: str, no_model_loads: None, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", f"algo={algo}", "task.name=tool_math", f"output_dir={tmp_path}"]
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc not in (0, None), err
    assert f"algo={algo} cannot train agents that call tools inside a turn" in err, err
    assert "'tool_math'" in err and "magrpo" in err
