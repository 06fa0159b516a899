"""``comlrl info``: versions, torch/CUDA, the kernels' build, tasks, recipes, extras."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
from comlrl.algos.cli import info as info_module
from comlrl.algos.cli.main import main


def test_info_reports_the_installed_packages_tasks_recipes_and_the_kernels_isa() -> None:
    info = info_module.collect_info()
    assert info["packages"] == {name: metadata.version(name) for name in info_module.PACKAGES}
    assert info["dependencies"]["torch"] == metadata.version("torch")
    assert info["dependencies"]["transformers"] == metadata.version("transformers")
    import torch

    assert info["torch"]["cuda"] == torch.version.cuda
    assert {"coop_story", "coop_humaneval", "mbpp"} <= set(info["tasks"])
    assert {"magrpo", "sft", "dpo", "iac"} <= set(info["recipes"])
    from comlrl.kernels import backend_info

    assert info["kernels"]["cpu_module"] == backend_info()["_cpu"]
    assert info["kernels"]["build"] == backend_info()["build"]
    if backend_info()["_cpu"].startswith("built"):
        assert "isa " in info["kernels"]["cpu_module"]
    # every extra comlrl-algos declares is listed, installed or not
    assert {"plot", "lora", "vllm", "gguf", "test"} <= set(info["extras"]["comlrl-algos"])


def test_an_extra_whose_package_is_missing_names_that_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = info_module.version_of
    monkeypatch.setattr(
        info_module, "version_of", lambda name: None if name == "matplotlib" else real(name)
    )
    extras = info_module.extras_status("comlrl-algos")
    assert extras["plot"] == ["matplotlib"]
    assert extras["gguf"] == [n for n in ("gguf", "accelerate") if real(n) is None]
    assert info_module.extras_status("no-such-distribution-xyz") == {}
    assert info_module.version_of("no-such-distribution-xyz") is None


def test_comlrl_info_prints_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    for needle in ("comlrl-algos", "torch", "kernels:", "cpu_module", "tasks: ", "recipes: "):
        assert needle in text, needle
    assert "comlrl-algos[plot]" in text
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {
        "packages",
        "dependencies",
        "torch",
        "kernels",
        "tasks",
        "recipes",
        "extras",
    }
