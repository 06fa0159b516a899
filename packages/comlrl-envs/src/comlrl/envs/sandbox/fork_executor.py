"""The ``"fork"`` executor: a pre-started, clean fork server forks one child per program.

Starting ``python -I -S -B`` per program costs tens of milliseconds (more on a busy
machine, and more again when the trainer is a large process that has to ``fork`` +
``exec``). A *fork server* pays that once: it is the sandbox runner itself, started exactly
like an exec-mode runner (``sys.executable -I -S -B _runner.py --fork-server FD``, scrubbed
environment, ``cwd="/"``, its own session, stdio on ``/dev/null``). It takes the builtins
snapshot, imports what the runner needs plus a few stdlib modules programs import most
(``typing``, ``re``, ``collections``, ...), runs the runner's own code paths once on
constant inputs (so lazily initialized interpreter state is not rebuilt, page by page,
in every child), freezes its objects for the garbage collector, and then only forks.

Per program (:func:`execute_forked`):

1. The parent makes the instructions pipe, stdout/stderr pipes, the result pipe and the
   temp work dir, writes the instructions (program, nonce, limits, work dir) into the
   instructions pipe, and sends ``b"run"`` with the four child-side descriptors over a
   ``SOCK_SEQPACKET`` socket pair (``SCM_RIGHTS``). Only the parent and the fork server hold
   that socket; children close it before anything else runs. The fork server never reads
   the instructions pipe, so it never sees a program or a nonce.
2. The fork server forks and answers ``b"pid N"``. The child sets ``PR_SET_PDEATHSIG`` (it
   dies with the fork server), starts a new session, moves the four descriptors to 0-3,
   closes every other descriptor, restores the signal dispositions, reads its
   instructions, changes to the work dir, sets the scrubbed environment, and from there
   runs the same code as an exec-started runner: network and PID namespaces, rlimits,
   ``/dev/null`` stdin, the nonce-tagged result channel, then the program. It ends like
   interpreter shutdown (threads joined, ``atexit``, finalizers, flush) minus the
   teardown of the inherited heap.
3. When the child exits the fork server kills what is left in its process group, answers
   ``b"exit RC"`` and keeps the child as a zombie (so its process-group id stays
   reserved while the parent may still ``killpg`` it) until the next request. The fork server
   is a child subreaper (``PR_SET_CHILD_SUBREAPER``): whatever the program left behind
   (a PID namespace's init whose parent died first, a ``setsid()`` daemon without a PID
   namespace) is re-parented to the fork server, which kills and reaps it, so nothing ends up
   a zombie of the trainer, even when the trainer is PID 1. The
   parent enforces the wall clock and output caps exactly as for ``"exec"``
   (:func:`comlrl.envs.sandbox._process.drive`).

Network namespace: a program with ``allow_network=False`` runs on a fork server that moved
into a new, empty network namespace once, when it started (``--netns``); its children
inherit it instead of each creating one (creating a network namespace costs more than
the rest of a short program's start). Such a fork server's programs run one after another in
that namespace, so a program can see network state an earlier one set up there (say, a
loopback interface it brought up); it can never see the host's network, and with the
PID namespace (the default) nothing an earlier program started is still running. Where
the OS refuses the fork server's ``unshare``, each child makes its own namespace as before.
Programs that may use the network run on fork servers without one.

A fork server serves one program at a time. :class:`ForkServerPool` hands fork servers out
exclusively and starts another when all are busy, so a pool of ``N`` threads ends up
with ``N`` fork servers (about 14 MB resident each, mostly shared); a program can only ever
disturb its own fork server. Fork servers ignore the catchable signals a program could send them
(without a PID namespace the fork server is the program's parent). Recovery: a dead fork server is
replaced on the next call; a request that fails before its child started (fork server dead
or not answering within ``_REPLY_TIMEOUT_S``) is retried once on a fresh fork server, then on
the ``"exec"`` executor; a fork server that dies while its program runs takes that program
with it (``PR_SET_PDEATHSIG``) and that run is reported as ``"killed"`` with
``error_type="SandboxError"``. Fork servers exit when the parent closes their socket (at
interpreter exit, on :func:`shutdown`, or when the parent dies).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import socket
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

from comlrl.envs.sandbox._fork_servers import (
    ForkServer,
    ForkServerError,
    ForkServerPool,
    fork_available,
)
from comlrl.envs.sandbox._process import (
    ChildHandle,
    drive,
    encode_instructions,
    kill_group,
    make_run_dir,
    runner_config,
    scrubbed_env,
)
from comlrl.envs.sandbox.limits import ExecutionResult, SandboxLimits
from comlrl.envs.sandbox.run_limits import open_run_group

__all__ = [
    "execute_forked",
    "shutdown",
]

_REPLY_TIMEOUT_S = 10.0  # from "run" to "pid N": a fork, normally well under 10 ms
_STATUS_TIMEOUT_S = 5.0  # from killpg to "exit RC"
_CHILD_RESULT_FD = 3  # where the child finds the result pipe


_POOL: ForkServerPool | None = None
_POOL_LOCK = threading.Lock()
_ABANDONED: list[ForkServerPool] = []  # pools inherited through os.fork(): never touched
_WARNED = False


def _get_pool() -> ForkServerPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ForkServerPool()
        return _POOL


def _after_fork_in_child() -> None:
    # A process forked from the trainer must not share the trainer's fork servers.
    global _POOL, _POOL_LOCK
    if _POOL is not None:
        _ABANDONED.append(_POOL)
    _POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def shutdown() -> None:
    """Stop every idle fork server; the next fork-executor call starts new ones."""
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
    """:class:`~comlrl.envs.sandbox._process.ChildHandle` of a child forked by a fork server."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None
        self.exited = False
        self.lost_reason: str | None = None

    @property
    def exit_fd(self) -> int | None:
        if self.exited or self.lost_reason is not None:
            return None
        return self.server.sock.fileno()

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
        self.server.broken = True
        self.lost_reason = "the sandbox fork server died before reporting the exit status"

    def poll_exited(self) -> bool:
        """Exit reported, or the fork server is gone (and the child died with it)."""
        if not self.exited and self.lost_reason is None:
            self._take(self.server.recv(0))
        return self.exited or self.lost_reason is not None

    def kill_group(self) -> None:
        # The fork server keeps the child unreaped until its next request, so the pgid is
        # still the child's.
        kill_group(self.pid)

    def wait(self) -> int | None:
        if not self.exited and self.lost_reason is None:
            msg = self.server.recv(_STATUS_TIMEOUT_S)
            if msg is None:
                self.server.broken = True
                self.lost_reason = "the sandbox fork server stopped answering"
            else:
                self._take(msg)
        return self.returncode


_RETRY = object()


def _run_on(server: ForkServer, payload: Mapping[str, Any], limits: SandboxLimits) -> Any:
    """One program on ``server``: an :class:`ExecutionResult`, or ``_RETRY``."""
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
    cfg = dict(payload)
    cfg.update(
        nonce=nonce,
        result_fd=_CHILD_RESULT_FD,
        env=scrubbed_env(workdir),
        netns_inherited=server.netns and not limits.allow_network,
        **config,
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
            socket.send_fds(server.sock, [b"run"], [req_r, out_w, err_w, res_w])
            sent = True
        except OSError:
            sent = False
        finally:
            for fd in (req_r, out_w, err_w, res_w):
                os.close(fd)
        reply = server.recv(_REPLY_TIMEOUT_S) if sent else b""
        if not reply or not (reply.startswith(b"pid ") or reply.startswith(b"err ")):
            # Dead or hung before the child started. A child it forked dies with it
            # (PR_SET_PDEATHSIG, set before the child reads anything), so retrying
            # elsewhere cannot run the program twice at once.
            server.broken = True
            return _RETRY
        if reply.startswith(b"err "):
            return ExecutionResult(
                "failed_to_start",
                None,
                stderr=reply[4:].decode("utf-8", "replace"),
                duration_s=time.perf_counter() - start,
            )
        child = _ForkChild(server, int(reply[4:]))
        handle: ChildHandle = child
        if req_w in ours:
            try:
                while view:
                    view = view[os.write(req_w, view) :]
            except OSError:
                pass  # the child died before reading everything; drive() reports how
            os.close(req_w)
            ours.remove(req_w)
        return drive(handle, out_r, err_r, res_r, nonce, limits, start, group)
    finally:
        if child is not None and not child.exited and child.lost_reason is None:
            # An exception got us here mid-run: make sure the program is dead.
            child.kill_group()
            child.wait()
        for fd in ours:
            os.close(fd)
        if group is not None:
            group.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def execute_forked(payload: Mapping[str, Any], limits: SandboxLimits) -> ExecutionResult | None:
    """Run one program through a fork server; ``None`` when the exec executor must be used."""
    if not fork_available():
        _warn_fallback("not supported on this platform")
        return None
    for _ in range(2):
        pool = _get_pool()
        try:
            server = pool.acquire(netns=not limits.allow_network)
        except ForkServerError as exc:
            _warn_fallback(str(exc))
            return None
        try:
            outcome = _run_on(server, payload, limits)
        except BaseException:
            pool.discard(server)
            raise
        if outcome is _RETRY:
            pool.discard(server)
            continue
        pool.release(server)
        return outcome
    return None
