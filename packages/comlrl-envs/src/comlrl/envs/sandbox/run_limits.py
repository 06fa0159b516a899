"""Limits per run, not per process: one accounting unit for a run's memory, processes, CPU.

``RLIMIT_AS`` and ``RLIMIT_CPU`` bound one process each: a program that starts ``N``
processes could hold ``N`` times ``memory_mb``. So each run gets one accounting unit, chosen
once per trainer process (:func:`run_accounting`; ``SandboxLimits.accounting`` forces one):

- ``"cgroup2"``: a cgroup v2 of its own per run, under the directory named by the
  environment variable ``COMLRL_SANDBOX_CGROUP`` (a cgroup delegated to the trainer's user,
  e.g. by ``systemd-run --user -p Delegate=yes``) or else the trainer's own cgroup, when
  its ``memory`` and ``pids`` controllers can be enabled for children there (a cgroup with
  processes of its own cannot: then set the variable; a non-root trainer must also be
  allowed to move its runs' processes there, i.e. the directory and the trainer's own
  cgroup lie in one subtree delegated to its user). ``memory.max`` = ``memory_mb``
  (``memory.swap.max`` 0, ``memory.oom.group`` 1: an out-of-memory kill ends the whole
  run), ``pids.max`` = ``max_processes``.
- ``"cgroup1"``: the same with the ``memory``, ``pids`` and ``cpuacct`` controllers of a
  cgroup v1 host (directories under the trainer's own cgroup of each): ``memory.limit_in_
  bytes`` and ``memory.memsw.limit_in_bytes`` = ``memory_mb``, ``pids.max``.
- ``"single_process"`` (fallback: no cgroup can be made here): the program cannot start
  processes (a seccomp filter refuses ``fork``/``clone``, see
  :func:`comlrl.envs.sandbox.syscall_filter.single_process_filter`; threads are allowed),
  so the per-process limits are the run's: ``RLIMIT_AS`` = ``memory_mb`` and ``RLIMIT_CPU``
  = ``cpu_s`` bound the program's one process (a check run's test process, which runs no
  model code, has its own). Programs that start processes (``multiprocessing``,
  ``subprocess``) fail there with ``BlockingIOError``.

With a cgroup, the run's runner joins it before anything else (so everything the run
starts is in it), the trainer reads its CPU time while the run goes on and kills the run
past ``cpu_s`` (CPU seconds of all its processes together), and afterwards kills what is
left in it and removes it. The per-process rlimits stay as a second bound.
``ExecutionResult.isolation["accounting"]`` says which unit a run had; the first run of a
trainer process that falls back warns once (``RuntimeWarning``) with the reason, and
:func:`run_accounting` says it at any time (``python -m comlrl.envs.sandbox`` prints it).
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import threading
import time
import warnings
from dataclasses import dataclass

from comlrl.envs.sandbox.limits import SandboxLimits, SandboxUnavailableError

__all__ = ["Accounting", "RunGroup", "run_accounting", "open_run_group", "CGROUP_ENV"]

CGROUP_ENV = "COMLRL_SANDBOX_CGROUP"
"""Environment variable naming a delegated cgroup v2 directory for the sandbox's runs."""

_V1_CONTROLLERS = ("memory", "pids", "cpuacct")
_NAMES = itertools.count()
_WARNED = False
_WARN_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class Accounting:
    """Which accounting unit this trainer process gives each run, and why.

    Attributes:
        kind: ``"cgroup2"``, ``"cgroup1"`` or ``"single_process"`` (see the module docs).
        parents: per controller hierarchy, the directory the run groups are made in
            (``{"unified": path}`` for cgroup v2; one per controller for v1; empty for the
            fallback).
        reason: why a cgroup could not be used (empty when one is).
    """

    kind: str
    parents: dict[str, str]
    reason: str = ""

    def describe(self) -> str:
        """One line for a user: the active unit and, for the fallback, why."""
        if self.kind == "single_process":
            return (
                "sandbox limits per run: single-process fallback (no cgroup here: "
                f"{self.reason}); programs cannot start processes, so memory_mb and cpu_s "
                f"bound the whole program. Set {CGROUP_ENV} to a delegated cgroup v2 "
                "directory for per-run cgroups"
            )
        where = ", ".join(sorted(set(self.parents.values())))
        return f"sandbox limits per run: a {self.kind} per run under {where}"


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _mounts() -> list[tuple[str, str, str]]:
    """``(mount point, fstype, super options)`` of the cgroup mounts of this process."""
    out = []
    try:
        for line in _read("/proc/self/mountinfo").splitlines():
            pre, _, post = line.partition(" - ")
            fields, tail = pre.split(), post.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                out.append((fields[4], tail[0], tail[2]))
    except OSError:
        pass
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy (``""`` key: the v2 hierarchy)."""
    out = {}
    try:
        for line in _read("/proc/self/cgroup").splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                out[name] = path
    except (OSError, ValueError):
        pass
    return out


def _probe(parent: str) -> None:
    """Make and remove a child group of ``parent`` (raises ``OSError`` when refused)."""
    probe = os.path.join(parent, f"comlrl-probe-{os.getpid()}-{next(_NAMES)}")
    os.mkdir(probe)
    os.rmdir(probe)


def _cgroup2(mounts: list[tuple[str, str, str]], own: dict[str, str]) -> Accounting | str:
    parent = os.environ.get(CGROUP_ENV, "")
    if not parent:
        mount = next((m for m, fstype, _ in mounts if fstype == "cgroup2"), None)
        if mount is None or "" not in own:
            return "no cgroup v2 hierarchy is mounted"
        parent = os.path.normpath(mount + own[""])
    try:
        available = set(_read(os.path.join(parent, "cgroup.controllers")).split())
        missing = {"memory", "pids"} - available
        if missing:
            return f"cgroup v2 at {parent} offers no {'/'.join(sorted(missing))} controller"
        enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
        if not {"memory", "pids"} <= enabled:
            _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
        _probe(parent)
    except OSError as exc:
        return f"cgroup v2 at {parent} cannot hold the runs ({exc.strerror or exc})"
    return Accounting("cgroup2", {"unified": parent})


def _cgroup1(mounts: list[tuple[str, str, str]], own: dict[str, str]) -> Accounting | str:
    parents = {}
    for name in _V1_CONTROLLERS:
        mount = next(
            (m for m, fstype, opts in mounts if fstype == "cgroup" and name in opts.split(",")),
            None,
        )
        if mount is None or name not in own:
            return f"no cgroup v1 {name} controller is mounted"
        parents[name] = os.path.normpath(mount + own[name])
    try:
        for parent in parents.values():
            _probe(parent)
    except OSError as exc:
        return f"cgroup v1 groups cannot be made here ({exc.strerror or exc})"
    return Accounting("cgroup1", parents)


_STALE_S = 3600.0  # an empty run group older than this was left by a trainer that died


def _sweep_stale(parents: dict[str, str]) -> None:
    """Remove the empty run groups that a trainer killed mid-run left behind (a group with
    processes, or one made in the last hour, is never touched: it may be another
    trainer's run)."""
    now = time.time()
    for parent in set(parents.values()):
        try:
            names = [n for n in os.listdir(parent) if n.startswith("comlrl-run-")]
        except OSError:
            continue
        for name in names:
            path = os.path.join(parent, name)
            try:
                if (
                    now - os.stat(path).st_mtime > _STALE_S
                    and not _read(os.path.join(path, "cgroup.procs")).strip()
                ):
                    os.rmdir(path)
            except OSError:
                pass


@functools.lru_cache(maxsize=1)
def _detect() -> Accounting:
    if not os.path.isdir("/sys/fs/cgroup"):
        return Accounting("single_process", {}, "no /sys/fs/cgroup")
    mounts, own = _mounts(), _own_paths()
    found = _cgroup2(mounts, own)
    if not isinstance(found, Accounting):
        second = _cgroup1(mounts, own)
        if not isinstance(second, Accounting):
            return Accounting("single_process", {}, f"{found}; {second}")
        found = second
    _sweep_stale(found.parents)
    return found


def run_accounting(limits: SandboxLimits | None = None) -> Accounting:
    """The accounting unit runs under ``limits`` get here (see the module docs).

    ``limits.accounting``: ``"auto"`` (default) a cgroup where the host allows one, else the
    single-process fallback; ``"cgroup"`` a cgroup or :class:`SandboxUnavailableError`;
    ``"single_process"`` the fallback. Detection runs once per process.

    Raises:
        SandboxUnavailableError: ``"cgroup"`` was asked for and none can be made here.
    """
    wanted = limits.accounting if limits is not None else "auto"
    if wanted == "single_process":
        return Accounting("single_process", {}, "asked for (SandboxLimits.accounting)")
    found = _detect()
    if wanted == "cgroup" and found.kind == "single_process":
        raise SandboxUnavailableError(
            f"SandboxLimits(accounting='cgroup') but no cgroup can be made here: "
            f"{found.reason}. Set {CGROUP_ENV} to a cgroup v2 directory delegated to this "
            "user, or use accounting='auto' (the single-process fallback)"
        )
    return found


class RunGroup:
    """The cgroup of one run (one directory per hierarchy), made by :func:`open_run_group`."""

    def __init__(self, kind: str, dirs: dict[str, str]) -> None:
        self.kind = kind
        self.dirs = dirs
        self.cpu_exceeded = False

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the run's runner writes ``0`` to (joins) first."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def cpu_seconds(self) -> float:
        """CPU seconds used by every process of the run so far (user + system)."""
        try:
            if self.kind == "cgroup2":
                for line in _read(os.path.join(self.dirs["unified"], "cpu.stat")).splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
                return 0.0
            return int(_read(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"))) / 1e9
        except (OSError, ValueError, KeyError):
            return 0.0

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the run for going over ``memory_mb``."""
        name = "memory.events" if self.kind == "cgroup2" else "memory.oom_control"
        key = "unified" if self.kind == "cgroup2" else "memory"
        try:
            for line in _read(os.path.join(self.dirs[key], name)).splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "oom_kill":
                    return int(parts[1]) > 0
        except (OSError, ValueError, KeyError):
            pass
        return False

    def _pids(self) -> set[int]:
        pids: set[int] = set()
        for path in self.procs_files:
            try:
                pids.update(int(p) for p in _read(path).split())
            except (OSError, ValueError):
                pass
        return pids

    def kill(self) -> None:
        """``SIGKILL`` every process of the run (those that left its process group too)."""
        if self.kind == "cgroup2":
            try:
                _write(os.path.join(self.dirs["unified"], "cgroup.kill"), "1")
                return
            except OSError:
                pass  # a kernel before 5.14: one by one
        for pid in self._pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self, wait_s: float = 5.0) -> None:
        """Kill what is left of the run and remove its groups (retrying while they empty)."""
        deadline = time.monotonic() + wait_s
        left = list(self.dirs.values())
        while left:
            self.kill()
            still = []
            for path in left:
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    pass
                except OSError:
                    still.append(path)
            left = still
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.002)


def _limit_files(kind: str, limits: SandboxLimits) -> dict[str, list[tuple[str, str]]]:
    mem = str(limits.memory_mb * 1024 * 1024) if limits.memory_mb is not None else None
    pids = str(limits.max_processes) if limits.max_processes is not None else "max"
    if kind == "cgroup2":
        files = [("memory.max", mem or "max"), ("memory.swap.max", "0" if mem else "max")]
        files += [("memory.oom.group", "1"), ("pids.max", pids)]
        return {"unified": files}
    memory = [("memory.limit_in_bytes", mem), ("memory.memsw.limit_in_bytes", mem)] if mem else []
    return {"memory": memory, "pids": [("pids.max", pids)], "cpuacct": []}


def _warn_fallback(acc: Accounting) -> None:
    global _WARNED
    with _WARN_LOCK:
        if _WARNED:
            return
        _WARNED = True
    warnings.warn(acc.describe(), RuntimeWarning, stacklevel=5)


def open_run_group(limits: SandboxLimits) -> RunGroup | None:
    """A fresh cgroup for one run under ``limits``; ``None`` in the single-process fallback.

    Raises:
        SandboxUnavailableError: ``limits.accounting == "cgroup"`` and none can be made, or
            making this run's group failed.
    """
    acc = run_accounting(limits)
    if acc.kind == "single_process":
        if limits.accounting == "auto":
            _warn_fallback(acc)
        return None
    name = f"comlrl-run-{os.getpid()}-{next(_NAMES)}"
    dirs: dict[str, str] = {}
    group = RunGroup(acc.kind, dirs)
    try:
        for key, files in _limit_files(acc.kind, limits).items():
            path = os.path.join(acc.parents[key], name)
            os.mkdir(path)
            dirs[key] = path
            for file, value in files:
                target = os.path.join(path, file)
                if value is not None and os.path.exists(target):
                    _write(target, value)
    except OSError as exc:
        group.close()
        raise SandboxUnavailableError(
            f"could not make the run's {acc.kind} group {name!r}: {exc}; nothing was run"
        ) from exc
    return group
