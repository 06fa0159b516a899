from __future__ import annotations

import importlib

import pytest

MODULES = [
    "comlrl.envs",
    "comlrl.envs.sandbox",
    "comlrl.envs.code",
    "comlrl.envs.math",
    "comlrl.envs.tools",
    "comlrl.envs.writing",
    "comlrl.envs.remote",
]


@pytest.mark.parametrize("module_name", MODULES)
def test_every_name_in_all_is_importable(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__all__, f"{module_name}.__all__ is empty"
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{module_name}.{name} missing"


def test_comlrl_is_a_namespace_package_without_init() -> None:
    import comlrl

    assert getattr(comlrl, "__file__", None) is None, "a stray comlrl/__init__.py exists"


def test_envs_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, comlrl.envs, comlrl.envs.remote; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_suite_is_registered() -> None:
    from comlrl.core import available_tasks

    names = {
        "coop_humaneval",
        "coop_humaneval_che",
        "mbpp",
        "classeval",
        "gsm8k",
        "tldr",
        "arxiv",
        "coop_story",
        "tool_math",
        "debate_math",
    }
    assert names <= set(available_tasks())
