"""The reproducible runs of docs/real-models.md write to a fresh path by default: running
their documented commands never overwrites the committed JSON and plot."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ("benchmarks/real_llm_learning_run.py", "benchmarks/bench_real_llm_baselines.py")


def _module(path: str) -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tracked() -> set[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return set(out.splitlines())


def _documented(script: str) -> list[list[str]]:
    text = (REPO / "docs" / "real-models.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash[^\n]*\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            argv = shlex.split(line)
            if argv[:2] == ["python", script]:
                out.append(argv[2:])
    return out


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_documented_command_writes_nothing_that_is_committed(script: str) -> None:
    commands = _documented(script)
    assert commands, f"docs/real-models.md no longer runs {script}"
    parser = _module(script).build_parser()
    tracked = _tracked()
    for argv in commands:
        args = parser.parse_args(argv)
        workdir = getattr(args, "workdir", None)
        outputs = [args.out or str(Path(workdir) / "x.json")]
        if hasattr(args, "plot"):
            outputs.append(args.plot or str(Path(workdir) / "x.png"))
        for path in outputs:
            rel = Path(path).resolve().relative_to(REPO).as_posix()
            assert rel not in tracked, f"`python {script} {shlex.join(argv)}` overwrites {rel}"
            assert not rel.startswith(("benchmarks/results/", "docs/img/")), rel
