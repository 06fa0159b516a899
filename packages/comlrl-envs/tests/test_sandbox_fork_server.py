"""The fork executor's own guarantees: a clean fork server, recovery, no state between programs.

The shared behaviour (limits, exits, adversarial programs) is in the conformance suite,
which runs against both executors; this file covers what only a fork server can get wrong.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from comlrl.envs.sandbox import (
    SandboxLimits,
    SandboxPool,
    _fork_servers,
    check_solution,
    fork_executor,
    run_python,
)

if TYPE_CHECKING:
    from conftest import Beacon

pytestmark = pytest.mark.skipif(not fork_executor.fork_available(), reason="no fork executor here")

FORK = SandboxLimits(timeout_s=5.0, executor="fork")
NO_PIDNS = SandboxLimits(timeout_s=5.0, executor="fork", pid_namespace=False)
# The host's filesystem (the opt-out) for tests that observe the program from the host
# side through /proc, or that need the program to keep the trainer's user id.
HOSTFS = SandboxLimits(timeout_s=5.0, executor="fork", filesystem="host")
NO_PIDNS_HOSTFS = SandboxLimits(
    timeout_s=5.0, executor="fork", pid_namespace=False, filesystem="host"
)


@pytest.fixture(autouse=True)
def fresh_fork_servers() -> Iterator[None]:
    """Each test starts and ends without idle fork servers (so one test cannot hide another's)."""
    fork_executor.shutdown()
    yield
    fork_executor.shutdown()


def _zpid(limits: SandboxLimits = FORK) -> int:
    res = run_python("pass", limits)
    assert res.status == "ok" and res.isolation["executor"] == "fork", res
    return int(res.isolation["fork_server_pid"])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(x) for x in text.split()]


# ------------------------------------------------------------------- the fork server
def test_fork_server_is_reused_and_started_like_an_exec_runner() -> None:
    zpid = _zpid()
    assert _zpid() == zpid, "a sequential caller should keep using one fork server"
    assert zpid in fork_executor._get_pool().pids()
    environ = Path(f"/proc/{zpid}/environ").read_bytes().split(b"\0")
    names = {e.split(b"=", 1)[0].decode() for e in environ if e}
    assert names <= {"PATH", "LANG", "HOME", "TMPDIR"}, names
    cmdline = Path(f"/proc/{zpid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1:4] == [b"-I", b"-S", b"-B"] and b"--fork-server" in cmdline
    assert os.getsid(zpid) == zpid, "the fork server must lead its own session"
    assert os.readlink(f"/proc/{zpid}/cwd") == "/"


def test_shutdown_stops_idle_fork_servers() -> None:
    zpid = _zpid()
    fork_executor.shutdown()
    deadline = time.monotonic() + 5
    while _alive(zpid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(zpid)
    assert _zpid() != zpid, "the next call starts a new fork server"


def test_concurrent_callers_get_their_own_fork_servers() -> None:
    codes = ["import time; time.sleep(0.3)"] * 4
    with SandboxPool(4) as pool:
        pool.run_many(["pass"] * 4, FORK)  # start the fork servers
        start = time.perf_counter()
        results = pool.run_many(codes, FORK)
        elapsed = time.perf_counter() - start
    assert [r.status for r in results] == ["ok"] * 4
    assert len({r.isolation["fork_server_pid"] for r in results}) == 4
    assert elapsed < 0.3 * 4 * 0.75, f"4 programs on 4 fork servers took {elapsed:.2f}s"


# ------------------------------------------------------------- no shared state
def test_state_of_one_program_is_not_visible_to_the_next() -> None:
    dirty = textwrap.dedent(
        """
        import builtins, os, signal, sys, typing, collections, resource
        builtins.SNEAKY = 1
        typing.List = "patched"
        collections.OrderedDict = None
        sys.modules["planted"] = sys
        sys.path.insert(0, "/nonexistent")
        sys.setrecursionlimit(77)
        os.environ["LEAK"] = "1"
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20))
        with open("left_behind.txt", "w") as fh:
            fh.write("x")
        import gc; gc.unfreeze()
        print(os.getcwd())
        """
    )
    probe = textwrap.dedent(
        """
        import builtins, json, os, signal, sys, typing, collections, resource
        print(json.dumps({
            "sneaky": hasattr(builtins, "SNEAKY"),
            "typing": typing.List is not None and typing.List != "patched",
            "odict": collections.OrderedDict is not None,
            "planted": "planted" in sys.modules,
            "path": "/nonexistent" in sys.path,
            "recursion": sys.getrecursionlimit(),
            "env": "LEAK" in os.environ,
            "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "files": os.listdir("."),
            "cwd": os.getcwd(),
        }))
        """
    )
    first = run_python(dirty, FORK)
    assert first.status == "ok", first
    second = run_python(probe, FORK)
    assert second.status == "ok", second
    assert first.isolation["fork_server_pid"] == second.isolation["fork_server_pid"], (
        "same fork server"
    )
    seen = json.loads(second.stdout)
    assert seen["sneaky"] is False and seen["typing"] and seen["odict"]
    assert seen["planted"] is False and seen["path"] is False and seen["env"] is False
    assert seen["recursion"] != 77 and seen["sigterm"] and seen["nofile"] != 20
    assert seen["files"] == [] and seen["cwd"] != first.stdout.strip()
    assert not Path(first.stdout.strip()).exists()


def test_random_state_differs_between_forked_programs() -> None:
    code = "import random, os; print(random.random(), os.urandom(8).hex())"
    outs = {run_python(code, FORK).stdout for _ in range(3)}
    assert len(outs) == 3


def test_harness_snapshot_is_not_affected_by_an_earlier_program() -> None:
    test = "def check(candidate):\n    assert abs(candidate(-2)) == 2\n"
    bad = "import builtins\nbuiltins.abs = lambda x: 2\ndef f(x):\n    return 99\n"
    assert check_solution(bad, test, "f", FORK).passed == 0
    good = check_solution("def f(x):\n    return x\n", test, "f", FORK)
    assert (good.status, good.passed) == ("passed", 1)


# --------------------------------------------------------------- recovery
def test_fork_server_killed_mid_run_fails_only_that_run_and_is_replaced() -> None:
    zpid = _zpid()
    out: dict[str, object] = {}

    def slow() -> None:
        out["res"] = run_python("import time; time.sleep(3); print('finished')", FORK)

    worker = threading.Thread(target=slow)
    start = time.perf_counter()
    worker.start()
    time.sleep(0.5)
    os.kill(zpid, signal.SIGKILL)
    worker.join(10)
    elapsed = time.perf_counter() - start
    res = out["res"]
    assert res.status == "killed" and res.error_type == "SandboxError", res  # type: ignore[attr-defined]
    assert "finished" not in res.stdout  # type: ignore[attr-defined]
    assert elapsed < 2.5, "the run should end when its fork server dies, not at the deadline"
    new = run_python("print('ok')", FORK)
    assert new.status == "ok" and new.stdout == "ok\n"
    assert new.isolation["fork_server_pid"] != zpid


def test_dead_idle_fork_server_is_replaced_transparently() -> None:
    zpid = _zpid()
    os.kill(zpid, signal.SIGKILL)
    time.sleep(0.1)
    res = run_python("print(1)", FORK)
    assert res.status == "ok" and res.stdout == "1\n"
    assert res.isolation["fork_server_pid"] != zpid


def test_hung_fork_server_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fork_executor, "_REPLY_TIMEOUT_S", 0.5)
    zpid = _zpid()
    os.kill(zpid, signal.SIGSTOP)
    try:
        res = run_python("print(2)", FORK)
    finally:
        try:
            os.kill(zpid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert res.status == "ok" and res.stdout == "2\n"
    assert res.isolation["fork_server_pid"] != zpid


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGTSTP"])
def test_program_cannot_signal_its_fork_server_away(sig: str) -> None:
    # Without a PID namespace the fork server is the program's parent and visible to it; with
    # the trainer's user id (host filesystem, the opt-out) the signal is even delivered.
    zpid = _zpid(NO_PIDNS_HOSTFS)
    code = (
        f"import os, signal, time\nos.kill(os.getppid(), signal.{sig})\ntime.sleep(0.2)\nprint('x')"
    )
    res = run_python(code, NO_PIDNS_HOSTFS)
    assert res.status == "ok" and res.stdout == "x\n", res
    assert _alive(zpid)
    assert _zpid(NO_PIDNS_HOSTFS) == zpid, "the fork server survived and is still in use"


def test_program_that_kills_its_fork_server_is_recovered_from() -> None:
    zpid = _zpid(NO_PIDNS_HOSTFS)
    code = "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(1)\n"
    res = run_python(code, NO_PIDNS_HOSTFS)
    assert res.status == "killed", res
    assert res.duration_s < 3
    assert not _alive(zpid)
    after = run_python("print('fine')", NO_PIDNS_HOSTFS)
    assert after.status == "ok" and after.stdout == "fine\n"
    assert after.isolation["fork_server_pid"] != zpid


def test_isolated_program_without_pid_namespace_cannot_signal_its_fork_server() -> None:
    zpid = _zpid(NO_PIDNS)
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
    res = run_python(code, NO_PIDNS)
    if os.geteuid() != 0:
        pytest.skip("a non-root trainer's program keeps its user id (in a user namespace)")
    assert res.status == "error" and res.error_type == "PermissionError", res
    assert _alive(zpid) and _zpid(NO_PIDNS) == zpid


def test_fork_server_is_invisible_from_a_pid_namespace() -> None:
    zpid = _zpid()
    if not run_python("pass", FORK).isolation.get("pidns"):
        pytest.skip("no PID namespace here")
    code = textwrap.dedent(
        f"""
        import os, signal
        print(os.getpid(), os.getppid())
        for target in ({zpid}, os.getppid()):
            try:
                os.kill(target, signal.SIGKILL)
                print("sent", target)
            except ProcessLookupError:
                print("no such process", target)
        """
    )
    res = run_python(code, FORK)
    assert res.stdout.splitlines()[0] == "2 1"
    assert res.status == "ok", res
    assert _alive(zpid)
    assert _zpid() == zpid


@pytest.mark.parametrize("limits", [FORK, NO_PIDNS], ids=["pidns", "no-pidns"])
def test_grandchildren_are_killed_and_the_fork_server_keeps_no_children(
    beacon: Beacon, limits: SandboxLimits, needs_processes: None
) -> None:
    # With a PID namespace the namespace's end kills them; without one the fork server, a
    # child subreaper, adopts and kills them (setsid() escapees included).
    code = textwrap.dedent(
        f"""
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                os.setsid()
                {beacon.code}
                print("up", flush=True)
                while True:
                    time.sleep(0.05)
        time.sleep(0.3)
        """
    )
    res = run_python(code, limits)
    assert res.status == "ok"
    assert "up" in res.stdout, "the grandchildren never ran; the test would pass vacuously"
    assert beacon.wait_gone() == [], "grandchildren outlived the program"
    # At most the last program, kept as an (exited) zombie until the next request.
    kids = _children(int(res.isolation["fork_server_pid"]))
    assert len(kids) <= 1 and not any(_alive(k) for k in kids), kids


# --------------------------------------------------------------- fallback
def test_falls_back_to_exec_when_fork_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fork_executor, "fork_available", lambda: False)
    monkeypatch.setattr(fork_executor, "_WARNED", False)
    with pytest.warns(RuntimeWarning, match="exec executor"):
        res = run_python("print(3)", FORK)
    assert res.status == "ok" and res.isolation["executor"] == "exec"


def test_falls_back_to_exec_when_a_fork_server_cannot_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_fork_servers, "_RUNNER", "/nonexistent/_runner.py")
    monkeypatch.setattr(_fork_servers, "_READY_TIMEOUT_S", 5.0)
    monkeypatch.setattr(fork_executor, "_WARNED", False)
    with pytest.warns(RuntimeWarning, match="fork server"):
        res = run_python("print(4)", FORK)
    assert res.status == "ok" and res.stdout == "4\n"
    assert res.isolation["executor"] == "exec"


def test_exec_kind_never_uses_a_fork_server() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = run_python("pass", SandboxLimits(timeout_s=5.0, executor="exec"))
    assert res.isolation["executor"] == "exec" and "fork_server_pid" not in res.isolation
    assert fork_executor._get_pool().pids() == []


_NETNS = "import os\nprint(os.readlink('/proc/self/ns/net'))\n"


def test_network_namespace_is_made_once_per_fork_server_and_never_the_hosts() -> None:
    host = os.readlink("/proc/self/ns/net")
    first = run_python(_NETNS, HOSTFS)  # /proc is the host's: the namespace can be read
    if not first.isolation.get("netns"):
        pytest.skip("this OS did not allow a network namespace")
    second = run_python(_NETNS, HOSTFS)
    assert first.status == second.status == "ok"
    assert first.isolation.get("netns_shared_with") == "fork server"
    assert first.isolation["fork_server_pid"] == second.isolation["fork_server_pid"]
    # one namespace for that fork server's programs, made when it started; not the host's
    assert first.stdout == second.stdout != host + "\n"
    opened = run_python(_NETNS, dataclasses.replace(HOSTFS, allow_network=True))
    assert opened.status == "ok" and opened.stdout == host + "\n", "network allowed: the host's"
    assert opened.isolation["fork_server_pid"] != first.isolation["fork_server_pid"]
    assert not opened.isolation.get("netns")
    # and a fork server never hands a namespaced program to the network-allowed one or back
    assert run_python(_NETNS, HOSTFS).stdout == first.stdout


def test_without_a_fork_server_namespace_each_child_makes_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fork server that could not unshare answers plain "ready": its children must then make
    # their own namespace (the previous behaviour), not run on the host's network.
    real = _fork_servers.ForkServer.__init__

    def no_netns(self, netns: bool = False) -> None:  # type: ignore[no-untyped-def]
        real(self, False)
        self.wants_netns = netns

    monkeypatch.setattr(_fork_servers.ForkServer, "__init__", no_netns)
    host = os.readlink("/proc/self/ns/net")
    res = run_python(_NETNS, HOSTFS)
    if not res.isolation.get("netns"):
        pytest.skip("this OS did not allow a network namespace")
    assert "netns_shared_with" not in res.isolation
    assert res.status == "ok" and res.stdout != host + "\n"
