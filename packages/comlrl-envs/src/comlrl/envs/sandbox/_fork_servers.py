"""The fork server processes of the ``"fork"`` executor and the pool that hands them out.

A :class:`ForkServer` is one pre-started sandbox runner (``_runner.py --fork-server``) and the
parent's end of its ``SOCK_SEQPACKET`` control socket; :class:`ForkServerPool` hands fork servers
out one caller at a time and grows to the peak concurrency. How a program runs on a
fork server, and why: :mod:`comlrl.envs.sandbox.fork_executor`.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading

from comlrl.envs.sandbox._process import RUNNER, scrubbed_env

__all__ = ["ForkServer", "ForkServerError", "ForkServerPool", "fork_available"]

_READY_TIMEOUT_S = 30.0  # a fork server's start-up (imports) on a very busy machine
_MAX_IDLE = 64
_RUNNER = RUNNER  # the runner script a fork server runs (tests point it elsewhere)
#: Seconds a closing fork server gets to sweep and exit before it is killed (see ForkServer.close).
_CLOSE_WAIT_S = 15.0


class ForkServerError(RuntimeError):
    """A fork server could not be started or stopped answering."""


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


class ForkServer:
    """One fork server process and the parent's end of its control socket.

    Args:
        netns: ask the fork server to move into a new, empty network namespace at start-up;
            :attr:`netns` says whether it did (the OS may refuse), and only then do its
            children skip making their own.
    """

    def __init__(self, netns: bool = False) -> None:
        self.broken = False
        self.wants_netns = netns
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", _RUNNER, "--fork-server", str(child.fileno())]
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
            raise ForkServerError(f"could not start a fork server: {exc}") from exc
        finally:
            child.close()
        self.sock = parent
        reply = self.recv(_READY_TIMEOUT_S)
        if reply not in (b"ready", b"ready netns"):
            self.kill()
            raise ForkServerError(f"fork server did not start (answered {reply!r})")
        self.netns = reply == b"ready netns"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def recv(self, timeout: float | None) -> bytes | None:
        """Next message; ``b""`` when the fork server is gone, ``None`` on timeout."""
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
        """Kill the fork server now (its running child, if any, is killed by the caller)."""
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
        """Ask the fork server to exit (closing the socket is the request); kill it if slow.

        On the request the fork server kills and reaps what its last program left behind, then
        exits. It gets :data:`_CLOSE_WAIT_S` for that: a fork server killed mid-sweep leaves
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


def _retire(server: ForkServer) -> None:
    """Stop a fork server that is not kept: gracefully while its process runs.

    A fork server marked broken (slow to answer on a busy machine) may still be sweeping its
    last program's processes. Closing its socket lets it finish that sweep and exit (see
    :meth:`ForkServer.close`); a SIGKILL would hand its unreaped children to the trainer's
    process, where they stay zombies when the trainer is PID 1. A process already gone is
    just reaped.
    """
    if server.proc.poll() is None:
        server.close()
    else:
        server.kill()


class ForkServerPool:
    """Fork servers handed out one caller at a time; grows to the peak concurrency.

    Thread-safe. A fork server is reused only after its previous program finished and was
    reaped; dead ones are dropped when found.
    """

    def __init__(self, max_idle: int = _MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[ForkServer] = []
        self._busy: set[ForkServer] = set()
        self._closed = False

    def acquire(self, netns: bool = False) -> ForkServer:
        """An idle live fork server (one that was asked for a network namespace iff ``netns``),
        or a new one.

        Raises:
            ForkServerError: when a new fork server cannot be started.
        """
        dead: list[ForkServer] = []
        with self._lock:
            if self._closed:
                raise ForkServerError("the fork server pool is shut down")
            server = None
            for candidate in reversed(list(self._idle)):
                if candidate.wants_netns != netns:
                    continue
                self._idle.remove(candidate)
                if candidate.alive():
                    server = candidate
                    break
                dead.append(candidate)
            if server is not None:
                self._busy.add(server)
        for z in dead:
            z.kill()
        if server is None:
            server = ForkServer(netns)
            with self._lock:
                self._busy.add(server)
        return server

    def release(self, server: ForkServer) -> None:
        """Give a fork server back after its program was reaped (or drop it if unhealthy)."""
        with self._lock:
            self._busy.discard(server)
            keep = not self._closed and server.alive() and len(self._idle) < self.max_idle
            if keep:
                self._idle.append(server)
        if not keep:
            _retire(server)

    def discard(self, server: ForkServer) -> None:
        """Drop a fork server that misbehaved."""
        with self._lock:
            self._busy.discard(server)
        _retire(server)

    def pids(self) -> list[int]:
        """Process ids of the fork servers (idle and busy), for tests and diagnostics."""
        with self._lock:
            return [z.pid for z in [*self._idle, *self._busy]]

    def close(self) -> None:
        """Stop the idle fork servers; busy ones stop when given back. Safe to call twice."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for z in idle:
            z.close()
