"""The distributions share the PEP 420 ``comlrl`` namespace without clobbering it."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ["comlrl.core", "comlrl.kernels", "comlrl.algos", "comlrl.envs", "comlrl.trainers"]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_package_imports_with_its_public_names(name: str) -> None:
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == []


def test_no_distribution_ships_comlrl_init() -> None:
    import comlrl

    assert getattr(comlrl, "__file__", None) is None
    assert len(list(comlrl.__path__)) >= 1


def test_the_coop_humaneval_task_is_registered() -> None:
    from comlrl.core import available_tasks, get_task

    assert "coop_humaneval" in available_tasks()
    task = get_task("coop_humaneval", limit=2)
    try:
        assert task.num_agents == 2 and len(task.load("train")) == 2
    finally:
        task.close()
