"""Run untrusted Python in a resource-limited child process.

Model-written code never runs in the trainer's process. Each program gets a child
process of its own, made one of two ways (``SandboxLimits.executor``):

- ``"fork"`` (default): a long-lived *zygote* (``sys.executable -I -S -B _runner.py
  --zygote``, scrubbed environment, its own session, started once per concurrent
  caller and reused) forks a fresh child per program; see
  :mod:`comlrl.envs.sandbox.zygote`. Saves the interpreter start-up per program. Falls
  back to ``"exec"`` when a zygote cannot be used on this platform.
- ``"exec"``: :func:`run_python` starts ``sys.executable -I -S -B`` on the child-side
  runner (``_runner.py``) per program.

Either way the child applies the same per-program isolation before the program runs:

- its own session and process group (``setsid``); on timeout, and after the program
  exits, ``SIGKILL`` goes to the whole group;
- new network and PID namespaces where the kernel permits ``unshare(2)`` (root or
  unprivileged user namespaces); in a PID namespace the program runs under a minimal
  init, so every process it started dies with it, even ones that left the process group
  with ``setsid()``;
- rlimits: ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``,
  ``RLIMIT_CORE=0`` (``RLIMIT_NPROC`` counts per user and is ignored for root);
- a fresh temporary working directory, deleted afterwards;
- a scrubbed environment (``PATH``, ``LANG``, ``HOME``/``TMPDIR`` = the work dir);
- stdin replaced by ``/dev/null`` once the runner has read its instructions;
- stdout and stderr captured up to ``max_output_bytes`` each (the rest is read and
  dropped, so a chatty program cannot block or exhaust memory).

The runner reports through a separate pipe with a per-run random nonce; see
:mod:`comlrl.envs.sandbox.harness` for how test verdicts use that channel.
``ExecutionResult.isolation["executor"]`` says which executor ran the program.

Known differences of ``"fork"`` (none weakens the limits above): the children of one
zygote share its string-hash seed and address-space layout (``"exec"`` gets fresh ones
per program), see the zygote's extra stdlib modules already in ``sys.modules``, and end
without the interpreter's final teardown of inherited modules (so ``__del__`` of objects
that outlive the program's globals, e.g. stored in a module, is not called).
"""

from __future__ import annotations

import json
import marshal
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["SandboxLimits", "ExecutionResult", "ExecutionStatus", "run_python"]

ExecutionStatus = Literal["ok", "error", "syntax_error", "timeout", "killed", "failed_to_start"]
ExecutorKind = Literal["fork", "exec"]
_EXECUTORS = ("fork", "exec")

_RUNNER = str(Path(__file__).with_name("_runner.py"))
_RESULT_CAP = 1 << 20  # bytes accepted on the result channel
_EXIT_GRACE_S = 0.5  # how long pipes may stay open after the program itself exited


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits for one sandboxed program.

    Attributes:
        timeout_s: wall-clock limit in seconds; past it the process group is killed.
        cpu_s: CPU-time limit in seconds (``RLIMIT_CPU``, soft = hard: SIGKILL). ``None``
            means ``ceil(timeout_s) + 1``.
        memory_mb: address-space limit in MiB (``RLIMIT_AS``); ``None`` for none.
        file_size_mb: largest file the program may write, MiB (``RLIMIT_FSIZE``).
        max_processes: ``RLIMIT_NPROC`` (per real user; not enforced for root, where the
            PID namespace and the group kill are what contain fork bombs).
        max_output_bytes: bytes of stdout and of stderr kept (each); the rest is dropped.
        allow_network: ``False`` puts the program in an empty network namespace when the
            OS allows it (see :attr:`ExecutionResult.isolation` for what was achieved).
        pid_namespace: run the program in a new PID namespace (under a minimal init) when
            the OS allows it.
        executor: ``"fork"`` forks each program from a pre-started zygote process (falls
            back to ``"exec"`` where that is not possible); ``"exec"`` starts a new
            interpreter per program. Same isolation per program, see the module docs.
    """

    timeout_s: float = 10.0
    cpu_s: float | None = None
    memory_mb: int | None = 1024
    file_size_mb: int | None = 16
    max_processes: int | None = 64
    max_output_bytes: int = 64 * 1024
    allow_network: bool = False
    pid_namespace: bool = True
    executor: ExecutorKind = "fork"

    def __post_init__(self) -> None:
        if self.executor not in _EXECUTORS:
            raise ValueError(f"executor must be one of {_EXECUTORS}, got {self.executor!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        if self.max_output_bytes < 0:
            raise ValueError(f"max_output_bytes must be >= 0, got {self.max_output_bytes!r}")
        for name in ("cpu_s", "memory_mb", "file_size_mb", "max_processes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, got {value!r}")

    def effective_cpu_s(self) -> int:
        """CPU seconds actually applied (``cpu_s`` or ``ceil(timeout_s) + 1``)."""
        if self.cpu_s is not None:
            return max(1, int(-(-self.cpu_s // 1)))
        return int(-(-self.timeout_s // 1)) + 1


@dataclass(slots=True)
class ExecutionResult:
    """What happened to one sandboxed program.

    Attributes:
        status: ``"ok"`` exit code 0; ``"error"`` non-zero exit (uncaught exception,
            ``sys.exit(n)``); ``"syntax_error"`` the code did not compile; ``"timeout"``
            wall-clock limit hit (group killed); ``"killed"`` ended by a signal (e.g.
            ``SIGXCPU``/``SIGKILL`` from the CPU limit); ``"failed_to_start"`` the
            interpreter could not be started.
        returncode: the child's exit code (negative: killed by that signal); ``None`` if
            it never started.
        stdout, stderr: captured text (UTF-8, undecodable bytes replaced), each at most
            ``max_output_bytes`` bytes before decoding.
        stdout_truncated, stderr_truncated: whether output beyond the cap was dropped.
        duration_s: wall-clock seconds from start to reaping, parent-side.
        error_type: exception class name reported by the runner (e.g. ``"MemoryError"``).
        error: short error message reported by the runner.
        isolation: what the runner achieved: ``netns``, ``pidns``, ``userns`` (bools),
            ``uid``, ``nproc_enforced``, ``executor`` (``"fork"``/``"exec"``) and, for
            ``"fork"``, ``zygote_pid``; empty if the runner did not get that far.
        records: the validated records of the result channel (internal use).
        tampered: ``True`` if the result channel carried lines not written by the runner.
    """

    status: ExecutionStatus
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error_type: str | None = None
    error: str | None = None
    isolation: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)
    tampered: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of the result (without the raw channel records)."""
        out = asdict(self)
        out.pop("records", None)
        return out


def _scrubbed_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
    }


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _has_exited(pid: int) -> bool:
    """True once ``pid`` has exited, without reaping it (so its pgid stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _parse_records(raw: bytes, nonce: str) -> tuple[list[dict[str, Any]], bool]:
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


def _limits_cfg(limits: SandboxLimits) -> dict[str, Any]:
    return {
        "allow_network": limits.allow_network,
        "pid_namespace": limits.pid_namespace,
        "limits": {
            "cpu_s": limits.effective_cpu_s(),
            "memory_mb": limits.memory_mb,
            "file_size_mb": limits.file_size_mb,
            "max_processes": limits.max_processes,
        },
    }


def execute(payload: Mapping[str, Any], limits: SandboxLimits) -> ExecutionResult:
    """Run the runner with ``payload`` under ``limits``; low-level, used by the harness.

    ``payload`` holds ``mode`` (``"exec"`` or ``"check"``) and the mode's fields; the
    executor adds the nonce, the result fd and the limits.
    """
    if limits.executor == "fork":
        from comlrl.envs.sandbox import zygote

        result = zygote.execute_forked(payload, limits)
        if result is not None:
            return result
    return execute_exec(payload, limits)


class _ExecChild:
    """The process handle :func:`drive` needs, for a runner started with ``Popen``."""

    exit_fd: int | None = None  # exit is polled with waitid

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lost_reason: str | None = None

    def poll_exited(self) -> bool:
        return _has_exited(self.proc.pid)

    def kill_group(self) -> None:
        _kill_group(self.proc.pid)

    def wait(self) -> int | None:
        self.proc.wait()
        return self.proc.returncode


def execute_exec(payload: Mapping[str, Any], limits: SandboxLimits) -> ExecutionResult:
    """The ``"exec"`` executor: a new ``python -I -S -B _runner.py`` for this program."""
    nonce = secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="comlrl-sandbox-")
    read_fd, write_fd = os.pipe()
    cfg = dict(payload)
    cfg.update(nonce=nonce, result_fd=write_fd, **_limits_cfg(limits))
    data = marshal.dumps(cfg)
    start = time.perf_counter()
    proc: subprocess.Popen[bytes] | None = None
    try:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", _RUNNER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=_scrubbed_env(workdir),
                start_new_session=True,
                pass_fds=(write_fd,),
                close_fds=True,
            )
        except OSError as exc:
            return ExecutionResult(
                "failed_to_start", None, stderr=str(exc), duration_s=time.perf_counter() - start
            )
        finally:
            os.close(write_fd)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            proc.stdin.write(data)
        except (BrokenPipeError, OSError):
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
        return drive(
            _ExecChild(proc),
            proc.stdout.fileno(),
            proc.stderr.fileno(),
            read_fd,
            nonce,
            limits,
            start,
        )
    finally:
        if proc is not None and proc.returncode is None:
            _kill_group(proc.pid)
            proc.wait()
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        os.close(read_fd)
        shutil.rmtree(workdir, ignore_errors=True)


def drive(
    child: Any,
    out_fd: int,
    err_fd: int,
    read_fd: int,
    nonce: str,
    limits: SandboxLimits,
    start: float,
) -> ExecutionResult:
    """Collect a started child's output and result channel until it ends or times out.

    ``child`` provides ``exit_fd`` (a descriptor readable when there may be news of the
    child's exit, or ``None`` to poll), ``poll_exited()``, ``kill_group()``, ``wait()``
    (the return code, ``None`` when it is unknown) and ``lost_reason`` (why the exit
    status is unknown). Used by both executors.
    """
    deadline = start + limits.timeout_s
    caps = {out_fd: limits.max_output_bytes, err_fd: limits.max_output_bytes, read_fd: _RESULT_CAP}
    bufs: dict[int, bytearray] = {fd: bytearray() for fd in caps}
    truncated = {fd: False for fd in caps}
    timed_out = False
    group_killed = False
    exited_early = False
    open_fds = set(caps)
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
                deadline = min(deadline, time.perf_counter() + _EXIT_GRACE_S)
                exited_early = True
            if exit_fd is not None and child.exit_fd is None:
                sel.unregister(exit_fd)  # exit reported (or the channel is gone)
                exit_fd = None
    child.kill_group()
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
    records, tampered = _parse_records(bytes(bufs[read_fd]), nonce)
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
        # The exit status was lost (fork executor: the zygote died during the run).
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


def run_python(code: str, limits: SandboxLimits | None = None) -> ExecutionResult:
    """Run ``code`` as ``__main__`` in a sandboxed child interpreter and wait for it.

    Args:
        code: Python source text. Only the standard library is importable (the child runs
            with ``-I -S``: isolated mode, no ``site``).
        limits: resource limits; defaults to :class:`SandboxLimits()`.

    Returns:
        An :class:`ExecutionResult`; this function does not raise for anything the
        program does.

    Raises:
        TypeError: when ``code`` is not a string.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str of Python source, got {type(code).__name__}")
    return execute({"mode": "exec", "code": code}, limits or SandboxLimits())
