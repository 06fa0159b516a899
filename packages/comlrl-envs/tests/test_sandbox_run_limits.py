"""The choice of the accounting unit per run, and its bookkeeping, on stand-in cgroup trees.

The kernel's side (a run really bounded as a whole) is in ``test_sandbox_conformance.py``;
here the choice between cgroup v2, cgroup v1 and the single-process fallback, the limit
files written for each, and how usage and out-of-memory kills are read back.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from comlrl.envs.sandbox import SandboxLimits, SandboxUnavailableError, run_limits
from comlrl.envs.sandbox.run_limits import RunGroup, open_run_group, run_accounting


@pytest.fixture(autouse=True)
def fresh_detection(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    run_limits._detect.cache_clear()
    monkeypatch.setattr(run_limits, "_WARNED", False)
    yield
    run_limits._detect.cache_clear()


def _delegated(tmp_path: Path, controllers: str = "cpu memory pids") -> Path:
    root = tmp_path / "delegated"
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("memory pids\n")
    return root


def test_a_delegated_cgroup2_directory_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _delegated(tmp_path)
    monkeypatch.setenv(run_limits.CGROUP_ENV, str(root))
    acc = run_accounting()
    assert (acc.kind, acc.parents) == ("cgroup2", {"unified": str(root)})
    assert str(root) in acc.describe()
    assert not any(p.name.startswith("comlrl-probe") for p in root.iterdir())


def test_cgroup2_without_memory_or_pids_falls_back_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _delegated(tmp_path, controllers="cpu hugetlb")
    monkeypatch.setenv(run_limits.CGROUP_ENV, str(root))
    monkeypatch.setattr(run_limits, "_cgroup1", lambda mounts, own: "no cgroup v1 here")
    acc = run_accounting()
    assert acc.kind == "single_process"
    assert "memory/pids" in acc.reason and "no cgroup v1 here" in acc.reason
    assert "single-process fallback" in acc.describe() and run_limits.CGROUP_ENV in acc.describe()
    with pytest.raises(SandboxUnavailableError, match="accounting='cgroup'"):
        run_accounting(SandboxLimits(accounting="cgroup"))


def test_the_fallback_warns_once_and_makes_no_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_limits, "_mounts", lambda: [])
    monkeypatch.delenv(run_limits.CGROUP_ENV, raising=False)
    with pytest.warns(RuntimeWarning, match="single-process fallback"):
        assert open_run_group(SandboxLimits()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_run_group(SandboxLimits()) is None  # said once per process
        assert open_run_group(SandboxLimits(accounting="single_process")) is None


def test_limit_files_of_each_hierarchy() -> None:
    limits = SandboxLimits(memory_mb=128, max_processes=16)
    v2 = dict(run_limits._limit_files("cgroup2", limits)["unified"])
    assert v2 == {
        "memory.max": str(128 << 20),
        "memory.swap.max": "0",
        "memory.oom.group": "1",
        "pids.max": "16",
    }
    v1 = run_limits._limit_files("cgroup1", limits)
    assert dict(v1["memory"]) == {
        "memory.limit_in_bytes": str(128 << 20),
        "memory.memsw.limit_in_bytes": str(128 << 20),
    }
    assert dict(v1["pids"]) == {"pids.max": "16"}
    unbounded = run_limits._limit_files(
        "cgroup2", SandboxLimits(memory_mb=None, max_processes=None)
    )
    assert dict(unbounded["unified"])["memory.max"] == "max"


def test_usage_and_oom_kills_are_read_back(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    group = RunGroup("cgroup2", {"unified": str(v2)})
    assert group.cpu_seconds() == pytest.approx(2.5)
    assert group.oom_killed()
    mem, cpu = tmp_path / "mem", tmp_path / "cpu"
    mem.mkdir()
    cpu.mkdir()
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (cpu / "cpuacct.usage").write_text("1500000000\n")
    group = RunGroup("cgroup1", {"memory": str(mem), "cpuacct": str(cpu)})
    assert group.cpu_seconds() == pytest.approx(1.5)
    assert not group.oom_killed()
    assert group.procs_files == [str(mem / "cgroup.procs"), str(cpu / "cgroup.procs")]


def test_closing_a_group_removes_its_directories(tmp_path: Path) -> None:
    dirs = {"memory": str(tmp_path / "a"), "pids": str(tmp_path / "b")}
    for d in dirs.values():
        Path(d).mkdir()
    RunGroup("cgroup1", dirs).close(wait_s=0.1)
    assert not any(Path(d).exists() for d in dirs.values())
