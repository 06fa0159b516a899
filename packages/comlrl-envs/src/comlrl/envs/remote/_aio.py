"""The HTTP transport both servers share (the reward worker, :mod:`.server`, and the task
server, :mod:`.task_server`): an aiohttp application on an already bound socket, served by
an event loop on a background thread (extra ``comlrl-envs[serve]``)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["BackgroundApp", "bind", "require_aiohttp"]


def require_aiohttp(what: str) -> None:
    """Raise an :class:`ImportError` naming the extra when aiohttp is missing."""
    try:
        import aiohttp  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"{what} runs on aiohttp, which is not installed ({exc}): "
            "pip install 'comlrl-envs[serve]'"
        ) from None


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``(host, port)`` (port 0: the OS picks one).

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class BackgroundApp:
    """Serve the aiohttp application ``routes`` builds on ``sock`` from a daemon thread.

    Args:
        sock: the bound, listening socket (not closed here).
        routes: called with the new ``aiohttp.web.Application`` to add its routes.
        name: the thread's name.
        client_max_size: largest request body aiohttp reads.
        on_loop: called on the loop thread before serving (e.g. to make semaphores there).
    """

    def __init__(
        self,
        sock: socket.socket,
        routes: Callable[[Any], None],
        *,
        name: str,
        client_max_size: int,
        on_loop: Callable[[], None] | None = None,
    ) -> None:
        self.sock, self.routes, self.name = sock, routes, name
        self.client_max_size, self.on_loop = client_max_size, on_loop
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

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
            self.loop = loop
            app = web.Application(client_max_size=self.client_max_size)
            self.routes(app)
            runner = web.AppRunner(app, access_log=None)
            try:
                if self.on_loop is not None:
                    self.on_loop()
                loop.run_until_complete(runner.setup())
                loop.run_until_complete(web.SockSite(runner, self.sock).start())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(runner.cleanup())
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
        """Stop the event loop and wait for the thread. Safe to call twice."""
        if self.loop is not None and self.thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        self.thread = None
