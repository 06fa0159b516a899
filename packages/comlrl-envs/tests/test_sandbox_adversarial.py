"""Adversarial conformance suite: a program that attacks the host, on both executors.

Covers the filesystem (reading and writing outside the work dir: ``/etc/passwd``, the
checkout, ``$HOME``, the host's ``/tmp``; symlink and ``/proc/self/root`` tricks;
deleting files in the checkout; undoing the read-only mounts), privileges, descriptors
inherited from the trainer, and processes (leftovers after timeouts and kills,
``setsid`` daemons, a trainer that is PID 1 of its PID namespace, zombies).

Runs as whoever runs pytest; when that is root, :func:`test_suite_passes_as_a_non_root_user`
runs this file again as ``nobody`` (``setpriv``), so both paths are checked: root
(programs get a user id of their own) and non-root (a user namespace).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from comlrl.envs.sandbox import SandboxLimits, run_python

if TYPE_CHECKING:
    from conftest import Beacon

HERE = Path(__file__).resolve()
CHECKOUT = HERE.parents[3]
LIMITS = SandboxLimits(timeout_s=10.0)


@pytest.fixture(params=["fork", "exec"])
def limits(request: pytest.FixtureRequest) -> SandboxLimits:
    return dataclasses.replace(LIMITS, executor=request.param)


def _run(code: str, limits: SandboxLimits) -> dict:
    """Run ``code`` (which prints one JSON line last) and return what it printed."""
    res = run_python(textwrap.dedent(code), limits)
    assert res.status == "ok", (res.status, res.stderr[-2000:])
    assert res.isolation.get("filesystem") == "isolated" and res.isolation.get("mountns")
    return json.loads(res.stdout.strip().splitlines()[-1])


_TRY = """
import json, os
def attempt(fn, *args):
    try:
        out = fn(*args)
        return "ok:" + (out[:40] if isinstance(out, str) else repr(out)[:40])
    except BaseException as exc:
        return type(exc).__name__
def read(path):
    with open(path) as fh:
        return fh.read()
def write(path):
    with open(path, "w") as fh:
        fh.write("pwned")
    return "written"
"""


# ------------------------------------------------------------------- filesystem
def test_host_files_cannot_be_read(limits: SandboxLimits, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    home = Path.home() / ".bashrc"
    targets = [
        "/etc/passwd",
        "/etc/shadow",
        str(HERE),  # the checkout
        str(CHECKOUT / "pyproject.toml"),
        str(home),
        str(secret),  # the host's /tmp
        "/proc/self/root/etc/passwd",
        "/proc/1/root/etc/passwd",
        "/proc/self/environ",
    ]
    seen = _run(_TRY + f"print(json.dumps({{t: attempt(read, t) for t in {targets!r}}}))", limits)
    assert Path("/etc/passwd").read_text(), "control: the host file is readable here"
    leaked = {t: r for t, r in seen.items() if r.startswith("ok")}
    assert leaked == {}, leaked
    listing = _run("import os, json\nprint(json.dumps(sorted(os.listdir('/'))))", limits)
    assert set(listing) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "sbin"} | {
        "tmp",
        "usr",
        *(p.split("/")[1] for p in (sys.executable, sys.base_prefix, str(CHECKOUT))),
    }, listing
    assert "proc" not in listing and "home" not in listing


def test_host_locations_cannot_be_written(limits: SandboxLimits, tmp_path: Path) -> None:
    token = secrets.token_hex(4)
    targets = {
        "checkout": str(CHECKOUT / f"pwned-{token}"),
        "home": str(Path.home() / f"pwned-{token}"),
        "host_tmp": f"/tmp/pwned-{token}",
        "test_tmp": str(tmp_path / "pwned"),
        "stdlib": os.path.join(os.path.dirname(os.__file__), f"pwned-{token}.py"),
        "root": f"/pwned-{token}",
    }
    seen = _run(
        _TRY
        + f"""
targets = {targets!r}
out = {{k: attempt(write, v) for k, v in targets.items()}}
out["private_tmp"] = attempt(write, "/tmp/scratch-{token}")
out["workdir"] = attempt(write, "scratch.txt")
print(json.dumps(out))
""",
        limits,
    )
    assert seen.pop("workdir") == "ok:written" and seen.pop("private_tmp") == "ok:written"
    for name, path in targets.items():
        assert not os.path.lexists(path), f"{name}: the program created {path}"
    # writing the host's /tmp path only ever reached the sandbox's private /tmp
    assert not Path(f"/tmp/scratch-{token}").exists()
    assert seen.pop("host_tmp") == "ok:written", "the private /tmp takes host /tmp paths"
    assert not any(v.startswith("ok") for v in seen.values()), seen


def test_checkout_files_cannot_be_deleted(limits: SandboxLimits) -> None:
    if not os.access(HERE.parent, os.W_OK):
        pytest.skip("this user cannot write the checkout itself: nothing to protect here")
    canary = HERE.parent / f".canary-{secrets.token_hex(4)}"
    canary.write_text("still here")
    try:
        seen = _run(
            _TRY
            + f"""
import shutil
print(json.dumps({{
    "remove": attempt(os.remove, {str(canary)!r}),
    "rmtree": attempt(shutil.rmtree, {str(HERE.parent)!r}),
    "rename": attempt(os.rename, {str(canary)!r}, "stolen"),
}}))
""",
            limits,
        )
        assert canary.read_text() == "still here", seen
        assert not any(v.startswith("ok") for v in seen.values()), seen
    finally:
        canary.unlink()


def test_symlinks_planted_in_the_workdir_do_not_reach_the_host(
    limits: SandboxLimits, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep me")
    seen = _run(
        _TRY
        + f"""
os.symlink("/etc/passwd", "passwd")
os.symlink({str(victim)!r}, "victim")
os.symlink("/", "hostroot")
print(json.dumps({{
    "passwd": attempt(read, "passwd"),
    "victim": attempt(os.listdir, "victim"),
    "via_root": attempt(read, "hostroot/etc/passwd"),
    "link_write": attempt(write, "victim/evil.txt"),
}}))
""",
        limits,
    )
    assert not any(v.startswith("ok") for v in seen.values()), seen
    # The trainer deletes the work dir afterwards; it must not follow the planted links.
    assert (victim / "keep.txt").read_text() == "keep me"
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]


def test_read_only_mounts_cannot_be_undone(limits: SandboxLimits) -> None:
    stdlib = os.path.dirname(os.__file__)
    seen = _run(
        _TRY
        + f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def mount(src, dst, fstype, flags):
    rc = libc.mount(src, dst.encode(), fstype, ctypes.c_ulong(flags), None)
    return "rc=%d errno=%d" % (rc, ctypes.get_errno()) if rc else "mounted"
out = {{}}
out["remount_rw"] = mount(None, {stdlib!r}, None, 32 | 4096)
out["tmpfs_over_root"] = mount(b"tmpfs", "/usr", b"tmpfs", 0)
out["chroot"] = attempt(os.chroot, "/tmp")
out["setuid0"] = attempt(os.setuid, 0)
# a new user namespace gives capabilities there, but our mounts stay locked read-only
if libc.unshare(0x10000000 | 0x00020000) == 0:
    out["userns_remount_rw"] = mount(None, {stdlib!r}, None, 32 | 4096)
out["write_stdlib"] = attempt(write, {stdlib!r} + "/pwned.py")
print(json.dumps(out))
""",
        limits,
    )
    assert "mounted" not in seen.values(), seen
    assert not any(str(v).startswith("ok") for v in seen.values()), seen
    assert not Path(stdlib, "pwned.py").exists()


def test_program_has_no_privileges(limits: SandboxLimits) -> None:
    res = run_python("pass", limits)
    iso = res.isolation
    assert iso["capabilities"] == 0, iso
    if os.geteuid() == 0:
        assert iso["uid"] != 0 and not iso["userns"], "a root trainer's program must not be root"
    else:
        assert iso["userns"] and iso["uid"] == os.geteuid()


def test_no_descriptor_of_the_trainer_is_inherited(limits: SandboxLimits, tmp_path: Path) -> None:
    leak = open(tmp_path / "leak.txt", "w")  # noqa: SIM115 - held open during the run
    os.set_inheritable(leak.fileno(), True)
    try:
        seen = _run(
            """
            import json, os, stat
            fds = {}
            for fd in range(0, 1024):
                try:
                    st = os.fstat(fd)
                except OSError:
                    continue
                fds[fd] = [st.st_dev, st.st_ino, stat.S_ISFIFO(st.st_mode)]
            print(json.dumps(fds))
            """,
            limits,
        )
    finally:
        leak.close()
    st = os.stat(tmp_path / "leak.txt")
    assert [st.st_dev, st.st_ino, False] not in seen.values()
    extra = {int(fd): v for fd, v in seen.items() if int(fd) > 2}
    # only the result channel (a pipe) besides stdin/stdout/stderr
    assert len(extra) <= 1 and all(v[2] for v in extra.values()), seen


def test_refuses_to_run_when_the_new_root_cannot_be_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from comlrl.envs.sandbox import SandboxUnavailableError, _process

    real = _process.runner_config

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        cfg = real(*args, **kwargs)
        # a regular file where the new root's directory must go: building it fails
        cfg["run_dir"] = str(HERE)
        return cfg

    monkeypatch.setattr(_process, "runner_config", broken)
    from comlrl.envs.sandbox import executor, fork_executor

    monkeypatch.setattr(executor, "runner_config", broken)
    monkeypatch.setattr(fork_executor, "runner_config", broken)
    for kind in ("fork", "exec"):
        with pytest.raises(SandboxUnavailableError, match="filesystem='host'"):
            run_python("print('ran')", dataclasses.replace(LIMITS, executor=kind))


# -------------------------------------------------------------------- processes
@pytest.mark.parametrize("pidns", [True, False], ids=["pidns", "no-pidns"])
def test_setsid_daemons_do_not_survive(
    limits: SandboxLimits, beacon: Beacon, pidns: bool, needs_processes: None
) -> None:
    if not pidns and limits.executor == "exec" and os.geteuid() != 0:
        pytest.skip(
            "exec executor without a PID namespace under a non-root trainer: the program "
            "has no user id of its own to sweep, so a setsid() daemon can outlive the run"
        )
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        {beacon.code}
        print("daemon up", flush=True)
        while True:
            time.sleep(0.05)
    os._exit(0)
time.sleep(0.3)
"""
    res = run_python(code, dataclasses.replace(limits, pid_namespace=pidns))
    assert "daemon up" in res.stdout, "the daemon never ran; the test would pass vacuously"
    assert beacon.wait_gone() == [], "a setsid() daemon outlived the program"


@pytest.mark.parametrize("how", ["timeout", "cpu-kill"])
def test_nothing_is_left_after_timeouts_and_kills(
    limits: SandboxLimits, beacon: Beacon, how: str, needs_processes: None
) -> None:
    code = f"""
import os, time
for _ in range(3):
    if os.fork() == 0:
        {beacon.code}
        print("up", flush=True)
        while True:
            time.sleep(0.05)
time.sleep(0.2)
while True:
    pass
"""
    lim = dataclasses.replace(limits, timeout_s=1.5 if how == "timeout" else 20.0, cpu_s=1)
    if how == "timeout":
        lim = dataclasses.replace(lim, cpu_s=30)
    res = run_python(code, lim)
    assert res.status == ("timeout" if how == "timeout" else "killed"), res
    assert "up" in res.stdout
    assert beacon.wait_gone() == []


_PID1_SCRIPT = """
import json, os, sys
from comlrl.envs.sandbox import SandboxLimits, SandboxPool, shutdown_fork_servers
assert os.getpid() == 1, os.getpid()
n, kinds = int(sys.argv[1]), sys.argv[2].split(",")
prog = "import os, time\\nif os.fork() == 0:\\n    time.sleep(60)\\ntime.sleep(60)\\n"
statuses = {}
with SandboxPool(8) as pool:
    for kind in kinds:
        for pidns in (True, False):
            lim = SandboxLimits(timeout_s=0.05, executor=kind, pid_namespace=pidns)
            res = pool.run_many([prog] * (n // 2), lim)
            for r in res:
                statuses[r.status] = statuses.get(r.status, 0) + 1
shutdown_fork_servers()
zombies, alive = [], []
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != 1:
        try:
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        (zombies if state == "Z" else alive).append(int(entry))
print(json.dumps({"statuses": statuses, "zombies": zombies, "alive": alive}))
"""


def _as_pid1(n: int, kinds: str) -> dict:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux `unshare` is not installed")
    cmd = [unshare, "--pid", "--fork", "--mount-proc"]
    if os.geteuid() != 0:
        cmd[1:1] = ["--map-root-user"]
    proc = subprocess.run(
        [*cmd, sys.executable, "-c", _PID1_SCRIPT, str(n), kinds],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 and "unshare failed" in proc.stderr:
        pytest.skip(f"this OS refuses a PID namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["fork", "exec"])
def test_pid1_trainer_keeps_no_zombies_after_timeouts(kind: str) -> None:
    out = _as_pid1(40, kind)
    assert out["statuses"] == {"timeout": 40}, out
    assert out["zombies"] == [] and out["alive"] == [], out


@pytest.mark.slow
def test_pid1_trainer_keeps_no_zombies_after_1000_timeouts() -> None:
    out = _as_pid1(1000, "fork")
    assert out["statuses"] == {"timeout": 1000}, out
    assert out["zombies"] == [] and out["alive"] == [], out


# ------------------------------------------------------------------- non-root
def test_suite_passes_as_a_non_root_user() -> None:
    if os.geteuid() != 0:
        pytest.skip("already running as a non-root user (this run is that check)")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("util-linux `setpriv` is not installed; cannot switch to a non-root user")
    as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run(
        [
            *as_nobody,
            sys.executable,
            "-c",
            "import subprocess, sys, comlrl.envs.sandbox\n"
            "subprocess.run([sys.executable, '-I', '-S', '-c', 'pass'], check=True)",
        ],
        capture_output=True,
        text=True,
        cwd="/",
    )
    if probe.returncode != 0:
        pytest.skip(
            f"user nobody cannot run this interpreter ({sys.executable}, e.g. it lives under "
            f"a private home directory): {probe.stderr.strip()[-300:]}"
        )
    userns = subprocess.run([*as_nobody, "unshare", "-Ur", "true"], capture_output=True)
    if userns.returncode != 0:
        pytest.skip("unprivileged user namespaces are disabled: a non-root trainer is refused")
    basetemp = f"/tmp/comlrl-nobody-{secrets.token_hex(4)}"
    try:
        proc = subprocess.run(
            [*as_nobody, sys.executable, "-m", "pytest", str(HERE), "-q"]
            + ["-p", "no:cacheprovider", "-m", "not slow", "--basetemp", basetemp],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=600,
        )
    finally:
        shutil.rmtree(basetemp, ignore_errors=True)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail


def test_work_directory_is_size_capped(limits: SandboxLimits) -> None:
    # 750 files of 4 MiB (3 GB) would have been host disk (or page cache) outside the
    # memory limit; the work directory is a tmpfs of file_size_mb, so writing stops.
    code = """
import os
n = 0
try:
    for i in range(750):
        with open(f"f{i}", "wb") as fh:
            fh.write(b"x" * (4 << 20))
        n += 1
except OSError as exc:
    print("stopped", n, exc.errno)
"""
    res = run_python(code, dataclasses.replace(limits, file_size_mb=8))
    assert res.status == "ok", res
    words = res.stdout.split()
    assert words[0] == "stopped" and int(words[1]) <= 2, res.stdout
    assert int(words[2]) in (28, 27)  # ENOSPC (or EFBIG)
