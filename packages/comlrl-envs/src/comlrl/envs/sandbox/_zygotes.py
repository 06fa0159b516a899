"""The zygote processes of the ``"fork"`` executor and the pool that hands them out.

A :class:`Zygote` is one pre-started sandbox runner (``_runner.py --zygote``) and the
parent's end of its ``SOCK_SEQPACKET`` control socket; :class:`ZygotePool` hands zygotes
out one caller at a time and grows to the peak concurrency. How a program runs on a
zygote, and why: :mod:`comlrl.envs.sandbox.zygote`.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading

from comlrl.envs.sandbox._process import RUNNER, scrubbed_env

__all__ = ["Zygote", "ZygoteError", "ZygotePool", "fork_available"]

_READY_TIMEOUT_S = 30.0  # a zygote's start-up (imports) on a very busy machine
_MAX_IDLE = 64
_RUNNER = RUNNER  # the runner script a zygote runs (tests point it elsewhere)
#: Seconds a closing zygote gets to sweep and exit before it is killed (see Zygote.close).
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


class Zygote:
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


def _retire(zygote: Zygote) -> None:
    """Stop a zygote that is not kept: gracefully while its process runs.

    A zygote marked broken (slow to answer on a busy machine) may still be sweeping its
    last program's processes. Closing its socket lets it finish that sweep and exit (see
    :meth:`Zygote.close`); a SIGKILL would hand its unreaped children to the trainer's
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
        self._idle: list[Zygote] = []
        self._busy: set[Zygote] = set()
        self._closed = False

    def acquire(self, netns: bool = False) -> Zygote:
        """An idle live zygote (one that was asked for a network namespace iff ``netns``),
        or a new one.

        Raises:
            ZygoteError: when a new zygote cannot be started.
        """
        dead: list[Zygote] = []
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
            zygote = Zygote(netns)
            with self._lock:
                self._busy.add(zygote)
        return zygote

    def release(self, zygote: Zygote) -> None:
        """Give a zygote back after its program was reaped (or drop it if unhealthy)."""
        with self._lock:
            self._busy.discard(zygote)
            keep = not self._closed and zygote.alive() and len(self._idle) < self.max_idle
            if keep:
                self._idle.append(zygote)
        if not keep:
            _retire(zygote)

    def discard(self, zygote: Zygote) -> None:
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
