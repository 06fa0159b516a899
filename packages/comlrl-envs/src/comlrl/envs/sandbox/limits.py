"""The sandbox's value types: what a program may use, and what happened to it.

:class:`SandboxLimits` goes in, :class:`ExecutionResult` comes out; both executors
(:mod:`comlrl.envs.sandbox.executor`, :mod:`comlrl.envs.sandbox.fork_executor`) share them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "ExecutionResult",
    "ExecutionStatus",
    "AccountingMode",
    "ExecutorKind",
    "FilesystemMode",
    "SandboxLimits",
    "SandboxUnavailableError",
]

ExecutionStatus = Literal["ok", "error", "syntax_error", "timeout", "killed", "failed_to_start"]
ExecutorKind = Literal["fork", "exec"]
FilesystemMode = Literal["isolated", "host"]
AccountingMode = Literal["auto", "cgroup", "single_process"]
EXECUTORS: tuple[str, ...] = ("fork", "exec")
FILESYSTEM_MODES: tuple[str, ...] = ("isolated", "host")
ACCOUNTING_MODES: tuple[str, ...] = ("auto", "cgroup", "single_process")


class SandboxUnavailableError(RuntimeError):
    """The isolation asked for cannot be had on this machine (nothing was run).

    Raised, for example, when ``SandboxLimits(filesystem="isolated")`` (the default) meets
    an OS that allows no mount namespace: not root, and unprivileged user namespaces
    disabled (``kernel.unprivileged_userns_clone=0``, a seccomp profile that blocks
    ``unshare``, ...). The message says what was refused and how to opt out.
    """


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits and isolation settings for one sandboxed program.

    Attributes:
        timeout_s: wall-clock limit in seconds; past it the process group is killed.
        cpu_s: CPU-time limit in seconds of the whole run (all its processes together, see
            ``accounting``; also ``RLIMIT_CPU`` per process, soft = hard: SIGKILL). ``None``
            means ``ceil(timeout_s) + 1``.
        memory_mb: memory limit in MiB of the whole run (see ``accounting``; also
            ``RLIMIT_AS`` per process); ``None`` for none.
        file_size_mb: largest file the program may write, MiB (``RLIMIT_FSIZE``); also the
            size of the private ``/tmp`` and of the work directory (two tmpfs, so at most
            ``2 * file_size_mb`` of written data in all) under ``filesystem="isolated"``;
            writing past either fails with ``ENOSPC``/``EFBIG``.
        max_processes: processes of the whole run (``pids.max`` of its cgroup, see
            ``accounting``; also ``RLIMIT_NPROC``, per real user: under
            ``filesystem="isolated"`` a root trainer runs each program as a user id of its
            own, so it counts that program's processes only).
        max_output_bytes: bytes of stdout and of stderr kept (each); the rest is dropped.
        allow_network: ``False`` puts the program in an empty network namespace when the
            OS allows it (see :attr:`ExecutionResult.isolation` for what was achieved).
        pid_namespace: run the program in a new PID namespace (under a minimal init) when
            the OS allows it.
        executor: ``"fork"`` forks each program from a pre-started fork server process (falls
            back to ``"exec"`` where that is not possible); ``"exec"`` starts a new
            interpreter per program. Same isolation per program, see the module docs.
        filesystem: ``"isolated"`` (default): the program sees a new root holding only
            the interpreter, its standard library and the shared libraries it loads (all
            read-only), ``/dev/{null,zero,full,random,urandom}``, a private ``/tmp``
            (tmpfs) and its working directory (the only host directory it can write, and
            deleted afterwards); no ``/proc``, ``/etc``, ``/home``, host ``/tmp`` or
            checkout. Needs a mount namespace (root, or unprivileged user namespaces);
            where the OS allows none, running raises :class:`SandboxUnavailableError`.
            ``"host"``: the documented opt-out, the program sees the host's filesystem
            with the trainer's permissions (only for trusted code or machines where
            nothing else is at stake).
        readonly_paths: extra host paths (absolute) made visible read-only at the same
            path under ``filesystem="isolated"`` (e.g. a data directory a task needs).
        syscall_filter: ``True`` (default): a seccomp filter keeps kernel state that no
            namespace isolates (keyrings, file locks and notifications on files every run
            can open) out of the program's reach (:mod:`comlrl.envs.sandbox.syscall_filter`);
            where libseccomp cannot be had, running raises
            :class:`SandboxUnavailableError`. ``False``: the documented opt-out, concurrent
            runs may then pass data through those objects and keyrings outlive the run.
        accounting: how ``memory_mb``, ``max_processes`` and ``cpu_s`` bound the whole run
            (:mod:`comlrl.envs.sandbox.run_limits`): ``"auto"`` (default) a cgroup per run
            where the host allows one, else the single-process fallback (the program
            cannot start processes; warned once); ``"cgroup"`` a cgroup or
            :class:`SandboxUnavailableError`; ``"single_process"`` the fallback.
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
    filesystem: FilesystemMode = "isolated"
    readonly_paths: tuple[str, ...] = ()
    syscall_filter: bool = True
    accounting: AccountingMode = "auto"

    def __post_init__(self) -> None:
        if self.accounting not in ACCOUNTING_MODES:
            raise ValueError(
                f"accounting must be one of {ACCOUNTING_MODES}, got {self.accounting!r}"
            )
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        if self.filesystem not in FILESYSTEM_MODES:
            raise ValueError(
                f"filesystem must be one of {FILESYSTEM_MODES}, got {self.filesystem!r}"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        if self.max_output_bytes < 0:
            raise ValueError(f"max_output_bytes must be >= 0, got {self.max_output_bytes!r}")
        for name in ("cpu_s", "memory_mb", "file_size_mb", "max_processes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, got {value!r}")
        if isinstance(self.readonly_paths, str):
            raise ValueError(
                f"readonly_paths must be a tuple of paths, got the string {self.readonly_paths!r}"
            )
        for path in self.readonly_paths:
            if not isinstance(path, str) or not path.startswith("/"):
                raise ValueError(f"readonly_paths must be absolute paths, got {path!r}")

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
        isolation: what the runner achieved: ``netns``, ``pidns``, ``userns``, ``mountns``,
            ``ipcns`` (bools; every run gets a new IPC namespace when the OS allows any
            namespace, so SysV shared memory, semaphores and message queues and POSIX
            message queues die with the run; POSIX shared memory is a file in
            ``/dev/shm``, which the isolated root does not have), ``filesystem`` (``"isolated"``/``"host"``), ``fs_root``
            (``"pivot_root"``/``"chroot"``), ``uid`` (the program's user id as the host
            sees it), ``capabilities`` (effective capability mask of the program, 0 when
            dropped), ``nproc_enforced``, ``executor`` (``"fork"``/``"exec"``) and, for
            ``"fork"``, ``fork_server_pid``, ``seccomp`` (the syscall filter was installed),
            ``accounting`` (``"cgroup2"``/``"cgroup1"``/``"single_process"``: what bounded
            the run as a whole, see :mod:`comlrl.envs.sandbox.run_limits`) and
            ``run_cpu_s`` (CPU seconds of the whole run, with a cgroup); empty if the
            runner did not get that far.
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
