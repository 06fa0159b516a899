"""Conformance suite for sandbox executors, adversarial programs included.

Every executor entry point with the ``(code, limits) -> ExecutionResult`` interface runs
the same checks: the direct call, a one-off ``run_many`` and a shared ``SandboxPool``,
each with both executor kinds (``"fork"``: children of a fork server; ``"exec"``: a new
interpreter per program).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from comlrl.envs.sandbox import ExecutionResult, SandboxLimits, SandboxPool, run_many, run_python

if TYPE_CHECKING:
    from conftest import Beacon

Executor = Callable[[str, SandboxLimits], ExecutionResult]


@pytest.fixture(scope="module")
def shared_pool() -> Iterator[SandboxPool]:
    with SandboxPool(max_workers=2) as pool:
        yield pool


EXECUTORS = ["fork", "exec"]


@pytest.fixture(params=EXECUTORS)
def executor_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["run_python", "run_many", "pool"])
def run(request: pytest.FixtureRequest, shared_pool: SandboxPool, executor_kind: str) -> Executor:
    def kind(limits: SandboxLimits) -> SandboxLimits:
        return dataclasses.replace(limits, executor=executor_kind)

    def checked(res: ExecutionResult) -> ExecutionResult:
        # The run really went through the executor under test (no silent fallback).
        if res.isolation:
            assert res.isolation.get("executor") == executor_kind, res.isolation
        return res

    if request.param == "run_python":
        return lambda code, limits: checked(run_python(code, kind(limits)))
    if request.param == "run_many":
        return lambda code, limits: checked(run_many([code], kind(limits), max_workers=1)[0])
    return lambda code, limits: checked(shared_pool.run_many([code], kind(limits))[0])


FAST = SandboxLimits(timeout_s=5.0)


def _probe() -> ExecutionResult:
    return run_python("pass", FAST)


# ---------------------------------------------------------------- plain behaviour
def test_ok_program_returns_stdout_and_status_ok(run: Executor) -> None:
    res = run("print(6 * 7)", FAST)
    assert res.status == "ok" and res.returncode == 0
    assert res.stdout == "42\n"
    assert res.duration_s < 5


def test_uncaught_exception_is_an_error_with_its_type(run: Executor) -> None:
    res = run("raise KeyError('nope')", FAST)
    assert res.status == "error" and res.returncode == 1
    assert res.error_type == "KeyError"
    assert "KeyError" in res.stderr


def test_syntax_error_is_reported_as_such(run: Executor) -> None:
    res = run("def f(:\n    pass", FAST)
    assert res.status == "syntax_error"
    assert res.error_type == "SyntaxError"


def test_stdin_is_empty_not_the_runner_instructions(run: Executor) -> None:
    res = run("import sys; data = sys.stdin.read(); print(repr(data))", FAST)
    assert res.status == "ok"
    assert res.stdout.strip() == "''"


def test_runs_in_a_fresh_empty_workdir_that_is_deleted(run: Executor) -> None:
    res = run("import os; print(os.getcwd()); print(os.listdir('.'))", FAST)
    cwd, listing = res.stdout.splitlines()
    assert listing == "[]"
    assert cwd != os.getcwd()
    assert not Path(cwd).exists(), "the sandbox work dir was not removed"


def test_environment_is_scrubbed(run: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMLRL_TEST_SECRET", "hunter2-api-key")
    res = run(
        "import os; print(sorted(os.environ)); print(os.environ.get('COMLRL_TEST_SECRET'))", FAST
    )
    assert res.status == "ok"
    assert "hunter2" not in res.stdout
    assert "COMLRL_TEST_SECRET" not in res.stdout
    assert set(eval(res.stdout.splitlines()[0])) <= {"PATH", "LANG", "HOME", "TMPDIR", "LC_CTYPE"}


def test_parent_sys_path_is_not_visible(run: Executor) -> None:
    # -I -S: no site-packages, no cwd on sys.path, so the trainer's packages are not importable.
    res = run("import comlrl.envs", FAST)
    assert res.status == "error" and res.error_type == "ModuleNotFoundError"


# ------------------------------------------------------------------------ exits
@pytest.mark.parametrize(
    ("code", "status", "rc"),
    [
        ("import os; os._exit(0)", "ok", 0),
        ("import os; os._exit(3)", "error", 3),
        ("import sys; sys.exit(0)", "ok", 0),
        ("import sys; sys.exit(5)", "error", 5),
        ("raise SystemExit(0)", "ok", 0),
    ],
)
def test_exit_paths_report_the_exit_code(run: Executor, code: str, status: str, rc: int) -> None:
    res = run(code, FAST)
    assert (res.status, res.returncode) == (status, rc)


def test_system_exit_raised_in_atexit_does_not_hang(run: Executor) -> None:
    code = "import atexit\ndef bye():\n    raise SystemExit(7)\natexit.register(bye)\nprint('x')"
    res = run(code, FAST)
    assert res.status in ("ok", "error")
    assert res.stdout == "x\n"
    assert res.duration_s < 3


# ------------------------------------------------------------------ adversarial
def test_infinite_loop_times_out_and_is_killed(run: Executor) -> None:
    limits = SandboxLimits(timeout_s=1.0, cpu_s=30)
    start = time.perf_counter()
    res = run("while True:\n    pass", limits)
    elapsed = time.perf_counter() - start
    assert res.status == "timeout"
    assert elapsed < 3.0


def test_cpu_limit_kills_a_busy_loop_before_the_wall_clock(run: Executor) -> None:
    res = run("while True:\n    pass", SandboxLimits(timeout_s=20.0, cpu_s=1))
    assert res.status == "killed", res
    assert res.duration_s < 15


def test_sleeping_program_times_out(run: Executor) -> None:
    res = run("import time; time.sleep(30)", SandboxLimits(timeout_s=0.5))
    assert res.status == "timeout"
    assert res.duration_s < 2.5


def _lingering_child(beacon: Beacon, *, setsid: bool) -> str:
    return textwrap.dedent(
        f"""
        import os, sys, time
        pid = os.fork()
        if pid == 0:
            if {setsid!r}:
                os.setsid()
            {beacon.code}
            print("child up", flush=True)
            while True:
                time.sleep(0.05)
        time.sleep(0.3)
        print("parent done", flush=True)
        """
    )


@pytest.mark.parametrize("setsid", [False, True], ids=["same-group", "setsid-escape"])
def test_child_that_outlives_the_program_is_killed(
    run: Executor, beacon: Beacon, setsid: bool, needs_processes: None
) -> None:
    if setsid and not _probe().isolation.get("pidns"):
        pytest.skip("no PID namespace here: a setsid() grandchild escapes the group kill")
    res = run(_lingering_child(beacon, setsid=setsid), FAST)
    assert "parent done\n" in res.stdout
    assert res.duration_s < 3, "the parent waited for the lingering child"
    assert "child up" in res.stdout, "the child never ran; the test would pass vacuously"
    assert beacon.wait_gone() == [], "a child of the sandboxed program is still there"


def test_subprocess_in_new_session_is_killed_on_timeout(
    run: Executor, beacon: Beacon, needs_processes: None
) -> None:
    if not _probe().isolation.get("pidns"):
        pytest.skip("no PID namespace here: start_new_session children escape the group kill")
    child = f"import time\n{beacon.code}\nprint('child up', flush=True)\ntime.sleep(60)"
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-I', '-S', '-c', {child!r}], start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    res = run(code, SandboxLimits(timeout_s=1.5))
    assert res.status == "timeout"
    assert "child up" in res.stdout, "the subprocess never ran; the test would pass vacuously"
    assert beacon.wait_gone() == []


def test_bounded_fork_swarm_is_killed_with_the_program(
    run: Executor, beacon: Beacon, needs_processes: None
) -> None:
    code = textwrap.dedent(
        f"""
        import os, time
        for i in range(40):
            if os.fork() == 0:
                {beacon.code}
                print("up", flush=True)
                while True:
                    time.sleep(0.1)
        time.sleep(0.3)
        """
    )
    res = run(code, FAST)
    assert res.status == "ok"
    assert "up" in res.stdout
    assert beacon.wait_gone() == []


def test_unbounded_fork_bomb_is_contained(run: Executor) -> None:
    if not _probe().isolation.get("nproc_enforced"):
        pytest.skip(
            "RLIMIT_NPROC is not enforced here (a root trainer with filesystem='host'): "
            "an unbounded fork bomb would only be stopped by the wall clock"
        )
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    res = run(code, SandboxLimits(timeout_s=2.0, max_processes=32))
    assert res.status in ("timeout", "killed", "error")


def test_memory_hog_hits_the_address_space_limit(run: Executor) -> None:
    res = run("x = bytearray(4 * 1024 ** 3)", SandboxLimits(timeout_s=5.0, memory_mb=256))
    assert res.status == "error" and res.error_type == "MemoryError"


def test_growing_memory_hog_is_stopped(run: Executor) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))"
    res = run(code, SandboxLimits(timeout_s=10.0, memory_mb=256))
    assert res.status in ("error", "killed")
    assert res.status != "timeout"
    if res.status == "error":
        assert res.error_type == "MemoryError"


def test_huge_output_is_capped(run: Executor) -> None:
    limits = SandboxLimits(timeout_s=10.0, max_output_bytes=4096)
    res = run("import sys\nfor _ in range(2000):\n    sys.stdout.write('y' * 10000)", limits)
    assert res.status == "ok"
    assert len(res.stdout) == 4096 and res.stdout_truncated
    assert not res.stderr_truncated


def test_huge_stderr_is_capped(run: Executor) -> None:
    limits = SandboxLimits(timeout_s=10.0, max_output_bytes=1000)
    res = run("import sys\nsys.stderr.write('e' * 5_000_000)", limits)
    assert len(res.stderr) == 1000 and res.stderr_truncated


def test_big_file_write_is_stopped_by_the_file_size_limit(run: Executor) -> None:
    code = "with open('big.bin', 'wb') as fh:\n    fh.write(b'0' * (8 * 1024 * 1024))"
    res = run(code, SandboxLimits(timeout_s=5.0, file_size_mb=1))
    assert res.status in ("error", "killed")
    if res.status == "error":
        assert res.error_type == "OSError"
    ok = run(code, SandboxLimits(timeout_s=5.0, file_size_mb=16))
    assert ok.status == "ok", "an 8 MiB file under a 16 MiB limit must be allowed"


def test_network_is_unreachable_when_isolated(run: Executor) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        "s = socket.socket()\n"
        "s.settimeout(2)\n"
        f"s.connect(('127.0.0.1', {port}))\n"
        "print('connected')\n"
    )
    try:
        res = run(code, FAST)
        if not res.isolation.get("netns"):
            pytest.skip("this OS did not allow a network namespace; network is not isolated")
        assert res.status == "error"
        assert "connected" not in res.stdout
        opened = run(code, SandboxLimits(timeout_s=5.0, allow_network=True))
        assert opened.stdout == "connected\n", "control: with network allowed it connects"
    finally:
        server.close()


# --------------------------------------------------------------------------- IPC
# Each program creates (argv "create") or opens ("open") one IPC object named by KEY and
# prints what it got. SysV objects and POSIX message queues live in the IPC namespace;
# POSIX shared memory is a file under /dev/shm (absent from the isolated root).
_IPC_HEAD = """
import ctypes, ctypes.util, os
libc = ctypes.CDLL(None, use_errno=True)
KEY, MODE = {key}, {mode!r}
CREAT = 0o1000 | 0o600 if MODE == "create" else 0
"""
IPC_PROGRAMS = {
    "sysv-shm": """
shmid = libc.shmget(KEY, 4096 if MODE == "create" else 0, CREAT)
if shmid < 0:
    print("refused", ctypes.get_errno())
else:
    libc.shmat.restype = ctypes.c_void_p
    addr = libc.shmat(shmid, None, 0)
    buf = (ctypes.c_char * 16).from_address(addr)
    if MODE == "create":
        buf.value = b"answers-42"
    print("got", buf.value.decode())
""",
    "sysv-sem": """
semid = libc.semget(KEY, 1, CREAT)
print("refused" if semid < 0 else "got", semid)
""",
    "sysv-msg": """
class Msg(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 16)]
qid = libc.msgget(KEY, CREAT)
if qid < 0:
    print("refused", ctypes.get_errno())
elif MODE == "create":
    print("got", libc.msgsnd(qid, ctypes.byref(Msg(1, b"answers-42")), 16, 0))
else:
    m = Msg()
    n = libc.msgrcv(qid, ctypes.byref(m), 16, 0, 0o4000)
    print("got", m.mtext.decode() if n > 0 else n)
""",
    "posix-mq": """
try:
    mq_open = libc.mq_open  # glibc >= 2.34; before, in librt
except AttributeError:
    mq_open = ctypes.CDLL(ctypes.util.find_library("rt") or "librt.so.1").mq_open
name = b"/comlrl-%d" % KEY
fd = mq_open(name, 0o2 | (0o100 if MODE == "create" else 0), 0o600, None)
print("refused" if fd < 0 else "got", fd)
""",
    "posix-shm": """
from multiprocessing import shared_memory
try:
    m = shared_memory.SharedMemory("comlrl-%d" % KEY, create=MODE == "create", size=4096)
    if MODE == "create":
        m.buf[:10] = b"answers-42"
    print("got", bytes(m.buf[:10]).decode())
except OSError as exc:
    print("refused", type(exc).__name__)
""",
}


def _host_has_ipc(kind: str, key: int) -> bool:
    """Whether the object ``kind``/``key`` exists in the host's IPC namespace / /dev/shm."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(None, use_errno=True)
    if kind == "sysv-shm":
        shmid = libc.shmget(key, 0, 0)
        if shmid >= 0:
            libc.shmctl(shmid, 0, None)  # IPC_RMID: leave the host clean
        return shmid >= 0
    if kind == "sysv-sem":
        semid = libc.semget(key, 0, 0)
        if semid >= 0:
            libc.semctl(semid, 0, 0)
        return semid >= 0
    if kind == "sysv-msg":
        qid = libc.msgget(key, 0)
        if qid >= 0:
            libc.msgctl(qid, 0, None)
        return qid >= 0
    if kind == "posix-mq":
        rt = libc if hasattr(libc, "mq_open") else ctypes.CDLL(ctypes.util.find_library("rt"))
        name = b"/comlrl-%d" % key
        fd = rt.mq_open(name, 0o2, 0o600, None)
        if fd >= 0:
            rt.mq_unlink(name)
        return fd >= 0
    path = Path(f"/dev/shm/comlrl-{key}")
    found = path.exists()
    if found:
        path.unlink()
    return found


@pytest.mark.parametrize("kind", sorted(IPC_PROGRAMS))
def test_ipc_objects_do_not_outlive_a_run(run: Executor, kind: str) -> None:
    key = 0x5EED0000 + (os.getpid() * 131 + time.monotonic_ns()) % 0xFFFF
    made = run(_IPC_HEAD.format(key=key, mode="create") + IPC_PROGRAMS[kind], FAST)
    seen = run(_IPC_HEAD.format(key=key, mode="open") + IPC_PROGRAMS[kind], FAST)
    on_host = _host_has_ipc(kind, key)
    if not (made.isolation.get("mountns") or made.isolation.get("pidns")):
        pytest.skip("this OS allowed no namespaces; IPC is not isolated")
    assert made.isolation.get("ipcns"), made.isolation
    assert made.status == "ok" and seen.status == "ok", (made.stderr, seen.stderr)
    if kind != "posix-shm":  # control: the object could be made (and used) in its own run
        assert made.stdout.startswith("got"), made.stdout
    assert seen.stdout.startswith("refused"), (made.stdout, seen.stdout)
    assert not on_host, f"{kind} {key:#x} was left on the host"


# ------------------------------------------------- kernel state outside the namespaces
_KEYCTL = """
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
NR = {{"x86_64": (248, 250), "aarch64": (217, 219)}}[platform.machine()]  # add_key, keyctl
NAME = b"{name}"


def keyctl(*args):
    r = libc.syscall(NR[1], *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return r, ctypes.get_errno()


ring, err = keyctl(1, NAME)  # KEYCTL_JOIN_SESSION_KEYRING: join (or make) it by name
if ring < 0:
    print("refused", os.strerror(err))
elif "{mode}" == "store":
    keyctl(5, ring, 0x3F3F3F3F)  # KEYCTL_SETPERM: anyone may search and read it
    payload = b"def sq(x): return x * x"
    key = libc.syscall(NR[0], b"user", b"code", payload, len(payload), ctypes.c_long(ring))
    keyctl(8, ring, -4)  # KEYCTL_LINK into the user keyring: it outlives the run
    print("stored", key)
else:
    buf = ctypes.create_string_buffer(256)
    key = libc.syscall(NR[1], ctypes.c_long(10), ctypes.c_long(ring), b"user", b"code", 0)
    n, _ = keyctl(11, key, buf, 256)  # KEYCTL_SEARCH, KEYCTL_READ
    print("read", buf.raw[: max(n, 0)].decode(errors="replace"))
"""


def test_a_named_keyring_carries_nothing_to_a_later_run(executor_kind: str) -> None:
    limits = dataclasses.replace(FAST, executor=executor_kind)
    name = f"comlrl-shared-{os.getpid()}-{time.monotonic_ns()}"
    stored = run_python(_KEYCTL.format(name=name, mode="store"), limits)
    later = run_python(_KEYCTL.format(name=name, mode="read"), limits)
    assert stored.status == later.status == "ok", (stored.stderr, later.stderr)
    assert stored.stdout.startswith("refused") and "not permitted" in stored.stdout
    assert "def sq" not in later.stdout, later.stdout
    assert later.isolation.get("seccomp") is True


def test_a_run_leaves_no_key_in_the_host_kernel(executor_kind: str) -> None:
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for _ in range(50):\n"
        "    libc.syscall(248, b'user', b'pin', b'x' * 512, 512, ctypes.c_long(-4))\n"
    )
    res = run_python(code, dataclasses.replace(FAST, executor=executor_kind))
    assert res.status == "ok", res.stderr
    uid = res.isolation.get("uid")
    try:
        users = Path("/proc/key-users").read_text()
    except OSError:
        pytest.skip("no /proc/key-users here")
    held = [ln for ln in users.splitlines() if ln.split(":")[0].strip() == str(uid)]
    assert not held, f"the run's user id {uid} still holds keys: {held}"


_LOCK_SENDER = """
import fcntl, os, time
f = open(os.__file__, "rb")  # a file every run can open
fcntl.flock(f, fcntl.LOCK_SH)  # 'ready'
for bit in range(16):
    if {secret} >> bit & 1:
        fcntl.lockf(f, fcntl.LOCK_SH, 1, 100 + bit)  # F_SETLK on byte 100 + bit
time.sleep(2.5)
"""
_LOCK_RECEIVER = """
import errno, fcntl, os, struct, time


def held(f, start):
    probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, 1, 0)
    try:
        return struct.unpack("hhqqi", fcntl.fcntl(f, fcntl.F_GETLK, probe))[0] != fcntl.F_UNLCK
    except OSError:
        return False


f = open(os.__file__, "rb")
deadline = time.monotonic() + 2.0
while time.monotonic() < deadline:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(f, fcntl.LOCK_UN)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):  # another run holds it
            time.sleep(0.1)
            print("heard", sum(1 << b for b in range(16) if held(f, 100 + b)))
            break
    time.sleep(0.02)
else:
    print("heard nothing")
"""


def test_locks_on_shared_files_carry_nothing_between_concurrent_runs(executor_kind: str) -> None:
    limits = dataclasses.replace(FAST, executor=executor_kind)
    secret = 0xB1A5
    sender, receiver = run_many(
        [_LOCK_SENDER.format(secret=secret), _LOCK_RECEIVER], limits, max_workers=2
    )
    assert sender.status == receiver.status == "ok", (sender.stderr, receiver.stderr)
    assert receiver.stdout.strip() == "heard nothing", receiver.stdout


def test_change_notifications_on_shared_files_are_refused(run: Executor) -> None:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.inotify_init1(0)\n"
        "print('refused' if fd < 0 else 'watching', os.strerror(ctypes.get_errno()))\n"
    )
    res = run(code, FAST)
    assert res.status == "ok" and res.stdout.startswith("refused"), res.stdout


def test_without_the_filter_keyrings_are_reachable_and_it_is_said(run: Executor) -> None:
    res = run(_KEYCTL.format(name="comlrl-optout", mode="read"), replace_filter(FAST))
    assert res.isolation.get("seccomp") is False
    assert "refused" not in res.stdout, res.stdout


def replace_filter(limits: SandboxLimits) -> SandboxLimits:
    return dataclasses.replace(limits, syscall_filter=False)


# ---------------------------------------------------------------- limits per run
_HOG = """
import os, select, time
r, w = os.pipe()
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:  # each child holds what its own address-space limit lets it hold
        os.close(r)
        held = []
        try:
            while True:
                block = bytearray(8 * 1024 * 1024)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                held.append(block)
        except MemoryError:
            pass
        os.write(w, b"%d %d\\n" % (os.getpid(), 8 * len(held)))
        time.sleep(6)
        os._exit(0)
    kids.append(pid)
os.close(w)
reports, data, deadline = {}, b"", time.monotonic() + 12
while len(reports) < 4 and time.monotonic() < deadline:
    if select.select([r], [], [], 0.2)[0]:
        chunk = os.read(r, 256)
        if not chunk:
            break
        data += chunk
        reports = dict(map(int, ln.split()) for ln in data.decode().splitlines())
alive = [pid for pid in kids if os.waitpid(pid, os.WNOHANG) == (0, 0)]
print("held", sum(reports.get(pid, 0) for pid in alive), "MiB at once")
"""


def _held_mib(stdout: str) -> int:
    words = stdout.split()
    return int(words[1]) if len(words) > 1 and words[0] == "held" else 0


def test_memory_of_a_run_of_several_processes_is_bounded_as_a_whole(executor_kind: str) -> None:
    # memory_mb=128: four processes of one run cannot hold more than that together.
    limits = SandboxLimits(timeout_s=30.0, memory_mb=128, executor=executor_kind)
    res = run_python(_HOG, limits)
    assert _held_mib(res.stdout) <= 128, (res.status, res.stdout, res.isolation)
    if res.isolation.get("accounting") == "single_process":
        assert res.error_type == "BlockingIOError", res.stderr[-300:]


_BURNERS = """
import os, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        burn(1.5)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("finished")
"""


@pytest.mark.slow
def test_cpu_time_of_a_run_of_several_processes_is_bounded_as_a_whole(executor_kind: str) -> None:
    # 3 x 1.5 CPU seconds, each under a per-process limit of 2: only a limit on the whole
    # run stops it.
    res = run_python(_BURNERS, SandboxLimits(timeout_s=60.0, cpu_s=2, executor=executor_kind))
    assert "finished" not in res.stdout, (res.status, res.isolation)
    assert res.status in ("killed", "error"), res.status


@pytest.mark.parametrize("program", [_HOG, _BURNERS], ids=["memory", "cpu"])
def test_single_process_fallback_bounds_the_run_and_says_so(
    executor_kind: str, program: str
) -> None:
    limits = SandboxLimits(
        timeout_s=20.0, memory_mb=128, cpu_s=2, executor=executor_kind, accounting="single_process"
    )
    res = run_python(program, limits)
    assert res.isolation.get("accounting") == "single_process", res.isolation
    assert res.error_type == "BlockingIOError", (res.status, res.stderr[-300:])
    threads = run_python(
        "import threading\nt = threading.Thread(target=print, args=('thread ran',))\n"
        "t.start(); t.join()\n",
        limits,
    )
    assert threads.stdout == "thread ran\n", threads.stderr


def test_the_active_accounting_is_reported() -> None:
    from comlrl.envs.sandbox.run_limits import run_accounting

    acc = run_accounting()
    res = run_python("pass", FAST)
    assert res.isolation.get("accounting") == acc.kind
    assert acc.kind in acc.describe() or "fallback" in acc.describe()
    if acc.kind != "single_process":
        assert res.isolation.get("run_cpu_s", -1) >= 0


# ------------------------------------------------------------------------- pool
def test_run_many_keeps_order_and_runs_in_parallel(executor_kind: str) -> None:
    codes = [f"import time; time.sleep(0.4); print({i})" for i in range(8)]
    # Start the 8 fork servers first: this measures parallelism, not their one-time start-up.
    run_many(["pass"] * 8, dataclasses.replace(FAST, executor=executor_kind), max_workers=8)
    start = time.perf_counter()
    results = run_many(codes, dataclasses.replace(FAST, executor=executor_kind), max_workers=8)
    elapsed = time.perf_counter() - start
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    assert elapsed < 0.4 * 8 / 2, f"8 sleeping programs on 8 workers took {elapsed:.2f}s"


def test_closed_pool_refuses_work() -> None:
    pool = SandboxPool(1)
    pool.close()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.run_many(["pass"])


@pytest.mark.parametrize(
    "bad",
    [{"timeout_s": 0}, {"memory_mb": -1}, {"max_output_bytes": -5}, {"executor": "spawn"}],
)
def test_invalid_limits_are_rejected(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SandboxLimits(**bad)  # type: ignore[arg-type]


def test_non_string_code_is_rejected() -> None:
    with pytest.raises(TypeError):
        run_python(b"print(1)")  # type: ignore[arg-type]
