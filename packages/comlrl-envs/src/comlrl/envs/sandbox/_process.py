"""Trainer-side process plumbing shared by both executors.

What an executor needs once it has a child running the sandbox runner: a typed handle on
that child (:class:`ChildHandle`), the group kill and the reaping that leaves no zombie
behind (:func:`kill_group`, :func:`reap_group`), the per-run directory
(:func:`make_run_dir`), the runner's instructions (:func:`runner_config`) and the loop
that collects output and enforces the wall clock (:func:`drive`).

Nothing here imports an executor, so :mod:`~comlrl.envs.sandbox.executor` and
:mod:`~comlrl.envs.sandbox.fork_executor` both import this module and never each other's
private names.
"""

from __future__ import annotations

import json
import marshal
import os
import selectors
import signal
import site
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from comlrl.envs.sandbox.limits import ExecutionResult, ExecutionStatus, SandboxLimits
from comlrl.envs.sandbox.run_limits import RunGroup
from comlrl.envs.sandbox.syscall_filter import shared_state_filter, single_process_filter

RUNNER = str(Path(__file__).with_name("_runner.py"))
RESULT_CAP = 1 << 20  # bytes accepted on the result channel
EXIT_GRACE_S = 0.5  # how long pipes may stay open after the program itself exited
REAP_WAIT_S = 2.0  # how long reap_group waits for killed group members to die


class ChildHandle(Protocol):
    """A started sandbox runner as :func:`drive` sees it.

    Attributes:
        exit_fd: a descriptor that becomes readable when there may be news of the
            child's exit, or ``None`` when exit must be polled.
        lost_reason: why the exit status is unknown, once it is (else ``None``).
    """

    lost_reason: str | None

    @property
    def exit_fd(self) -> int | None: ...

    def poll_exited(self) -> bool:
        """Whether the child has exited (without reaping it)."""
        ...

    def kill_group(self) -> None:
        """``SIGKILL`` the child's whole process group."""
        ...

    def wait(self) -> int | None:
        """Reap the child (and what it left); its return code, ``None`` when unknown."""
        ...


def scrubbed_env(workdir: str) -> dict[str, str]:
    """The whole environment a sandboxed program gets (``HOME``/``TMPDIR`` = its work dir)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
    }


def kill_group(pgid: int) -> None:
    """``SIGKILL`` process group ``pgid``; quietly nothing when it is already gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def has_exited(pid: int) -> bool:
    """True once ``pid`` has exited, without reaping it (so its pgid stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def reap_group(pgid: int, wait_s: float = REAP_WAIT_S) -> int:
    """Reap every child of this process still in process group ``pgid``; how many.

    Needed when this process is PID 1 of its PID namespace (a container without an
    init): a sandbox process whose parent died first (the runner is killed together with
    its group) is re-parented to PID 1, i.e. to us, and would stay a zombie. Call it after
    :func:`kill_group` and after the group leader was reaped. Returns at once when there
    is no such child (the usual case); otherwise waits up to ``wait_s`` seconds for the
    killed members to die.
    """
    reaped = 0
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid:
            reaped += 1
            continue
        if time.monotonic() > deadline:
            return reaped
        time.sleep(0.001)


def make_run_dir() -> tuple[str, str]:
    """A fresh private run directory and the program's work directory inside it.

    Returns ``(run_dir, workdir)``; the caller removes ``run_dir`` when the run is over.
    The runner mounts the program's new root on ``run_dir/root`` (isolated filesystem).
    """
    run_dir = tempfile.mkdtemp(prefix="comlrl-sandbox-")
    workdir = os.path.join(run_dir, "work")
    os.mkdir(workdir, 0o700)
    return run_dir, workdir


_MASKED: tuple[str, ...] | None = None


def package_dirs() -> tuple[str, ...]:
    """Host directories holding installed Python packages (hidden from programs).

    The runner binds the interpreter's standard library into the program's root; a
    ``site-packages`` inside it (and any other package directory of this interpreter) is
    covered by an empty read-only mount, so the trainer's packages stay out of sight.
    """
    global _MASKED
    if _MASKED is None:
        dirs: set[str] = set()
        try:
            dirs.update(site.getsitepackages())
        except AttributeError:
            pass
        try:
            dirs.add(site.getusersitepackages())
        except AttributeError:
            pass
        dirs.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
        _MASKED = tuple(sorted(os.path.realpath(d) for d in dirs if d and os.path.isdir(d)))
    return _MASKED


def runner_config(
    limits: SandboxLimits, run_dir: str, workdir: str, group: RunGroup | None
) -> dict[str, Any]:
    """The limits and isolation settings part of the runner's instructions.

    ``group``: the run's cgroup (the runner joins it first), or ``None`` for the
    single-process fallback (the runner then refuses new processes to the program).

    Raises:
        SandboxUnavailableError: a seccomp filter is needed and libseccomp is missing.
    """
    return {
        "seccomp": shared_state_filter() if limits.syscall_filter else None,
        "cgroup_procs": group.procs_files if group is not None else [],
        "single_process_bpf": single_process_filter() if group is None else None,
        "allow_network": limits.allow_network,
        "pid_namespace": limits.pid_namespace,
        "filesystem": limits.filesystem,
        "run_dir": run_dir,
        "workdir": workdir,
        "readonly_paths": list(limits.readonly_paths),
        "mask_paths": list(package_dirs()),
        "limits": {
            "cpu_s": limits.effective_cpu_s(),
            "memory_mb": limits.memory_mb,
            "file_size_mb": limits.file_size_mb,
            "max_processes": limits.max_processes,
        },
    }


SECRET_KEYS = ("nonce", "plan", "arg_name", "assert_timeout_s", "entry_label")
"""Instruction fields the runner reads only after a check run's candidate process forked."""


def encode_instructions(cfg: dict[str, Any]) -> bytes:
    """The runner's stdin: two ``marshal`` documents, the first length-prefixed.

    The first holds what the candidate's process may see (program, limits, work dir);
    the second (:data:`SECRET_KEYS`: the nonce and the test plan) is read by the runner
    only after it forked the candidate's process in check mode, so the program never has
    them in its memory (see ``_runner_check.py``).
    """
    public = {k: v for k, v in cfg.items() if k not in SECRET_KEYS}
    first = marshal.dumps(public)
    second = marshal.dumps({k: cfg[k] for k in SECRET_KEYS if k in cfg})
    return len(first).to_bytes(8, "big") + first + second


def parse_records(raw: bytes, nonce: str) -> tuple[list[dict[str, Any]], bool]:
    """The nonce-tagged JSON records of the result channel, and whether it was tampered."""
    records: list[dict[str, Any]] = []
    tampered = False
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            tampered = True
            continue
        if not isinstance(rec, dict) or rec.get("nonce") != nonce:
            tampered = True
            continue
        rec.pop("nonce")
        records.append(rec)
    kinds = [r.get("kind") for r in records]
    if kinds.count("isolation") > 1 or len(kinds) - kinds.count("isolation") > 1:
        tampered = True
    return records, tampered


def drive(
    child: ChildHandle,
    out_fd: int,
    err_fd: int,
    read_fd: int,
    nonce: str,
    limits: SandboxLimits,
    start: float,
    group: RunGroup | None = None,
) -> ExecutionResult:
    """Collect a started child's output and result channel until it ends or times out.

    Reads stdout/stderr (each capped at ``limits.max_output_bytes``) and the result pipe
    until all three close or the wall clock (``start + limits.timeout_s``, seconds on
    ``time.perf_counter``) runs out; then kills the child's group and reaps it
    (``child.wait()``). With the run's cgroup ``group``, also kills the whole run once its
    CPU time passes ``limits.effective_cpu_s()`` and reports how it ended
    (:func:`finish_run`). Used by both executors.
    """
    deadline = start + limits.timeout_s
    caps = {out_fd: limits.max_output_bytes, err_fd: limits.max_output_bytes, read_fd: RESULT_CAP}
    bufs: dict[int, bytearray] = {fd: bytearray() for fd in caps}
    truncated = {fd: False for fd in caps}
    timed_out = False
    group_killed = False
    exited_early = False
    open_fds = set(caps)
    cpu_limit = limits.effective_cpu_s()
    with selectors.DefaultSelector() as sel:
        for fd in caps:
            sel.register(fd, selectors.EVENT_READ)
        exit_fd = child.exit_fd
        if exit_fd is not None:
            sel.register(exit_fd, selectors.EVENT_READ, "exit")
        while open_fds:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                timed_out = not exited_early
                break
            for key, _ in sel.select(timeout=min(remaining, 0.05)):
                fd = key.fd
                if key.data == "exit":
                    continue  # handled by poll_exited() below
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                room = caps[fd] - len(bufs[fd])
                if room > 0:
                    bufs[fd] += chunk[:room]
                if len(chunk) > room:
                    truncated[fd] = True
            if not group_killed and child.poll_exited():
                # The program is done; whatever it left in its group must not hold our
                # pipes open (or keep running). Pipe contents already written survive.
                child.kill_group()
                group_killed = True
                # Without a PID namespace a setsid() escapee may still hold the pipes;
                # read for a short grace period, then stop waiting for it.
                deadline = min(deadline, time.perf_counter() + EXIT_GRACE_S)
                exited_early = True
            if exit_fd is not None and child.exit_fd is None:
                sel.unregister(exit_fd)  # exit reported (or the channel is gone)
                exit_fd = None
            if group is not None and not group.cpu_exceeded and group.cpu_seconds() > cpu_limit:
                group.cpu_exceeded = True  # the run's processes together: all of them go
                group.kill()
    child.kill_group()
    if group is not None:
        group.kill()
    rc = child.wait()
    duration = time.perf_counter() - start
    if timed_out or exited_early:
        # Drain what the (now dead) group left in the pipes, without blocking.
        for fd in caps:
            os.set_blocking(fd, False)
            try:
                while len(bufs[fd]) < caps[fd]:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    bufs[fd] += chunk[: caps[fd] - len(bufs[fd])]
            except (BlockingIOError, OSError):
                pass
    result = _result(
        child, rc, bufs, truncated, out_fd, err_fd, read_fd, nonce, timed_out, duration
    )
    return finish_run(result, group, limits)


def finish_run(
    result: ExecutionResult, group: RunGroup | None, limits: SandboxLimits
) -> ExecutionResult:
    """Record the run's accounting unit in ``result.isolation`` and how the run's limits
    ended it (``"killed"``: ``MemoryError`` for an out-of-memory kill of its cgroup,
    ``CPUTimeLimit`` past its CPU seconds)."""
    if not result.isolation:
        return result
    result.isolation["accounting"] = group.kind if group is not None else "single_process"
    if group is None:
        return result
    result.isolation["run_cpu_s"] = round(group.cpu_seconds(), 3)
    if group.oom_killed() and result.status != "timeout":
        result.status = "killed"
        result.error_type = "MemoryError"
        result.error = f"the run went over memory_mb={limits.memory_mb} (its cgroup killed it)"
    elif group.cpu_exceeded and result.status != "timeout":
        result.status = "killed"
        result.error_type = "CPUTimeLimit"
        result.error = (
            f"the run's processes used more than {limits.effective_cpu_s()} CPU seconds together"
        )
    return result


def _result(
    child: ChildHandle,
    rc: int | None,
    bufs: dict[int, bytearray],
    truncated: dict[int, bool],
    out_fd: int,
    err_fd: int,
    read_fd: int,
    nonce: str,
    timed_out: bool,
    duration: float,
) -> ExecutionResult:
    records, tampered = parse_records(bytes(bufs[read_fd]), nonce)
    isolation: dict[str, Any] = {}
    error_type = error = None
    syntax = False
    for rec in records:
        kind = rec.pop("kind", None)
        if kind == "isolation":
            isolation = dict(rec)
        elif kind == "syntax_error":
            syntax = True
            error_type, error = "SyntaxError", rec.get("error")
        elif kind == "exception":
            error_type, error = rec.get("error_type"), rec.get("error")
        if kind is not None:
            rec["kind"] = kind
    status: ExecutionStatus
    if timed_out:
        status = "timeout"
    elif syntax and not tampered:
        status = "syntax_error"
    elif rc is None:
        # The exit status was lost (fork executor: the fork server died during the run).
        status = "killed"
        error_type = error_type or "SandboxError"
        error = error or child.lost_reason or "exit status unknown"
    elif rc == 0:
        status = "ok"
    elif rc < 0:
        status = "killed"
        error_type = error_type or "Signal"
        try:
            error = error or f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            error = error or f"killed by signal {-rc}"
    else:
        status = "error"
    return ExecutionResult(
        status=status,
        returncode=rc,
        stdout=bytes(bufs[out_fd]).decode("utf-8", "replace"),
        stderr=bytes(bufs[err_fd]).decode("utf-8", "replace"),
        duration_s=duration,
        stdout_truncated=truncated[out_fd],
        stderr_truncated=truncated[err_fd],
        error_type=error_type,
        error=error,
        isolation=isolation,
        records=records,
        tampered=tampered,
    )
