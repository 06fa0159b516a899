"""A task server: whole task suites (examples, prompts, multi-turn feedback, tool calls,
rewards) served over HTTP on aiohttp (``comlrl serve``; extra ``comlrl-envs[serve]``).

A trainer with only ``comlrl-core`` and ``comlrl-algos`` installed trains on a served task
through :class:`comlrl.algos.rollout.remote_task.RemoteTask` (``task.remote=[HOST:PORT,
...]``): the task's data, sandboxes and feedback live on the serving machines. The wire
format is :mod:`comlrl.core.wire` (``POST /v1/task``, ``GET /v1/health``).

Guarantees:

- **Bounded concurrency**: at most ``max_concurrency`` task calls run at once (an asyncio
  semaphore; further requests wait); calls of one task run one at a time in a worker
  thread (task objects are not promised to be thread-safe), so ``/v1/health`` answers
  while a batch is scored.
- **Idempotent requests**: a request whose ``request_id`` is running waits for that run
  and gets its answer; one answered recently (the last ``cache_size`` ids) gets the stored
  answer, so a client retrying after a dropped connection never has a batch scored twice.
- **Tools**: the health answer declares each agent's tools (name, description, parameters
  schema, ``timeout_s``, ``max_result_chars``), the task's ``tool_format`` and
  ``max_tool_calls``; the ``tool`` op runs ``task.tools(agent)[name].run(**arguments)``
  here, on a thread of its own (tools, unlike the task's other calls, run concurrently,
  as in a local rollout), for at most the tool's ``timeout_s`` (then ``{"error":
  "timeout"}``; the thread is abandoned). A :class:`~comlrl.core.ToolError` comes back as
  ``{"error": "failed", "message": ...}``, any other exception as ``{"error": "raised",
  ...}``, with status 200 and cached like any answer: a retried tool call runs once.
- **Auth**: with a token (``COMLRL_REMOTE_TOKEN``), every request must carry
  ``Authorization: Bearer <token>`` (401 otherwise); the health check too.
- **Versions**: a request of another protocol version gets 409 with both versions named.

Model-written code reaches this process only as text; the task runs it in its sandbox.
Anyone who can reach the port can ask for code to be run there: bind to a
cluster-internal address and set a token.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from comlrl.core import Task, Tool, ToolError
from comlrl.core.wire import (
    TASK_PROTOCOL,
    decode_feedback,
    decode_joint_action,
    encode_feedback,
    encode_prompt,
)
from comlrl.envs.remote._aio import BackgroundApp, bind, require_aiohttp

__all__ = ["TaskServer"]

#: Exceptions from a task that mean the call itself is wrong (the same on any server).
_CALLER_ERRORS = (ValueError, TypeError, KeyError, IndexError)


class _Error(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=repr, allow_nan=True)


def _declare(tool: Tool) -> dict[str, Any]:
    """A tool's declaration as the health answer gives it (everything but ``run``)."""
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": dict(tool.parameters),
        "timeout_s": float(tool.timeout_s),
        "max_result_chars": int(tool.max_result_chars),
    }


def _run_tool(tool: Tool, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Run one tool call on a daemon thread for at most ``tool.timeout_s`` seconds.

    Returns:
        ``{"text": ...}`` (cut to ``max_result_chars + 1`` characters: the client cuts it
        again and notes the cut), or ``{"error": "failed" | "raised" | "timeout",
        "message": ...}``.
    """
    box: concurrent.futures.Future[str] = concurrent.futures.Future()

    def target() -> None:
        try:
            box.set_result(tool.run(**arguments))
        except BaseException as exc:  # noqa: BLE001 - sent back to the client
            box.set_exception(exc)

    threading.Thread(target=target, daemon=True, name=f"comlrl-tool-{tool.name}").start()
    try:
        out = box.result(timeout=tool.timeout_s)
    except ToolError as exc:
        return {"error": "failed", "message": str(exc)}
    except concurrent.futures.TimeoutError:
        return {
            "error": "timeout",
            "message": f"{tool.name} did not return within {tool.timeout_s:g} s on the server",
        }
    except Exception as exc:  # noqa: BLE001 - a fault of the tool, reported as "raised"
        return {"error": "raised", "message": f"{type(exc).__name__}: {exc}"}
    text = out if isinstance(out, str) else str(out)
    return {"text": text[: tool.max_result_chars + 1]}


class TaskServer:
    """Serve ``tasks`` at ``http://host:port`` (see the module docstring).

    Args:
        tasks: ``{name: task}``; the server closes them in :meth:`close`.
        host: address to bind (``"127.0.0.1"``: this machine only).
        port: TCP port; 0 lets the OS pick one (see :attr:`address`).
        token: shared secret (``None``: no check).
        task_kwargs: each task's constructor options, shown by the health check so a
            client can check it trains on the task it expects.
        max_concurrency: task calls running at once (>= 1).
        cache_size: answered request ids remembered for idempotent retries (>= 1).

    Raises:
        ImportError: aiohttp is not installed (``pip install 'comlrl-envs[serve]'``).
        OSError: the address cannot be bound.
        ValueError: no tasks, or ``max_concurrency``/``cache_size`` below 1.
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
    ) -> None:
        require_aiohttp("the task server")
        if not tasks:
            raise ValueError("a task server needs at least one task")
        if max_concurrency < 1 or cache_size < 1:
            raise ValueError(
                f"max_concurrency and cache_size must be >= 1, got {max_concurrency}, {cache_size}"
            )
        self.tasks = dict(tasks)
        self.token = token or None
        self.task_kwargs = {k: dict(v) for k, v in (task_kwargs or {}).items()}
        self.max_concurrency = max_concurrency
        self.cache_size = cache_size
        self._locks = {name: threading.Lock() for name in self.tasks}
        #: per task, per agent, its tools by name (asked once, here)
        self._tools: dict[str, list[dict[str, Tool]]] = {
            name: [{t.name: t for t in task.tools(a)} for a in range(int(task.num_agents))]
            for name, task in self.tasks.items()
        }
        self._done: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._running: dict[str, asyncio.Future[tuple[int, str]]] = {}
        self._loads: dict[tuple[str, str], list[Any]] = {}
        self.calls = 0
        #: tool calls run here (a repeated request id is not run again, not counted)
        self.tool_calls = 0
        self._tool_count_lock = threading.Lock()
        self.duplicates_served = 0
        self._started = time.time()
        self._sock = bind(host, port)
        self._app = BackgroundApp(
            self._sock,
            self._routes,
            name="comlrl-task-server",
            client_max_size=512 * 2**20,
            on_loop=self._make_semaphore,
        )
        self._semaphore: asyncio.Semaphore | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)``."""
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> TaskServer:
        """Serve on a background thread with its own event loop; returns ``self``."""
        self._app.start()
        return self

    def serve_forever(self) -> None:
        """:meth:`start`, then block until Ctrl-C; then :meth:`close`."""
        self.start()
        try:
            while self._app.running():
                self._app.thread.join(0.5)  # type: ignore[union-attr]
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def close(self) -> None:
        """Stop serving, release the socket and close every task. Safe to call twice."""
        self._app.stop()
        self._sock.close()
        for task in self.tasks.values():
            task.close()

    def _make_semaphore(self) -> None:
        self._semaphore = asyncio.Semaphore(self.max_concurrency)

    def _routes(self, app: Any) -> None:
        app.router.add_get("/v1/health", self._health)
        app.router.add_post("/v1/task", self._call)

    # ------------------------------------------------------------------ handlers
    def _check_token(self, header: str | None) -> None:
        if self.token is None:
            return
        expected = f"Bearer {self.token}".encode()
        if header is None or not hmac.compare_digest(header.encode(), expected):
            raise _Error(
                401,
                "unauthorized",
                "missing or wrong token; set the same COMLRL_REMOTE_TOKEN on the trainer and "
                "the server",
            )

    def health(self) -> dict[str, Any]:
        """The health answer: protocol, the tasks served (agents, turns, options, each
        agent's tool declarations, the tool format and calls per turn), load."""
        return {
            "status": "ok",
            "protocol": TASK_PROTOCOL,
            "tasks": {
                name: {
                    "num_agents": int(task.num_agents),
                    "max_turns": int(task.max_turns),
                    "kwargs": self.task_kwargs.get(name, {}),
                    "tools": [
                        [_declare(t) for t in by_name.values()] for by_name in self._tools[name]
                    ],
                    "tool_format": str(getattr(task, "tool_format", "json")),
                    "max_tool_calls": int(getattr(task, "max_tool_calls", 4)),
                }
                for name, task in self.tasks.items()
            },
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

        try:
            self._check_token(request.headers.get("Authorization"))
        except _Error as err:
            return web.json_response({"error": err.kind, "message": err.message}, status=401)
        return web.json_response(self.health(), dumps=_dumps)

    async def _call(self, request: Any) -> Any:
        from aiohttp import web

        try:
            self._check_token(request.headers.get("Authorization"))
            try:
                body = json.loads(await request.read())
            except ValueError as exc:
                raise _Error(400, "bad_request", f"the body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise _Error(400, "bad_request", "the body must be a JSON object")
            if body.get("protocol") != TASK_PROTOCOL:
                raise _Error(
                    409,
                    "protocol_mismatch",
                    f"the client speaks task protocol {body.get('protocol')!r}, this server "
                    f"{TASK_PROTOCOL}; install the same comlrl version on both sides",
                )
            rid = body.get("request_id")
            if not isinstance(rid, str) or not rid:
                raise _Error(400, "bad_request", "request_id must be a non-empty string")
            if body.get("task") not in self.tasks:
                raise _Error(
                    404,
                    "unknown_task",
                    f"this server serves {sorted(self.tasks)}, not {body.get('task')!r}",
                )
        except _Error as err:
            return web.json_response({"error": err.kind, "message": err.message}, status=err.status)
        status, text = await self._once(rid, body)
        return web.Response(status=status, text=text, content_type="application/json")

    async def _once(self, rid: str, body: dict[str, Any]) -> tuple[int, str]:
        """Run a request id once; duplicates share the answer (see the module docstring)."""
        if rid in self._done:
            self.duplicates_served += 1
            return self._done[rid]
        if rid in self._running:
            self.duplicates_served += 1
            return await asyncio.shield(self._running[rid])
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, str]] = loop.create_future()
        self._running[rid] = future
        try:
            assert self._semaphore is not None
            async with self._semaphore:
                answer = await loop.run_in_executor(None, self._answer, rid, body)
            self.calls += 1
            self._done[rid] = answer
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
        name = str(body["task"])
        try:
            if body.get("op") == "tool":  # tools run concurrently, as in a local rollout
                result = self._tool(name, body)
            else:
                with self._locks[name]:
                    result = self._run(self.tasks[name], name, body)
            return 200, _dumps({"request_id": rid, "result": result})
        except _Error as err:
            return err.status, _dumps({"error": err.kind, "message": err.message})
        except NotImplementedError as exc:
            return 422, _dumps({"error": "not_implemented", "message": str(exc)})
        except _CALLER_ERRORS as exc:
            return 422, _dumps(
                {"error": "task_rejected", "message": f"{type(exc).__name__}: {exc}"}
            )
        except Exception as exc:  # the task failed here; another server may succeed
            return 500, _dumps({"error": "task_failed", "message": f"{type(exc).__name__}: {exc}"})

    def _tool(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The ``tool`` op: ``{"agent": int, "name": str, "arguments": {...}}``."""
        agent, tool_name, arguments = body.get("agent"), body.get("name"), body.get("arguments")
        per_agent = self._tools[name]
        if not isinstance(agent, int) or not 0 <= agent < len(per_agent):
            raise _Error(
                400, "bad_request", f"agent must be an int in [0, {len(per_agent)}), got {agent!r}"
            )
        if not isinstance(arguments, dict):
            raise _Error(400, "bad_request", f"arguments must be an object, got {arguments!r}")
        tool = per_agent[agent].get(str(tool_name))
        if tool is None:
            raise _Error(
                404,
                "unknown_tool",
                f"agent {agent} of {name!r} has no tool {tool_name!r} "
                f"(tools: {sorted(per_agent[agent]) or 'none'})",
            )
        with self._tool_count_lock:
            self.tool_calls += 1
        return _run_tool(tool, arguments)

    def _run(self, task: Task, name: str, body: Mapping[str, Any]) -> Any:
        op = body.get("op")
        if op == "load":
            split = str(body.get("split", "train"))
            if (name, split) not in self._loads:
                self._loads[(name, split)] = [dict(ex) for ex in task.load(split)]
            return self._loads[(name, split)]
        if op == "prompts":
            history = [decode_feedback(h) for h in body.get("history", [])]
            return [encode_prompt(p) for p in task.prompts(body["example"], history)]
        if op == "feedback":
            action = decode_joint_action(body["joint_action"])
            feedback = task.feedback(
                body["example"], action, body.get("info", {}), int(body["turn"])
            )
            return encode_feedback(feedback)
        if op == "score":
            unique = body["examples"]
            examples = [unique[int(i)] for i in body["example_index"]]  # shared objects
            batch = task.reward(body["completions"], examples)
            return {"rewards": list(batch.rewards), "infos": list(batch.infos)}
        raise _Error(
            400, "bad_request", f"unknown op {op!r}; one of load, prompts, feedback, score, tool"
        )
