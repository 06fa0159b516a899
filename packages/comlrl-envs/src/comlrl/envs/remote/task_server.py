"""The task server: whole task suites (example references, prompts, multi-turn feedback,
tool calls, rewards) served over HTTP on aiohttp (extra ``comlrl-envs[serve]``).

A trainer trains on a served task through :class:`comlrl.envs.remote.client.RemoteTask`
(``task.remote=[HOST:PORT, ...]``): the task's data, sandboxes and tools live on the
serving machines. The wire format is :mod:`comlrl.envs.remote.wire` (``POST /v1/task``,
``GET /v1/health``); the command line is :mod:`comlrl.envs.remote.cli`.

Closed by default:

- **Token**: with a token (``COMLRL_REMOTE_TOKEN``), every request, the health check
  included, must carry ``Authorization: Bearer <token>`` (401 otherwise, before the body
  is read). Binding any address other than loopback without a token is refused.
- **Own data only**: ``load`` answers example references, never the examples (their
  tests and reference solutions stay here); ``prompts``, ``score`` and ``feedback`` name
  examples by reference and run on this server's copy, so a client cannot have its
  completions scored against tests it sends. ``feedback`` needs an info this server (or
  one sharing its token) sealed (:class:`~comlrl.envs.remote.served_task.ServedTask`).
- **Limits from the HTTP stack**: a body over ``max_body_bytes`` gets 413 (aiohttp's
  ``client_max_size``; a declared ``Content-Length`` over it is refused before reading);
  a body that has not arrived ``read_timeout_s`` after the request's head gets 408 and the
  connection is closed; a connection that does not send a request's head within
  ``read_timeout_s`` (or idles that long between requests) is closed (aiohttp's
  ``keepalive_timeout``). Both checks run in one aiohttp middleware.
- **Request ids**: an answer is kept by request id together with the SHA-256 of the
  request body (operation and fields included). A request with an id that is running or
  was answered recently (the last ``cache_size`` ids) and the same body gets that answer
  without running again, so a client retrying after a dropped connection never has a
  batch scored twice; the same id with another body gets 409. Answers with status 5xx are
  not kept (a retry runs again).
- **Bounded concurrency**: at most ``max_concurrency`` task calls run at once (further
  requests wait); calls of one task run one at a time in a worker thread (task objects are
  not promised to be thread-safe), so ``/v1/health`` answers while a batch is scored;
  tool calls run concurrently, each for at most its tool's ``timeout_s``.
- **Versions**: a request of another protocol version gets 409 with both versions named.

Model-written code reaches this process only as text; the task runs it in its sandbox.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from comlrl.core import Task
from comlrl.envs.remote._aio import BackgroundApp, bind, is_loopback, require_aiohttp
from comlrl.envs.remote.served_task import CallError, ServedTask, dumps
from comlrl.envs.remote.wire import TASK_PROTOCOL, TOKEN_ENV

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "DEFAULT_READ_TIMEOUT_S",
    "TaskServer",
    "check_bind",
]

DEFAULT_PORT = 8471
"""The TCP port a task server binds unless told otherwise."""
DEFAULT_MAX_BODY_BYTES = 4 * 2**20
"""Largest request body a task server reads (4 MiB); clients split larger score batches."""
DEFAULT_READ_TIMEOUT_S = 30.0
"""Seconds a client has to send a request's head, and then its body."""

#: Exceptions from a task that mean the call itself is wrong (the same on any server).
_CALLER_ERRORS = (ValueError, TypeError, KeyError, IndexError)
#: Refusals answered before the body is read: the connection is closed after them.
_CLOSE_AFTER = {401, 408, 413}
#: The error kinds of aiohttp's own refusals.
_HTTP_KINDS = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve ``host`` without a token unless it is loopback.

    Raises:
        ValueError: ``host`` is not a loopback address and ``token`` is empty; the message
            says how to set one.
    """
    if token or is_loopback(host):
        return
    raise ValueError(
        f"refusing to serve on {host!r} without a token: anyone who reaches the port could "
        f"run code in this machine's sandbox. Set the same token on the server and the "
        f"trainer, e.g. `export {TOKEN_ENV}=$(python -c 'import secrets; "
        f"print(secrets.token_urlsafe(32))')`, or bind 127.0.0.1"
    )


def _seal_key(token: str | None) -> bytes:
    """The key of the infos' seals: derived from the token (servers sharing a token
    accept each other's seals), else this process's own random key."""
    if not token:
        return os.urandom(32)
    return hashlib.sha256(b"comlrl task server seal\0" + token.encode()).digest()


class TaskServer:
    """Serve ``tasks`` at ``http://host:port`` (see the module docstring).

    Args:
        tasks: ``{name: task}``; the server closes them in :meth:`close`.
        host: address to bind (``"127.0.0.1"``: this machine only; any other needs a token).
        port: TCP port; 0 lets the OS pick one (see :attr:`address`).
        token: the shared token (``None``: none; only on a loopback address).
        task_kwargs: each task's constructor options, shown by the health check so a
            client can check it trains on the task it expects.
        max_concurrency: task calls running at once (>= 1).
        cache_size: answered request ids remembered for idempotent retries (>= 1).
        max_body_bytes: largest request body read (>= 1; 413 beyond).
        read_timeout_s: seconds a client has to send a request's head, and then its body
            (> 0; see the module docstring).

    Raises:
        ImportError: aiohttp is not installed (``pip install 'comlrl-envs[serve]'``).
        ValueError: no tasks, a number out of range, or a non-loopback ``host`` without
            a token (:func:`check_bind`).
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        tasks: Mapping[str, Task],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        task_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        max_concurrency: int = 8,
        cache_size: int = 1024,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    ) -> None:
        require_aiohttp("the task server")
        if not tasks:
            raise ValueError("a task server needs at least one task")
        if min(max_concurrency, cache_size, max_body_bytes) < 1 or not read_timeout_s > 0:
            raise ValueError(
                "max_concurrency, cache_size and max_body_bytes must be >= 1 and "
                f"read_timeout_s > 0, got {max_concurrency}, {cache_size}, {max_body_bytes}, "
                f"{read_timeout_s}"
            )
        self.token = token or None
        check_bind(host, self.token)
        key = _seal_key(self.token)
        kwargs = task_kwargs or {}
        self.served = {
            name: ServedTask(name, task, kwargs.get(name, {}), key) for name, task in tasks.items()
        }
        self.max_concurrency = max_concurrency
        self.cache_size = cache_size
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = float(read_timeout_s)
        self._done: OrderedDict[str, tuple[str, int, str]] = OrderedDict()
        self._running: dict[str, tuple[str, asyncio.Future[tuple[int, str]]]] = {}
        self._semaphore: asyncio.Semaphore | None = None
        #: task calls answered (tool calls included; cached answers not)
        self.calls = 0
        self.duplicates_served = 0
        self._started = time.time()
        self._sock = bind(host, port)
        bound = self._sock.getsockname()
        self._address = (str(bound[0]), int(bound[1]))
        self._app = BackgroundApp(
            self._sock, self._make_app, name="comlrl-task-server", idle_timeout_s=read_timeout_s
        )
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)``."""
        return self._address

    @property
    def tool_calls(self) -> int:
        """Tool calls run here (a repeated request id is not run again, not counted)."""
        return sum(s.tool_calls for s in self.served.values())

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> TaskServer:
        """Serve on a background thread with its own event loop; returns ``self``."""
        self._app.start()
        return self

    def running(self) -> bool:
        """Whether the server is serving."""
        return self._app.running()

    def serve_forever(self) -> None:
        """:meth:`start`, then block until Ctrl-C (or the server stops); then :meth:`close`."""
        self.start()
        stopped = threading.Event()
        try:
            while self._app.running():
                stopped.wait(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def close(self) -> None:
        """Stop serving, release the socket and close every task. Safe to call twice."""
        self._app.stop()
        self._sock.close()
        if not self._closed:
            self._closed = True
            for served in self.served.values():
                served.close()

    def _make_app(self) -> Any:
        from aiohttp import web

        self._semaphore = asyncio.Semaphore(self.max_concurrency)
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._middleware()])
        app.router.add_get("/v1/health", self._health)
        app.router.add_post("/v1/task", self._call)
        return app

    # ------------------------------------------------------------------ HTTP
    @staticmethod
    def _error(status: int, kind: str, message: str) -> Any:
        from aiohttp import web

        response = web.json_response({"error": kind, "message": message}, status=status)
        if status in _CLOSE_AFTER:
            response.force_close()
        return response

    def _check_token(self, header: str | None) -> None:
        if self.token is None:
            return
        expected = f"Bearer {self.token}".encode()
        if header is None or not hmac.compare_digest(header.encode(), expected):
            raise CallError(
                401,
                "unauthorized",
                f"missing or wrong token; set the same {TOKEN_ENV} on the trainer and the server",
            )

    async def _guard_inner(self, request: Any, handler: Any) -> Any:
        self._check_token(request.headers.get("Authorization"))
        if request.can_read_body:
            length = request.content_length
            if length is not None and length > self.max_body_bytes:
                raise CallError(
                    413,
                    "too_large",
                    f"a body of {length} bytes is over this server's {self.max_body_bytes}; "
                    "raise the server's --max-body-mib",
                )
            try:  # read whole here, under the timeout; the handler gets it from aiohttp
                await asyncio.wait_for(request.read(), self.read_timeout_s)
            except asyncio.TimeoutError:
                raise CallError(
                    408,
                    "read_timeout",
                    f"the request body did not arrive within {self.read_timeout_s:g} s",
                ) from None
        return await handler(request)

    def _middleware(self) -> Any:
        """The middleware: token, then the body read whole within the limits; every
        refusal (aiohttp's own included) answered as JSON."""
        from aiohttp import web

        @web.middleware
        async def guard(request: Any, handler: Any) -> Any:
            try:
                return await self._guard_inner(request, handler)
            except CallError as err:
                return self._error(err.status, err.kind, err.message)
            except web.HTTPException as exc:  # 404, 405, 413 from client_max_size
                if exc.status < 400:
                    raise
                kind = _HTTP_KINDS.get(exc.status, "http_error")
                hint = "; raise the server's --max-body-mib" if exc.status == 413 else ""
                return self._error(exc.status, kind, f"{exc.text}{hint}")

        return guard

    def health(self) -> dict[str, Any]:
        """The health answer: protocol, the tasks served, the limits, load and counters."""
        return {
            "status": "ok",
            "protocol": TASK_PROTOCOL,
            "tasks": {name: served.describe() for name, served in self.served.items()},
            "max_body_bytes": self.max_body_bytes,
            "read_timeout_s": self.read_timeout_s,
            "in_flight": len(self._running),
            "max_concurrency": self.max_concurrency,
            "calls": self.calls,
            "tool_calls": self.tool_calls,
            "duplicates_served": self.duplicates_served,
            "pid": os.getpid(),
            "uptime_s": time.time() - self._started,
        }

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response(self.health(), dumps=dumps)

    async def _call(self, request: Any) -> Any:
        from aiohttp import web

        raw = await request.read()
        try:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise CallError(400, "bad_request", f"the body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise CallError(400, "bad_request", "the body must be a JSON object")
            if body.get("protocol") != TASK_PROTOCOL:
                raise CallError(
                    409,
                    "protocol_mismatch",
                    f"the client speaks task protocol {body.get('protocol')!r}, this server "
                    f"{TASK_PROTOCOL}; install the same comlrl-envs version on both sides",
                )
            rid = body.get("request_id")
            if not isinstance(rid, str) or not rid:
                raise CallError(400, "bad_request", "request_id must be a non-empty string")
            if body.get("task") not in self.served:
                raise CallError(
                    404,
                    "unknown_task",
                    f"this server serves {sorted(self.served)}, not {body.get('task')!r}",
                )
            status, text = await self._once(rid, hashlib.sha256(raw).hexdigest(), body)
        except CallError as err:
            return self._error(err.status, err.kind, err.message)
        return web.Response(status=status, text=text, content_type="application/json")

    def _reused(self, rid: str) -> CallError:
        return CallError(
            409,
            "request_id_reused",
            f"request id {rid!r} was used before with another body; send each request "
            "under a fresh id (a retry resends the same body)",
        )

    async def _once(self, rid: str, digest: str, body: dict[str, Any]) -> tuple[int, str]:
        """Run a request once; a repeat with the same body shares its answer, one with
        another body is refused (see the module docstring)."""
        if rid in self._done:
            kept, status, text = self._done[rid]
            if kept != digest:
                raise self._reused(rid)
            self.duplicates_served += 1
            return status, text
        if rid in self._running:
            kept, running = self._running[rid]
            if kept != digest:
                raise self._reused(rid)
            self.duplicates_served += 1
            return await asyncio.shield(running)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, str]] = loop.create_future()
        self._running[rid] = (digest, future)
        try:
            assert self._semaphore is not None
            async with self._semaphore:
                answer = await loop.run_in_executor(None, self._answer, rid, body)
            self.calls += 1
            if answer[0] < 500:
                self._done[rid] = (digest, *answer)
                while len(self._done) > self.cache_size:
                    self._done.popitem(last=False)
            future.set_result(answer)
            return answer
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            del self._running[rid]

    def _answer(self, rid: str, body: Mapping[str, Any]) -> tuple[int, str]:
        """Run one call on its task (in a worker thread); ``(status, JSON text)``."""
        served = self.served[str(body["task"])]
        try:
            return 200, dumps({"request_id": rid, "result": served.call(body)})
        except CallError as err:
            return err.status, dumps({"error": err.kind, "message": err.message})
        except NotImplementedError as exc:
            return 422, dumps({"error": "not_implemented", "message": str(exc)})
        except _CALLER_ERRORS as exc:
            return 422, dumps({"error": "task_rejected", "message": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:  # the task failed here; another server may succeed
            return 500, dumps({"error": "task_failed", "message": f"{type(exc).__name__}: {exc}"})
