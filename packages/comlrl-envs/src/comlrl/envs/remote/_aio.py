"""The HTTP transport of the task server: an aiohttp application on an already bound
socket, served by an event loop on a background thread (extra ``comlrl-envs[serve]``)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["BackgroundApp", "bind", "is_loopback", "require_aiohttp"]

#: Seconds :meth:`BackgroundApp.stop` gives running requests to finish.
SHUTDOWN_S = 5.0
#: Seconds the rest of a refused request's body is read and dropped before the connection
#: closes (aiohttp's ``lingering_time``), so that the client reads the refusal.
LINGER_S = 2.0


def require_aiohttp(what: str) -> None:
    """Raise an :class:`ImportError` naming the extra when aiohttp is missing."""
    try:
        import aiohttp  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"{what} runs on aiohttp, which is not installed ({exc}): "
            "pip install 'comlrl-envs[serve]'"
        ) from None


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (``localhost``, ``127.0.0.0/8``,
    ``::1``); any other name or address (``0.0.0.0`` and ``""`` included) is not."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``(host, port)`` (port 0: the OS picks one).

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class BackgroundApp:
    """Serve the aiohttp application ``make_app`` builds on ``sock`` from a daemon thread.

    The application's server owns ``sock`` once started and closes it in :meth:`stop`.

    Args:
        sock: the bound, listening socket.
        make_app: called on the loop thread to build the ``aiohttp.web.Application``.
        name: the thread's name.
        idle_timeout_s: seconds a connection may take to send a request's head, or stay
            idle between requests, before it is closed (aiohttp's ``keepalive_timeout``,
            which also runs from the moment a connection opens).
    """

    def __init__(
        self,
        sock: socket.socket,
        make_app: Callable[[], Any],
        *,
        name: str,
        idle_timeout_s: float,
    ) -> None:
        self.sock, self.make_app, self.name = sock, make_app, name
        self.idle_timeout_s = idle_timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self._runner: Any = None

    def start(self) -> None:
        """Start serving; returns once the socket accepts requests.

        Raises:
            Exception: whatever stopped the application from starting.
        """
        from aiohttp import web

        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                runner = web.AppRunner(
                    self.make_app(),
                    access_log=None,
                    keepalive_timeout=self.idle_timeout_s,
                    lingering_time=LINGER_S,
                    shutdown_timeout=SHUTDOWN_S,
                )
                loop.run_until_complete(runner.setup())
                loop.run_until_complete(web.SockSite(runner, self.sock).start())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                loop.close()
                ready.set()
                return
            self.loop, self._runner = loop, runner
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self.thread = threading.Thread(target=main, name=self.name, daemon=True)
        self.thread.start()
        ready.wait()
        if failure:
            self.thread = None
            raise failure[0]

    def running(self) -> bool:
        """Whether the serving thread is alive."""
        return self.thread is not None and self.thread.is_alive()

    def stop(self) -> None:
        """Stop serving: close the socket and the connections (running requests get
        :data:`SHUTDOWN_S` seconds), then stop the loop. Safe to call twice.

        The caller waits on the cleanup itself, not only on the thread: a ``join`` that a
        signal interrupted may return before the thread ends (CPython gh-90882), and the
        socket must not be closed under the loop.
        """
        loop, runner, thread = self.loop, self._runner, self.thread
        self.loop = self._runner = self.thread = None
        if loop is None or thread is None or loop.is_closed():
            return
        try:
            if loop.is_running():
                cleanup = asyncio.run_coroutine_threadsafe(runner.cleanup(), loop)
                cleanup.result(SHUTDOWN_S + 10.0)
        finally:
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:  # the loop has closed already
                pass
            thread.join(SHUTDOWN_S + 10.0)
