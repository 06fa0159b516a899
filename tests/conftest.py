from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout (real data and the stories260k model)."""
    if not SHARED.is_dir():
        pytest.skip(f"shared test data not found at {SHARED} (it sits beside the checkout in CI)")
    return SHARED


@pytest.fixture(scope="session")
def stories260k() -> Path:
    """The pretrained stories260k model's folder: the copy comlrl-algos ships as package
    data (``builtin:stories260k``), so these tests need nothing beside the checkout."""
    from comlrl.algos.models.loading import builtin_model_path

    return builtin_model_path()


@pytest.fixture
def comlrl_here(
    capsys: pytest.CaptureFixture[str],
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``comlrl *args`` through its entry point (``comlrl.algos.cli.main.main``) in this
    process, in ``cwd`` (default: where the test stands): its exit code and what it printed,
    as ``subprocess.run`` gives them for a child. The same code as the console script
    without a new interpreter importing torch and transformers (~5 CPU-s a process); runs
    whose numbers are compared with another process's stay child processes."""
    from comlrl.algos.cli.main import main

    def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()  # what was printed before is not this call's
        here = os.getcwd()
        if cwd is not None:
            os.chdir(cwd)
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's refusals
            code = exc.code if isinstance(exc.code, int) else 2
        finally:
            os.chdir(here)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["comlrl", *args], code, out, err)

    return run


#: The cross-package test files that take longest (each 10-60 s with the slow tests, on one
#: core of the 2-core machine: ``-n 2 --dist loadfile`` with a per-test timing plugin,
#: 2026-11-29), longest first. pytest-xdist (``--dist loadfile``) hands whole files to its
#: workers in the order of the queue, so a long file handed out late leaves the other worker
#: idle until it ends. nox passes ``--no-loadscope-reorder``: xdist's default queue order is
#: by number of tests, which put the 26-s one-test ``test_lora_learn.py`` near the end (one
#: worker ended 29 s after the other). Only the order changes: every other file runs after
#: these, in its usual order, and a name that is no longer a file here changes nothing.
LONGEST_FIRST = [
    "test_defaults_learn.py",
    "test_real_llm_smoke.py",
    "test_run_lifecycle.py",
    "test_distributed.py",
    "test_actor_critic_learn.py",
    "test_docs_snippets.py",
    "test_lora_learn.py",
    "test_task_mixture.py",
    "test_gpu_bench_dry_run.py",
    "test_cli.py",
    "test_preference_learn.py",
    "test_gpu_check_dry_run.py",
    "test_cli_recipes.py",
    "test_madpo_defaults_learn.py",
    "test_cli_iterative_centralized.py",
    "test_tool_distributed.py",
    "test_task_serving.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the files of :data:`LONGEST_FIRST` first, in that order (a stable sort: the
    tests of a file keep their order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
