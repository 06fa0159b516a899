"""Run untrusted Python in a resource-limited child process.

Model-written code never runs in the trainer's process. Each program gets a child
process of its own, made one of two ways (``SandboxLimits.executor``):

- ``"fork"`` (default): a long-lived *fork server* (``sys.executable -I -S -B _runner.py
  --fork-server``, scrubbed environment, its own session, started once per concurrent
  caller and reused) forks a fresh child per program; see
  :mod:`comlrl.envs.sandbox.fork_executor`. Saves the interpreter start-up per program. Falls
  back to ``"exec"`` when a fork server cannot be used on this platform.
- ``"exec"``: :func:`run_python` starts ``sys.executable -I -S -B`` on the child-side
  runner (``_runner.py``) per program.

Either way the child applies the same per-program isolation before the program runs:

- its own session and process group (``setsid``); on timeout, and after the program
  exits, ``SIGKILL`` goes to the whole group;
- new network and PID namespaces where the kernel permits ``unshare(2)`` (root or
  unprivileged user namespaces); in a PID namespace the program runs under a minimal
  init, so every process it started dies with it, even ones that left the process group
  with ``setsid()``;
- limits per run: a cgroup of its own (memory, processes, CPU time of all the run's
  processes together), else the single-process fallback
  (:mod:`comlrl.envs.sandbox.run_limits`); and rlimits per process: ``RLIMIT_CPU``,
  ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, ``RLIMIT_CORE=0``
  (``RLIMIT_NPROC`` counts per user and is ignored for root);
- a seccomp filter for the kernel state no namespace isolates: no keyrings, no file
  locks another run could see, no notifications on shared files
  (:mod:`comlrl.envs.sandbox.syscall_filter`);
- its own filesystem view (``SandboxLimits.filesystem="isolated"``, the default): a new
  mount namespace whose root is a small read-only tmpfs holding only the interpreter,
  its standard library (package directories masked) and the shared libraries it loads,
  bound read-only, plus ``/dev/{null,zero,full,random,urandom}``, a private ``/tmp``
  (tmpfs) and the program's work directory (``pivot_root``; ``chroot`` where that is
  refused). Then the program loses every privilege: a root trainer's program runs as
  a user id of its own (``0x60000000 + runner pid``), a non-root trainer's program
  (in a user namespace) drops all capabilities; ``no_new_privs`` is set either way.
  Where the OS allows no mount namespace the run is refused
  (:class:`~comlrl.envs.sandbox.limits.SandboxUnavailableError`) unless the caller opted
  out with ``filesystem="host"``;
- a fresh temporary working directory, deleted afterwards (under ``"isolated"`` a private
  tmpfs of ``file_size_mb`` mounted there, so what the program writes is bounded);
- a scrubbed environment (``PATH``, ``LANG``, ``HOME``/``TMPDIR`` = the work dir);
- stdin replaced by ``/dev/null`` once the runner has read its instructions;
- stdout and stderr captured up to ``max_output_bytes`` each (the rest is read and
  dropped, so a chatty program cannot block or exhaust memory).

Reaping: every process a run creates is reaped, also when the trainer is PID 1 of its
PID namespace (a container without an init), where processes whose parent died first
are re-parented to the trainer: the exec executor reaps what the killed group left
(:func:`~comlrl.envs.sandbox._process.reap_group`), and a fork server is a child subreaper
that reaps everything its programs leave behind.

The runner reports through a separate pipe with a per-run random nonce; see
:mod:`comlrl.envs.sandbox.harness` for how test verdicts use that channel.
``ExecutionResult.isolation["executor"]`` says which executor ran the program.

Known differences of ``"fork"`` (none weakens the limits above): the children of one
fork server share its string-hash seed and address-space layout (``"exec"`` gets fresh ones
per program), see the fork server's extra stdlib modules already in ``sys.modules``, and end
without the interpreter's final teardown of inherited modules (so ``__del__`` of objects
that outlive the program's globals, e.g. stored in a module, is not called).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from comlrl.envs.sandbox import fork_executor
from comlrl.envs.sandbox._process import (
    RUNNER,
    drive,
    encode_instructions,
    has_exited,
    kill_group,
    make_run_dir,
    reap_group,
    runner_config,
    scrubbed_env,
)
from comlrl.envs.sandbox.limits import (
    ExecutionResult,
    SandboxLimits,
    SandboxUnavailableError,
)
from comlrl.envs.sandbox.run_limits import open_run_group

__all__ = [
    "run_python",
    "execute",
    "execute_exec",
]


def _raise_if_refused(result: ExecutionResult, limits: SandboxLimits) -> ExecutionResult:
    refused = result.isolation.get("refused")
    if refused:
        raise SandboxUnavailableError(
            f"the sandbox could not isolate the program ({refused}); nothing was run. For "
            "the filesystem: run as root, or allow unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0), "
            "or opt out explicitly with SandboxLimits(filesystem='host') if the code is "
            "trusted; for the seccomp filter: a kernel with seccomp, or "
            f"SandboxLimits(syscall_filter=False) (limits: {limits!r})"
        )
    return result


def execute(payload: Mapping[str, Any], limits: SandboxLimits) -> ExecutionResult:
    """Run the runner with ``payload`` under ``limits``; low-level, used by the harness.

    ``payload`` holds ``mode`` (``"exec"`` or ``"check"``) and the mode's fields; the
    executor adds the nonce, the result fd and the limits.

    Raises:
        SandboxUnavailableError: the OS refused the filesystem isolation ``limits`` ask
            for (nothing was run).
    """
    result = None
    if limits.executor == "fork":
        result = fork_executor.execute_forked(payload, limits)
    if result is None:
        result = execute_exec(payload, limits)
    return _raise_if_refused(result, limits)


class _ExecChild:
    """:class:`~comlrl.envs.sandbox._process.ChildHandle` of a ``Popen``-started runner."""

    exit_fd: int | None = None  # exit is polled with waitid

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lost_reason: str | None = None

    def poll_exited(self) -> bool:
        return has_exited(self.proc.pid)

    def kill_group(self) -> None:
        kill_group(self.proc.pid)

    def wait(self) -> int | None:
        self.proc.wait()
        # The group is dead; a trainer that is PID 1 may have adopted some of it.
        reap_group(self.proc.pid)
        return self.proc.returncode


def execute_exec(payload: Mapping[str, Any], limits: SandboxLimits) -> ExecutionResult:
    """The ``"exec"`` executor: a new ``python -I -S -B _runner.py`` for this program."""
    nonce = secrets.token_hex(16)
    group = open_run_group(limits)
    run_dir, workdir = make_run_dir()
    try:
        config = runner_config(limits, run_dir, workdir, group)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        if group is not None:
            group.close()
        raise
    read_fd, write_fd = os.pipe()
    cfg = dict(payload)
    cfg.update(nonce=nonce, result_fd=write_fd, **config)
    data = encode_instructions(cfg)
    start = time.perf_counter()
    proc: subprocess.Popen[bytes] | None = None
    try:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", RUNNER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=scrubbed_env(workdir),
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
        result = drive(
            _ExecChild(proc),
            proc.stdout.fileno(),
            proc.stderr.fileno(),
            read_fd,
            nonce,
            limits,
            start,
            group,
        )
        sweep_program_uid(result.isolation)
        return result
    finally:
        if proc is not None and proc.returncode is None:
            kill_group(proc.pid)
            proc.wait()
            reap_group(proc.pid)
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        os.close(read_fd)
        if group is not None:
            group.close()
        shutil.rmtree(run_dir, ignore_errors=True)


_PROGRAM_UID_BASE = 0x60000000  # _runner_mounts.UID_BASE: a program's own user ids


def sweep_program_uid(isolation: Mapping[str, Any] | None) -> bool:
    """Kill every process left under a finished program's own user id; ``True`` if run.

    Without a PID namespace nothing kills a double-forked ``setsid()`` daemon with the
    process group. When the trainer is root, an isolated program runs as a user id of
    its own (``0x60000000 + runner pid``), so ``kill(-1, SIGKILL)`` sent *as that user*
    reaches exactly what the program left, wherever it re-parented. Nothing is done for
    runs in a PID namespace (the kernel already killed everything) or without an own
    user id (a non-root trainer with ``pid_namespace=False``: such a daemon can outlive
    the run; keep the PID namespace on).
    """
    iso = isolation or {}
    uid = iso.get("uid")
    if iso.get("pidns", True) or not isinstance(uid, int) or uid < _PROGRAM_UID_BASE:
        return False
    if os.geteuid() != 0:
        return False
    kill = shutil.which("kill") or "/bin/kill"
    cmd = [kill, "-KILL", "-1"] if os.path.exists(kill) else None
    if cmd is None:
        cmd = [sys.executable, "-I", "-S", "-c", "import os; os.kill(-1, 9)"]
    try:
        subprocess.run(
            cmd,
            user=uid,
            group=uid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env={},
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def run_python(code: str, limits: SandboxLimits | None = None) -> ExecutionResult:
    """Run ``code`` as ``__main__`` in a sandboxed child interpreter and wait for it.

    Args:
        code: Python source text. Only the standard library is importable (the child runs
            with ``-I -S``: isolated mode, no ``site``).
        limits: resource limits and isolation; defaults to :class:`SandboxLimits()`.

    Returns:
        An :class:`ExecutionResult`; this function does not raise for anything the
        program does.

    Raises:
        TypeError: when ``code`` is not a string.
        SandboxUnavailableError: when the OS refuses the isolation ``limits`` ask for
            (see :attr:`SandboxLimits.filesystem`); nothing was run.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str of Python source, got {type(code).__name__}")
    return execute({"mode": "exec", "code": code}, limits or SandboxLimits())
