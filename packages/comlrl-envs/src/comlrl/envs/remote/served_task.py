"""One task as a task server serves it: the operations of the remote protocol on a
:class:`~comlrl.core.Task`, on the server's own data.

:class:`ServedTask` answers ``load`` with example references only (the examples' tests
and reference solutions never leave this process), looks up every example a later call
names in its own copy, seals the infos of a multi-turn task's ``score`` and gives
``feedback`` only on sealed infos (wire format: :mod:`comlrl.envs.remote.wire`). The HTTP
side (token, limits, timeouts, the request-id cache) is
:class:`~comlrl.envs.remote.task_server.TaskServer`'s.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.core import Task, Tool, ToolError
from comlrl.envs.remote.wire import (
    SEAL_KEY,
    decode_feedback,
    decode_joint_action,
    encode_feedback,
    encode_prompt,
)

__all__ = ["CallError", "ServedTask", "dumps", "public_example", "seal"]


class CallError(Exception):
    """A call the server answers with an error: HTTP ``status``, an error ``kind`` and a
    ``message`` for the client."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def dumps(obj: Any) -> str:
    """``obj`` as JSON text: NaN/inf kept (Python's JSON extension), values JSON cannot
    hold as their ``repr``."""
    return json.dumps(obj, default=repr, allow_nan=True)


def public_example(split: str, index: int, example: Mapping[str, Any]) -> dict[str, Any]:
    """What a client gets for example ``index`` of ``split``: ``{"ref": [split, index],
    "id": ...}``, ``id`` being the example's ``task_id`` or ``id`` when it is a string or
    an int, else ``"split/index"``. Nothing else of the example leaves the server."""
    ident = example.get("task_id", example.get("id"))
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        ident = f"{split}/{index}"
    return {"ref": [split, index], "id": ident}


def seal(key: bytes, ref: Sequence[Any], completions: Sequence[str], info: Any) -> str:
    """HMAC-SHA256 (hex) of an example reference, a joint action's completions and its
    info (as JSON with sorted keys) under ``key``."""
    data = json.dumps(
        [list(ref), list(completions), info],
        sort_keys=True,
        separators=(",", ":"),
        default=repr,
        allow_nan=True,
    )
    return hmac.new(key, data.encode(), hashlib.sha256).hexdigest()


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


class ServedTask:
    """``task`` served under ``name`` (see the module docstring).

    Args:
        name: the name clients ask for.
        task: the task (closed by :meth:`close`).
        kwargs: its constructor options, shown by the health answer so a client can check
            that it trains on the task it expects.
        seal_key: the key of the infos' seals.
    """

    def __init__(self, name: str, task: Task, kwargs: Mapping[str, Any], seal_key: bytes) -> None:
        self.name, self.task, self.kwargs = name, task, dict(kwargs)
        self.seal_key = seal_key
        self.sealed = int(task.max_turns) > 1
        #: the task's calls run one at a time (task objects are not promised to be
        #: thread-safe); tool calls do not take it
        self.lock = threading.Lock()
        #: per agent, its tools by name (asked once, here)
        self.tools: list[dict[str, Tool]] = [
            {t.name: t for t in task.tools(a)} for a in range(int(task.num_agents))
        ]
        self._splits: dict[str, list[Mapping[str, Any]]] = {}
        #: tool calls run (a repeated request id is not run again, not counted)
        self.tool_calls = 0
        self._count_lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        """The task as the health answer describes it: agents, turns, options, each
        agent's tool declarations, the tool format and the tool calls per turn."""
        task = self.task
        return {
            "num_agents": int(task.num_agents),
            "max_turns": int(task.max_turns),
            "kwargs": self.kwargs,
            "tools": [[_declare(t) for t in by_name.values()] for by_name in self.tools],
            "tool_format": str(getattr(task, "tool_format", "json")),
            "max_tool_calls": int(getattr(task, "max_tool_calls", 4)),
        }

    def close(self) -> None:
        """Close the task. Safe to call twice."""
        self.task.close()

    def call(self, body: Mapping[str, Any]) -> Any:
        """Answer one request ``body`` (its ``op`` and fields); the result to send back.

        Raises:
            CallError: a malformed call (400), an unknown tool (404) or an info without
                this server's seal (421).
            Exception: whatever the task raised (the server maps it to 422 or 500).
        """
        op = body.get("op")
        if op == "tool":  # tools run concurrently, as in a local rollout
            return self.tool(body)
        with self.lock:
            if op == "load":
                return self.load(str(body.get("split", "train")))
            if op == "prompts":
                return self.prompts(body)
            if op == "score":
                return self.score(body)
            if op == "feedback":
                return self.feedback(body)
        raise CallError(
            400, "bad_request", f"unknown op {op!r}; one of load, prompts, feedback, score, tool"
        )

    # ------------------------------------------------------------------ examples
    def _split(self, split: str) -> list[Mapping[str, Any]]:
        if split not in self._splits:
            self._splits[split] = list(self.task.load(split))
        return self._splits[split]

    def example(self, data: Any) -> tuple[list[Any], Mapping[str, Any]]:
        """The reference and this server's example for ``data`` (``{"ref": [split,
        index], ...}``; every other field is ignored).

        Raises:
            CallError: 400 when ``data`` names no example of this task.
        """
        ref = data.get("ref") if isinstance(data, Mapping) else None
        if (
            not isinstance(ref, list)
            or len(ref) != 2
            or not isinstance(ref[0], str)
            or isinstance(ref[1], bool)
            or not isinstance(ref[1], int)
        ):
            raise CallError(
                400,
                "bad_example",
                f"an example is named by its reference {{'ref': [split, index]}} as `load` "
                f"answers it, got {str(data)[:200]}",
            )
        split, index = ref
        rows = self._split(split)
        if not 0 <= index < len(rows):
            raise CallError(
                400, "bad_example", f"{self.name!r} has no example {index} in split {split!r}"
            )
        return [split, index], rows[index]

    # ------------------------------------------------------------------ operations
    def load(self, split: str) -> dict[str, Any]:
        """``split``'s example references (:func:`public_example`) and the SHA-256 of its
        examples (``digest``: servers that answer the same digest hold the same data)."""
        rows = self._split(split)
        text = json.dumps(rows, sort_keys=True, default=repr, allow_nan=True)
        return {
            "examples": [public_example(split, i, ex) for i, ex in enumerate(rows)],
            "digest": hashlib.sha256(text.encode()).hexdigest(),
        }

    def prompts(self, body: Mapping[str, Any]) -> list[Any]:
        """The agents' prompts for ``body["example"]`` after ``body["history"]``."""
        _, example = self.example(body.get("example"))
        history = [decode_feedback(h) for h in body.get("history", [])]
        return [encode_prompt(p) for p in self.task.prompts(example, history)]

    def score(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Rewards and infos of ``K`` joint actions: ``body["completions"]`` (``A`` lists
        of ``K`` strings) on the examples ``body["examples"][i]`` for ``i`` in
        ``body["example_index"]`` (``K`` indices; one index, one example object)."""
        named = body.get("examples")
        index = body.get("example_index")
        completions = body.get("completions")
        if not isinstance(named, list) or not isinstance(index, list):
            raise CallError(400, "bad_request", "score needs 'examples' and 'example_index' lists")
        found = [self.example(data) for data in named]
        if not all(isinstance(i, int) and 0 <= i < len(found) for i in index):
            raise CallError(400, "bad_request", "example_index must index into 'examples'")
        if not (
            isinstance(completions, list)
            and all(isinstance(c, list) and all(isinstance(t, str) for t in c) for c in completions)
        ):
            raise CallError(400, "bad_request", "completions must be lists of strings per agent")
        examples = [found[i][1] for i in index]  # one object per named example
        batch = self.task(completions, examples)
        if len(batch.rewards) != len(examples):
            raise RuntimeError(
                f"{self.name!r} returned {len(batch.rewards)} rewards for {len(examples)} "
                "joint actions"
            )
        infos: list[Any] = list(batch.infos)
        if self.sealed:
            infos = json.loads(dumps(infos))  # sealed as the client will hold them
            for k, info in enumerate(infos):
                texts = [c[k] for c in completions]
                info[SEAL_KEY] = seal(self.seal_key, found[index[k]][0], texts, info)
        return {"rewards": list(batch.rewards), "infos": infos}

    def feedback(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Feedback on a joint action that this server (or one sharing its token) scored:
        the info must carry its seal.

        Raises:
            CallError: 421 when the info's seal does not match.
        """
        ref, example = self.example(body.get("example"))
        action = decode_joint_action(body["joint_action"])
        info = dict(body.get("info") or {})
        got = info.pop(SEAL_KEY, None)
        want = seal(self.seal_key, ref, action.completions, info)
        if not isinstance(got, str) or not hmac.compare_digest(got, want):
            raise CallError(
                421,
                "unsealed_info",
                f"feedback of {self.name!r} is given only on an info that a server with this "
                "token scored for this example and joint action, unchanged; this one is "
                "not (another server without a shared token may have scored it)",
            )
        return encode_feedback(self.task.feedback(example, action, info, int(body["turn"])))

    def tool(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The ``tool`` op: ``{"agent": int, "name": str, "arguments": {...}}``. Arguments
        that do not fit the tool's schema (:meth:`comlrl.core.Tool.check_arguments`) come
        back as ``{"error": "malformed", "message": ...}`` and the tool does not run."""
        agent, tool_name, arguments = body.get("agent"), body.get("name"), body.get("arguments")
        if (
            isinstance(agent, bool)
            or not isinstance(agent, int)
            or not 0 <= agent < len(self.tools)
        ):
            raise CallError(
                400, "bad_request", f"agent must be an int in [0, {len(self.tools)}), got {agent!r}"
            )
        if not isinstance(arguments, dict):
            raise CallError(400, "bad_request", f"arguments must be an object, got {arguments!r}")
        tool = self.tools[agent].get(str(tool_name))
        if tool is None:
            raise CallError(
                404,
                "unknown_tool",
                f"agent {agent} of {self.name!r} has no tool {tool_name!r} "
                f"(tools: {sorted(self.tools[agent]) or 'none'})",
            )
        problem = tool.check_arguments(arguments)
        if problem is not None:  # the caller's malformed call: the tool does not run
            return {"error": "malformed", "message": f"Error: {problem}"}
        with self._count_lock:
            self.tool_calls += 1
        return _run_tool(tool, arguments)
