"""A reward worker: one task suite's reward served over HTTP to remote trainers.

The worker builds the task once (``get_task(name, **kwargs)``, or a ``"module:attr"``
factory) and answers ``POST /v1/score`` and ``GET /v1/health`` (wire format in
:mod:`comlrl.envs.remote._protocol`). It runs on aiohttp (extra ``comlrl-envs[serve]``,
the stack of :mod:`comlrl.envs.remote.task_server` too): an event loop on a background
thread hands each scoring request to a worker thread, at most ``max_concurrency`` at once,
so health checks are answered while a batch is being scored; the task's reward itself
runs one request at a time (the task's own sandbox pool gives the parallelism inside a
request, and task objects are not promised to be thread-safe).

Idempotency: each request carries a ``request_id``. A request whose id is being scored
already waits for that run and gets its answer; one whose id was answered recently (the
last ``cache_size`` ids) gets the stored answer. A client that retries a request on the
same worker after a dropped connection therefore never makes the task score it twice.

Model-written code reaches this process only as text; the task runs it in its sandbox.
Anyone who can reach the port can ask for code to be run in that sandbox: bind to a
cluster-internal address and set a shared token (``COMLRL_REMOTE_TOKEN``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from http import HTTPStatus
from importlib import import_module
from typing import Any

from comlrl.core import RewardBatch, Task, get_task
from comlrl.envs.remote._aio import BackgroundApp, bind, require_aiohttp
from comlrl.envs.remote._protocol import PROTOCOL_VERSION, dumps, is_number

__all__ = ["RewardServer", "build_task"]

log = logging.getLogger(__name__)

#: Exceptions from ``task.reward`` that mean the batch itself is wrong (same on any worker).
_CALLER_ERRORS = (ValueError, TypeError, KeyError, IndexError)


def build_task(spec: str, kwargs: Mapping[str, Any] | None = None) -> Task:
    """Build the task a worker serves.

    Args:
        spec: a registered task name (``comlrl tasks`` lists them), or ``"module:attr"``
            naming a :class:`comlrl.core.Task` subclass or factory to import.
        kwargs: keyword arguments for the task's constructor.

    Raises:
        comlrl.core.TaskNotFoundError: no task is registered under ``spec``.
        ImportError, AttributeError: ``"module:attr"`` does not import.
        TypeError: the factory did not build a :class:`comlrl.core.Task`.
    """
    kwargs = dict(kwargs or {})
    if ":" not in spec:
        return get_task(spec, **kwargs)
    module_name, _, attr = spec.partition(":")
    factory: Any = import_module(module_name)
    for part in attr.split("."):
        factory = getattr(factory, part)
    task = factory(**kwargs)
    if not isinstance(task, Task):
        raise TypeError(f"{spec!r} built a {type(task).__name__}, not a comlrl.core.Task")
    return task


class _RequestError(Exception):
    """A request the worker answers with an error status."""

    def __init__(self, status: HTTPStatus, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class _Pending:
    """A request id being scored; duplicates wait on ``done`` and reuse ``response``."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: tuple[int, bytes] = (500, b"")


class RewardServer:
    """Serve ``task.reward`` at ``http://host:port``.

    Args:
        task: the task whose reward is served (the server closes it in :meth:`close`).
        host: address to bind (``"127.0.0.1"``: this machine only; ``"0.0.0.0"``: all).
        port: TCP port; 0 lets the OS pick a free one (see :attr:`address`).
        token: shared secret clients must send (``Authorization: Bearer <token>``);
            ``None``: no check.
        task_kwargs: the task's constructor options, reported by the health check so a
            client can see that it scores the task it expects.
        cache_size: answered request ids remembered for idempotent retries.
        max_body_bytes: largest request accepted (413 beyond).
        max_concurrency: scoring requests handed to worker threads at once (more wait).

    Raises:
        ImportError: aiohttp is not installed (``pip install 'comlrl-envs[serve]'``).
        OSError: the address cannot be bound (e.g. port in use).
        ValueError: ``cache_size``, ``max_body_bytes`` or ``max_concurrency`` below 1.
    """

    def __init__(
        self,
        task: Task,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        task_kwargs: Mapping[str, Any] | None = None,
        cache_size: int = 256,
        max_body_bytes: int = 256 * 2**20,
        max_concurrency: int = 8,
    ) -> None:
        require_aiohttp("the reward worker")
        if cache_size < 1 or max_body_bytes < 1 or max_concurrency < 1:
            raise ValueError(
                "cache_size, max_body_bytes and max_concurrency must be >= 1, got "
                f"{cache_size}, {max_body_bytes}, {max_concurrency}"
            )
        self.max_concurrency = max_concurrency
        self.task = task
        self.token = token or None
        self.task_kwargs = dict(task_kwargs or {})
        self.cache_size = cache_size
        self.max_body_bytes = max_body_bytes
        self._lock = threading.Lock()  # guards the two maps and the counters
        self._task_lock = threading.Lock()  # one task.reward call at a time
        self._done: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._running: dict[str, _Pending] = {}
        self.requests_scored = 0
        self.items_scored = 0
        self.duplicates_served = 0
        self._started = time.time()
        self._sock = bind(host, port)
        self._app = BackgroundApp(
            self._sock,
            self._routes,
            name="comlrl-reward-server",
            client_max_size=max_body_bytes + 1,
            on_loop=self._make_semaphore,
        )
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)`` (the real port when constructed with ``port=0``)."""
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def serve_forever(self) -> None:
        """Answer requests until :meth:`shutdown` is called (from another thread)."""
        self.start()
        while self._app.running():
            self._app.thread.join(0.2)  # type: ignore[union-attr]

    def start(self) -> RewardServer:
        """Serve on a background daemon thread (its own event loop); returns ``self``."""
        self._app.start()
        return self

    def shutdown(self) -> None:
        """Stop accepting requests and answering (the event loop stops)."""
        self._app.stop()

    def _make_semaphore(self) -> None:
        self._semaphore = asyncio.Semaphore(self.max_concurrency)

    def _routes(self, app: Any) -> None:
        app.router.add_get("/v1/health", self._http_health)
        app.router.add_post("/v1/score", self._http_score)
        app.router.add_route("*", "/{tail:.*}", self._http_not_found)

    def close(self) -> None:
        """Stop serving, release the socket and close the task. Safe to call twice."""
        self.shutdown()
        self._sock.close()
        if not self._closed:
            self._closed = True
            self.task.close()

    # ------------------------------------------------------------------ HTTP (aiohttp)
    @staticmethod
    def _http(status: int, body: bytes) -> Any:
        from aiohttp import web

        return web.Response(status=status, body=body, content_type="application/json")

    async def _http_health(self, request: Any) -> Any:
        try:
            self.check_token(request.headers.get("Authorization"))
        except _RequestError as exc:
            return self._http(*_error(exc.status, exc.kind, exc.message))
        return self._http(200, dumps(self.health()))

    async def _http_not_found(self, request: Any) -> Any:
        return self._http(
            *_error(HTTPStatus.NOT_FOUND, "not_found", f"no endpoint {request.path!r}")
        )

    async def _http_score(self, request: Any) -> Any:
        try:
            self.check_token(request.headers.get("Authorization"))
            length = request.content_length
            if length is not None and length > self.max_body_bytes:
                raise _RequestError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    "too_large",
                    f"request of {length} bytes is over this worker's {self.max_body_bytes}; "
                    "send smaller chunks (chunk_size=)",
                )
            body = await request.read()
        except _RequestError as exc:
            return self._http(*_error(exc.status, exc.kind, exc.message))
        async with self._semaphore:
            loop = asyncio.get_running_loop()
            status, answer = await loop.run_in_executor(None, self.score, body)
        return self._http(status, answer)

    # ------------------------------------------------------------------ handlers
    def check_token(self, header: str | None) -> None:
        """Raise a 401 :class:`_RequestError` unless ``header`` carries the token."""
        if self.token is None:
            return
        expected = f"Bearer {self.token}"
        if header is None or not hmac.compare_digest(header.encode(), expected.encode()):
            raise _RequestError(
                HTTPStatus.UNAUTHORIZED,
                "unauthorized",
                "missing or wrong token; set the same COMLRL_REMOTE_TOKEN on the trainer "
                "and the worker",
            )

    def health(self) -> dict[str, Any]:
        """The health-check answer: task identity, load and counters."""
        with self._lock:
            busy = len(self._running)
            counts = (self.requests_scored, self.items_scored, self.duplicates_served)
        return {
            "status": "ok",
            "protocol": PROTOCOL_VERSION,
            "task": self.task.name,
            "num_agents": int(self.task.num_agents),
            "max_turns": int(self.task.max_turns),
            "kwargs": self.task_kwargs,
            "pid": os.getpid(),
            "in_flight": busy,
            "requests_scored": counts[0],
            "items_scored": counts[1],
            "duplicates_served": counts[2],
            "uptime_s": round(time.time() - self._started, 3),
        }

    def score(self, body: bytes) -> tuple[int, bytes]:
        """Answer one ``POST /v1/score`` body: ``(HTTP status, JSON body)``.

        Idempotent by ``request_id`` (see the module docstring).
        """
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(HTTPStatus.BAD_REQUEST, "bad_json", f"request body is not JSON: {exc}")
        request_id = payload.get("request_id") if isinstance(payload, dict) else None
        if not isinstance(request_id, str) or not request_id:
            return _error(
                HTTPStatus.BAD_REQUEST, "bad_request", "request needs a non-empty 'request_id'"
            )
        with self._lock:
            cached = self._done.get(request_id)
            if cached is not None:
                self.duplicates_served += 1
                self._done.move_to_end(request_id)
                return cached
            pending = self._running.get(request_id)
            owner = pending is None
            if pending is None:
                pending = self._running[request_id] = _Pending()
            else:
                self.duplicates_served += 1
        if not owner:
            pending.done.wait()
            return pending.response
        response: tuple[int, bytes] = (500, b"")
        try:
            response = self._score_payload(payload)
        except _RequestError as exc:
            response = _error(exc.status, exc.kind, exc.message)
        except BaseException as exc:  # answered, then the worker carries on
            log.exception("reward worker failed on request %s", request_id)
            response = _error(
                HTTPStatus.INTERNAL_SERVER_ERROR, "worker_error", f"{type(exc).__name__}: {exc}"
            )
            if not isinstance(exc, Exception):
                raise
        finally:
            with self._lock:
                pending.response = response
                del self._running[request_id]
                if response[0] == HTTPStatus.OK:
                    self._done[request_id] = response
                    while len(self._done) > self.cache_size:
                        self._done.popitem(last=False)
            pending.done.set()
        return response

    def _score_payload(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        task = self.task
        if payload.get("protocol") != PROTOCOL_VERSION:
            raise _RequestError(
                HTTPStatus.BAD_REQUEST,
                "protocol",
                f"client speaks protocol {payload.get('protocol')!r}, this worker "
                f"{PROTOCOL_VERSION}; install the same comlrl-envs on both sides",
            )
        if payload.get("task") != task.name:
            raise _RequestError(
                HTTPStatus.CONFLICT,
                "wrong_task",
                f"this worker serves task {task.name!r}, the request is for "
                f"{payload.get('task')!r}; start a worker with --task {payload.get('task')}",
            )
        examples, items = payload.get("examples"), payload.get("items")
        if not isinstance(examples, list) or not isinstance(items, list) or not items:
            raise _RequestError(
                HTTPStatus.BAD_REQUEST,
                "bad_request",
                "request needs 'examples' and non-empty 'items' lists",
            )
        ids: list[str] = []
        agent_major: list[list[str]] = [[] for _ in range(task.num_agents)]
        chosen: list[Any] = []
        for n, item in enumerate(items):
            ok = (
                isinstance(item, dict)
                and isinstance(item.get("id"), str)
                and isinstance(item.get("example"), int)
                and 0 <= item["example"] < len(examples)
                and isinstance(item.get("completions"), list)
                and len(item["completions"]) == task.num_agents
                and all(isinstance(c, str) for c in item["completions"])
            )
            if not ok:
                raise _RequestError(
                    HTTPStatus.BAD_REQUEST,
                    "bad_request",
                    f"item #{n} is not {{'id': str, 'example': index into examples, "
                    f"'completions': {task.num_agents} strings}}",
                )
            ids.append(item["id"])
            chosen.append(examples[item["example"]])  # shared object per example index
            for a, text in enumerate(item["completions"]):
                agent_major[a].append(text)
        if len(set(ids)) != len(ids):
            raise _RequestError(
                HTTPStatus.BAD_REQUEST, "bad_request", "item ids repeat within a request"
            )
        with self._task_lock:
            try:
                batch = task.reward(agent_major, chosen)
            except _CALLER_ERRORS as exc:
                raise _RequestError(
                    HTTPStatus.UNPROCESSABLE_ENTITY,
                    "task_rejected",
                    f"task {task.name!r} rejected the batch: {type(exc).__name__}: {exc}",
                ) from exc
        if not isinstance(batch, RewardBatch) or len(batch.rewards) != len(ids):
            got = len(batch.rewards) if isinstance(batch, RewardBatch) else type(batch).__name__
            raise _RequestError(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                "worker_error",
                f"task {task.name!r} returned {got} rewards for {len(ids)} joint actions",
            )
        bad = [r for r in batch.rewards if not is_number(r)]
        if bad:
            raise _RequestError(
                HTTPStatus.UNPROCESSABLE_ENTITY,
                "task_rejected",
                f"task {task.name!r} returned non-numeric rewards {bad[:3]!r}",
            )
        results = [
            {"id": i, "reward": float(r), "info": info}
            for i, r, info in zip(ids, batch.rewards, batch.infos, strict=True)
        ]
        with self._lock:
            self.requests_scored += 1
            self.items_scored += len(ids)
        host, port = self.address
        return 200, dumps(
            {
                "request_id": payload["request_id"],
                "results": results,
                "worker": {"pid": os.getpid(), "address": f"{host}:{port}"},
            }
        )


def _error(status: HTTPStatus, kind: str, message: str) -> tuple[int, bytes]:
    return int(status), dumps({"error": kind, "message": message})
