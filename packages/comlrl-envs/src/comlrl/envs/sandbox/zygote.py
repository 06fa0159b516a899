"""The ``"fork"`` executor: a pre-started, clean zygote forks one child per program.

Starting ``python -I -S -B`` per program costs tens of milliseconds (more on a busy
machine, and more again when the trainer is a large process that has to ``fork`` +
``exec``). A *zygote* pays that once: it is the sandbox runner itself, started exactly
like an exec-mode runner (``sys.executable -I -S -B _runner.py --zygote FD``, scrubbed
environment, ``cwd="/"``, its own session, stdio on ``/dev/null``). It takes the builtins
snapshot, imports what the runner needs plus a few stdlib modules programs import most
(``typing``, ``re``, ``collections``, ...), runs the runner's own code paths once on
constant inputs (so lazily initialized interpreter state is not rebuilt, page by page,
in every child), freezes its objects for the garbage collector, and then only forks.

Per program (:func:`execute_forked`):

1. The parent makes the instructions pipe, stdout/stderr pipes, the result pipe and the
   temp work dir, writes the instructions (program, nonce, limits, work dir) into the
   instructions pipe, and sends ``b"run"`` with the four child-side descriptors over a
   ``SOCK_SEQPACKET`` socket pair (``SCM_RIGHTS``). Only the parent and the zygote hold
   that socket; children close it before anything else runs. The zygote never reads
   the instructions pipe, so it never sees a program or a nonce.
2. The zygote forks and answers ``b"pid N"``. The child sets ``PR_SET_PDEATHSIG`` (it
   dies with the zygote), starts a new session, moves the four descriptors to 0-3,
   closes every other descriptor, restores the signal dispositions, reads its
   instructions, changes to the work dir, sets the scrubbed environment, and from there
   runs the same code as an exec-started runner: network and PID namespaces, rlimits,
   ``/dev/null`` stdin, the nonce-tagged result channel, then the program. It ends like
   interpreter shutdown (threads joined, ``atexit``, finalizers, flush) minus the
   teardown of the inherited heap.
3. When the child exits the zygote kills what is left in its process group, answers
   ``b"exit RC"`` and keeps the child as a zombie (so its process-group id stays
   reserved while the parent may still ``killpg`` it) until the next request. The zygote
   is a child subreaper (``PR_SET_CHILD_SUBREAPER``): whatever the program left behind
   (a PID namespace's init whose parent died first, a ``setsid()`` daemon without a PID
   namespace) is re-parented to the zygote, which kills and reaps it, so nothing ends up
   a zombie of the trainer, even when the trainer is PID 1. The
   parent enforces the wall clock and output caps exactly as for ``"exec"``
   (:func:`comlrl.envs.sandbox._process.drive`).

Network namespace: a program with ``allow_network=False`` runs on a zygote that moved
into a new, empty network namespace once, when it started (``--netns``); its children
inherit it instead of each creating one (creating a network namespace costs more than
the rest of a short program's start). Such a zygote's programs run one after another in
that namespace, so a program can see network state an earlier one set up there (say, a
loopback interface it brought up); it can never see the host's network, and with the
PID namespace (the default) nothing an earlier program started is still running. Where
the OS refuses the zygote's ``unshare``, each child makes its own namespace as before.
Programs that may use the network run on zygotes without one.

A zygote serves one program at a time. :class:`ZygotePool` hands zygotes out
exclusively and starts another when all are busy, so a pool of ``N`` threads ends up
with ``N`` zygotes (about 14 MB resident each, mostly shared); a program can only ever
disturb its own zygote. Zygotes ignore the catchable signals a program could send them
(without a PID namespace the zygote is the program's parent). Recovery: a dead zygote is
replaced on the next call; a request that fails before its child started (zygote dead
or not answering within ``_REPLY_TIMEOUT_S``) is retried once on a fresh zygote, then on
the ``"exec"`` executor; a zygote that dies while its program runs takes that program
with it (``PR_SET_PDEATHSIG``) and that run is reported as ``"killed"`` with
``error_type="SandboxError"``. Zygotes exit when the parent closes their socket (at
interpreter exit, on :func:`shutdown`, or when the parent dies).
"""

from __future__ import annotations

import atexit
import os
import secrets
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

from comlrl.envs.sandbox._process import (
    RUNNER,
    ChildHandle,
    drive,
    encode_instructions,
    kill_group,
    make_run_dir,
    runner_config,
    scrubbed_env,
)
from comlrl.envs.sandbox.limits import ExecutionResult, SandboxLimits

__all__ = ["ZygoteError", "ZygotePool", "execute_forked", "fork_available", "shutdown"]

_READY_TIMEOUT_S = 30.0  # a zygote's start-up (imports) on a very busy machine
_REPLY_TIMEOUT_S = 10.0  # from "run" to "pid N": a fork, normally well under 10 ms
_STATUS_TIMEOUT_S = 5.0  # from killpg to "exit RC"
_MAX_IDLE = 64
_CHILD_RESULT_FD = 3  # where the child finds the result pipe
_RUNNER = RUNNER  # the runner script a zygote runs (tests point it elsewhere)


#: Seconds a closing zygote gets to sweep and exit before it is killed (see _Zygote.close).
_CLOSE_WAIT_S = 15.0


class ZygoteError(RuntimeError):
    """A zygote could not be started or stopped answering."""


def fork_available() -> bool:
    """Whether this platform has what the fork executor needs (fork, SCM_RIGHTS)."""
    return (
        hasattr(os, "fork")
        and hasattr(os, "waitid")
        and hasattr(socket, "AF_UNIX")
        and hasattr(socket, "SOCK_SEQPACKET")
        and hasattr(socket, "send_fds")
        and sys.platform.startswith("linux")
    )


class _Zygote:
    """One zygote process and the parent's end of its control socket.

    Args:
        netns: ask the zygote to move into a new, empty network namespace at start-up;
            :attr:`netns` says whether it did (the OS may refuse), and only then do its
            children skip making their own.
    """

    def __init__(self, netns: bool = False) -> None:
        self.broken = False
        self.wants_netns = netns
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", _RUNNER, "--zygote", str(child.fileno())]
                + (["--netns"] if netns else []),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env=scrubbed_env("/"),
                start_new_session=True,
                pass_fds=(child.fileno(),),
                close_fds=True,
            )
        except OSError as exc:
            parent.close()
            raise ZygoteError(f"could not start a zygote: {exc}") from exc
        finally:
            child.close()
        self.sock = parent
        reply = self.recv(_READY_TIMEOUT_S)
        if reply not in (b"ready", b"ready netns"):
            self.kill()
            raise ZygoteError(f"zygote did not start (answered {reply!r})")
        self.netns = reply == b"ready netns"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def recv(self, timeout: float | None) -> bytes | None:
        """Next message; ``b""`` when the zygote is gone, ``None`` on timeout."""
        try:
            if timeout is not None:
                # poll, not select: a trainer may have descriptors above FD_SETSIZE.
                poller = select.poll()
                poller.register(self.sock, select.POLLIN)
                if not poller.poll(max(0, int(timeout * 1000))):
                    return None
            return self.sock.recv(256)
        except OSError:
            return b""

    def send(self, msg: bytes) -> bool:
        try:
            self.sock.send(msg)
            return True
        except OSError:
            self.broken = True
            return False

    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def kill(self) -> None:
        """Kill the zygote now (its running child, if any, is killed by the caller)."""
        self.broken = True
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.sock.close()

    def close(self) -> None:
        """Ask the zygote to exit (closing the socket is the request); kill it if slow.

        On the request the zygote kills and reaps what its last program left behind, then
        exits. It gets :data:`_CLOSE_WAIT_S` for that: a zygote killed mid-sweep leaves
        its unreaped children to the trainer's process (to PID 1 in a container without
        an init, where they would stay zombies), so the wait is generous; on an idle
        machine the exit takes milliseconds.
        """
        self.broken = True
        self.sock.close()
        try:
            self.proc.wait(timeout=_CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()


def _retire(zygote: _Zygote) -> None:
    """Stop a zygote that is not kept: gracefully while its process runs.

    A zygote marked broken (slow to answer on a busy machine) may still be sweeping its
    last program's processes. Closing its socket lets it finish that sweep and exit (see
    :meth:`_Zygote.close`); a SIGKILL would hand its unreaped children to the trainer's
    process, where they stay zombies when the trainer is PID 1. A process already gone is
    just reaped.
    """
    if zygote.proc.poll() is None:
        zygote.close()
    else:
        zygote.kill()


class ZygotePool:
    """Zygotes handed out one caller at a time; grows to the peak concurrency.

    Thread-safe. A zygote is reused only after its previous program finished and was
    reaped; dead ones are dropped when found.
    """

    def __init__(self, max_idle: int = _MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[_Zygote] = []
        self._busy: set[_Zygote] = set()
        self._closed = False

    def acquire(self, netns: bool = False) -> _Zygote:
        """An idle live zygote (one that was asked for a network namespace iff ``netns``),
        or a new one.

        Raises:
            ZygoteError: when a new zygote cannot be started.
        """
        dead: list[_Zygote] = []
        with self._lock:
            if self._closed:
                raise ZygoteError("the zygote pool is shut down")
            zygote = None
            for candidate in reversed(list(self._idle)):
                if candidate.wants_netns != netns:
                    continue
                self._idle.remove(candidate)
                if candidate.alive():
                    zygote = candidate
                    break
                dead.append(candidate)
            if zygote is not None:
                self._busy.add(zygote)
        for z in dead:
            z.kill()
        if zygote is None:
            zygote = _Zygote(netns)
            with self._lock:
                self._busy.add(zygote)
        return zygote

    def release(self, zygote: _Zygote) -> None:
        """Give a zygote back after its program was reaped (or drop it if unhealthy)."""
        with self._lock:
            self._busy.discard(zygote)
            keep = not self._closed and zygote.alive() and len(self._idle) < self.max_idle
            if keep:
                self._idle.append(zygote)
        if not keep:
            _retire(zygote)

    def discard(self, zygote: _Zygote) -> None:
        """Drop a zygote that misbehaved."""
        with self._lock:
            self._busy.discard(zygote)
        _retire(zygote)

    def pids(self) -> list[int]:
        """Process ids of the zygotes (idle and busy), for tests and diagnostics."""
        with self._lock:
            return [z.pid for z in [*self._idle, *self._busy]]

    def close(self) -> None:
        """Stop the idle zygotes; busy ones stop when given back. Safe to call twice."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for z in idle:
            z.close()


_POOL: ZygotePool | None = None
_POOL_LOCK = threading.Lock()
_ABANDONED: list[ZygotePool] = []  # pools inherited through os.fork(): never touched
_WARNED = False


def _get_pool() -> ZygotePool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ZygotePool()
        return _POOL


def _after_fork_in_child() -> None:
    # A process forked from the trainer must not share the trainer's zygotes.
    global _POOL, _POOL_LOCK
    if _POOL is not None:
        _ABANDONED.append(_POOL)
    _POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def shutdown() -> None:
    """Stop every idle zygote; the next fork-executor call starts new ones."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()


atexit.register(shutdown)


def _warn_fallback(reason: str) -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        warnings.warn(
            f"sandbox fork executor unavailable ({reason}); using the exec executor",
            RuntimeWarning,
            stacklevel=4,
        )


class _ForkChild:
    """:class:`~comlrl.envs.sandbox._process.ChildHandle` of a child forked by a zygote."""

    def __init__(self, zygote: _Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None
        self.exited = False
        self.lost_reason: str | None = None

    @property
    def exit_fd(self) -> int | None:
        if self.exited or self.lost_reason is not None:
            return None
        return self.zygote.sock.fileno()

    def _take(self, msg: bytes | None) -> None:
        if msg is None:
            return
        if msg.startswith(b"exit "):
            try:
                self.returncode = int(msg[5:])
                self.exited = True
                return
            except ValueError:
                pass
        self.zygote.broken = True
        self.lost_reason = "the sandbox zygote died before reporting the exit status"

    def poll_exited(self) -> bool:
        """Exit reported, or the zygote is gone (and the child died with it)."""
        if not self.exited and self.lost_reason is None:
            self._take(self.zygote.recv(0))
        return self.exited or self.lost_reason is not None

    def kill_group(self) -> None:
        # The zygote keeps the child unreaped until its next request, so the pgid is
        # still the child's.
        kill_group(self.pid)

    def wait(self) -> int | None:
        if not self.exited and self.lost_reason is None:
            msg = self.zygote.recv(_STATUS_TIMEOUT_S)
            if msg is None:
                self.zygote.broken = True
                self.lost_reason = "the sandbox zygote stopped answering"
            else:
                self._take(msg)
        return self.returncode


_RETRY = object()


def _run_on(zygote: _Zygote, payload: Mapping[str, Any], limits: SandboxLimits) -> Any:
    """One program on ``zygote``: an :class:`ExecutionResult`, or ``_RETRY``."""
    nonce = secrets.token_hex(16)
    run_dir, workdir = make_run_dir()
    cfg = dict(payload)
    cfg.update(
        nonce=nonce,
        result_fd=_CHILD_RESULT_FD,
        env=scrubbed_env(workdir),
        netns_inherited=zygote.netns and not limits.allow_network,
        **runner_config(limits, run_dir, workdir),
    )
    view = memoryview(encode_instructions(cfg))
    req_r, req_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    ours = [req_w, out_r, err_r, res_r]
    child: _ForkChild | None = None
    start = time.perf_counter()
    try:
        # The instructions go into the pipe first (as much as fits), so the child can
        # read them as soon as it is forked; only the child ever reads this pipe.
        os.set_blocking(req_w, False)
        try:
            while view:
                view = view[os.write(req_w, view) :]
        except BlockingIOError:
            pass
        os.set_blocking(req_w, True)
        if not view:  # all of it fits: the child reads to EOF without waiting for us
            os.close(req_w)
            ours.remove(req_w)
        try:
            socket.send_fds(zygote.sock, [b"run"], [req_r, out_w, err_w, res_w])
            sent = True
        except OSError:
            sent = False
        finally:
            for fd in (req_r, out_w, err_w, res_w):
                os.close(fd)
        reply = zygote.recv(_REPLY_TIMEOUT_S) if sent else b""
        if not reply or not (reply.startswith(b"pid ") or reply.startswith(b"err ")):
            # Dead or hung before the child started. A child it forked dies with it
            # (PR_SET_PDEATHSIG, set before the child reads anything), so retrying
            # elsewhere cannot run the program twice at once.
            zygote.broken = True
            return _RETRY
        if reply.startswith(b"err "):
            return ExecutionResult(
                "failed_to_start",
                None,
                stderr=reply[4:].decode("utf-8", "replace"),
                duration_s=time.perf_counter() - start,
            )
        child = _ForkChild(zygote, int(reply[4:]))
        handle: ChildHandle = child
        if req_w in ours:
            try:
                while view:
                    view = view[os.write(req_w, view) :]
            except OSError:
                pass  # the child died before reading everything; drive() reports how
            os.close(req_w)
            ours.remove(req_w)
        return drive(handle, out_r, err_r, res_r, nonce, limits, start)
    finally:
        if child is not None and not child.exited and child.lost_reason is None:
            # An exception got us here mid-run: make sure the program is dead.
            child.kill_group()
            child.wait()
        for fd in ours:
            os.close(fd)
        shutil.rmtree(run_dir, ignore_errors=True)


def execute_forked(payload: Mapping[str, Any], limits: SandboxLimits) -> ExecutionResult | None:
    """Run one program through a zygote; ``None`` when the exec executor must be used."""
    if not fork_available():
        _warn_fallback("not supported on this platform")
        return None
    for _ in range(2):
        pool = _get_pool()
        try:
            zygote = pool.acquire(netns=not limits.allow_network)
        except ZygoteError as exc:
            _warn_fallback(str(exc))
            return None
        try:
            outcome = _run_on(zygote, payload, limits)
        except BaseException:
            pool.discard(zygote)
            raise
        if outcome is _RETRY:
            pool.discard(zygote)
            continue
        pool.release(zygote)
        return outcome
    return None
