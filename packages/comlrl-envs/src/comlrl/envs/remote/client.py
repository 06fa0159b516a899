"""A task served on other machines (``comlrl-serve``) as a local :class:`comlrl.core.Task`.

:class:`RemoteTask` sends every call of the task interface (``load``, ``prompts``,
``feedback``, ``reward``, tool calls) to task servers
(:mod:`comlrl.envs.remote.task_server`) as JSON over HTTP (wire format
:mod:`comlrl.envs.remote.wire`) with the standard library's client, so a trainer holds
neither the task's data nor its sandbox or tools: ``task.remote=[HOST:PORT, ...]`` in a
run's config. Nothing here imports torch or aiohttp.

- **Examples by reference**: :meth:`RemoteTask.load` gives ``{"ref": [split, index],
  "id": ...}`` per example; the servers score and prompt on their own copies.
- **Scoring spread over the servers**: a ``reward`` call of ``K`` joint actions is cut at
  prompt boundaries into about two requests per server (one with a single server; also
  cut so that no request exceeds the smallest server's body limit), sent in parallel.
- **Failover**: a call goes to the servers in turn, starting one further each call; a
  server that refuses the connection, drops it, answers 5xx or 408 or stays silent past
  ``timeout_s`` is skipped and the next one gets the same request; for :data:`DOWN_S`
  seconds after that it is asked last. A ``feedback`` that a server cannot verify (421: it
  did not seal the info) goes to the next server as well.
- **Idempotency, one reward per joint action**: a call keeps its request id and body
  across retries, and a server answers a repeated id from its cache, so a scored batch is
  never scored again on the server that scored it, and the trainer takes exactly one
  answer per request.
- **Tools**: :meth:`RemoteTask.tools` gives :class:`comlrl.core.Tool` s built from the
  servers' declarations, whose ``run`` runs the call on a server (its sandbox, its
  files): a :class:`~comlrl.core.ToolError` there is raised here as one (a ``"failed"``
  result), a tool past its ``timeout_s`` there as a :class:`TimeoutError` (``"timeout"``),
  any other failure of the tool as a :class:`RuntimeError` (``"raised"``);
  ``tool_format`` and ``max_tool_calls`` are the served task's.
- **Auth**: ``token`` (default ``COMLRL_REMOTE_TOKEN``) goes as a bearer token.
- **Versions**: the servers' health checks are read first: a server of another protocol
  version, one that refuses the token, does not serve the task, or serves it with other
  options is an error naming it, before any training.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.core import (
    Feedback,
    JointAction,
    RewardBatch,
    RewardFunctionError,
    Task,
    Tool,
    ToolError,
)
from comlrl.core.prompts import Prompt
from comlrl.envs.remote.wire import (
    TASK_PROTOCOL,
    TOKEN_ENV,
    decode_feedback,
    decode_prompt,
    encode_feedback,
    encode_joint_action,
)

__all__ = ["DOWN_S", "HOST_OPTIONS", "RemoteTask", "RemoteTaskUnavailable"]

#: Task options that may differ between the run and a server: where the data lies on that
#: host and the size of its sandbox pool (that the data is the same is checked at ``load``).
HOST_OPTIONS = frozenset({"path", "max_workers"})

#: Seconds a server that failed a call is asked last (after the others).
DOWN_S = 30.0
#: Statuses worth asking the next server: the server failed (5xx), the body did not reach
#: it in time (408), or it cannot verify a ``feedback`` info another server sealed (421).
_NEXT_SERVER = {408, 421}
#: Bytes of a score request besides its completions (fields, example references).
_BODY_SLACK = 4096


class RemoteTaskUnavailable(ConnectionError):
    """No task server answered a call (each server's failure is in the message)."""


class _Rejected(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def _url(address: str, path: str) -> str:
    address = address.strip().removeprefix("http://").rstrip("/")
    return f"http://{address}{path}"


def _canonical(value: Any) -> str:
    """Options compared as JSON, so a tuple equals the list it became on the wire."""
    return json.dumps(value, sort_keys=True, default=repr)


def _ref(example: Mapping[str, Any]) -> dict[str, Any]:
    """The reference a served example is named by in a call.

    Raises:
        ValueError: ``example`` is not one that :meth:`RemoteTask.load` gave.
    """
    ref = example.get("ref") if isinstance(example, Mapping) else None
    if not isinstance(ref, (list, tuple)) or len(ref) != 2:
        raise ValueError(
            "an example of a served task is one that RemoteTask.load gave "
            f"({{'ref': [split, index], 'id': ...}}), got {str(example)[:200]}"
        )
    return {"ref": list(ref)}


class RemoteTask(Task):
    """The task ``name`` as served by ``servers`` (see the module docstring).

    Args:
        name: the served task's name.
        servers: ``"host:port"`` of each task server.
        kwargs: the options the task must be served with (checked against each server's
            health answer, but for :data:`HOST_OPTIONS`; ``None``: not checked).
        token: bearer token (default: the ``COMLRL_REMOTE_TOKEN`` environment variable).
        timeout_s: seconds a server may stay silent on a call before the next one is tried.

    Raises:
        ValueError: no servers, a server of another protocol version, one that refuses the
            token, does not serve ``name`` or serves it with other options, or servers that
            disagree on the task's agents, turns or tools.
        RemoteTaskUnavailable: no server answered the health check.
    """

    def __init__(
        self,
        name: str,
        servers: Sequence[str],
        *,
        kwargs: Mapping[str, Any] | None = None,
        token: str | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        if not servers:
            raise ValueError("a remote task needs at least one server address (HOST:PORT)")
        self.name = name
        self.servers = [str(s) for s in servers]
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.timeout_s = timeout_s
        self._next = 0
        self._next_lock = threading.Lock()  # tool calls come from the rollout's threads
        #: calls that a server failed and the next one answered or was asked (diagnostics)
        self.failovers = 0
        self._down_until: dict[str, float] = {}
        self._loaded: dict[str, list[dict[str, Any]]] = {}
        shapes, failures, limits = set(), [], []
        for server in self.servers:
            try:
                health = self._request(server, "GET", "/v1/health", None)
            except _Rejected as exc:
                if exc.status >= 500:
                    failures.append(f"{server}: {exc.message}")
                    continue
                raise ValueError(f"task server {server}: {exc.message}") from None
            except OSError as exc:
                failures.append(f"{server}: {exc}")
                continue
            if health.get("protocol") != TASK_PROTOCOL:
                raise ValueError(
                    f"task server {server} speaks task protocol {health.get('protocol')!r}, "
                    f"this client {TASK_PROTOCOL}; install the same comlrl-envs version on "
                    "both sides"
                )
            served = health.get("tasks") or {}
            if name not in served:
                raise ValueError(
                    f"task server {server} serves {sorted(served)}, not {name!r}; start it "
                    f"with `comlrl-serve --task {name}` or fix task.name"
                )
            info = served[name]
            theirs = {k: v for k, v in (info.get("kwargs") or {}).items() if k not in HOST_OPTIONS}
            if kwargs is not None and _canonical(theirs) != _canonical(
                {k: v for k, v in kwargs.items() if k not in HOST_OPTIONS}
            ):
                raise ValueError(
                    f"task server {server} serves {name!r} with options {info.get('kwargs')!r} "
                    f"but this run asks for {dict(kwargs)!r}; start the server with the run's "
                    "task options or set them to the server's"
                )
            limits.append(int(health.get("max_body_bytes") or 0))
            shapes.add(
                (
                    int(info["num_agents"]),
                    int(info["max_turns"]),
                    json.dumps(info.get("tools") or [], sort_keys=True),
                    str(info.get("tool_format", "json")),
                    int(info.get("max_tool_calls", 4)),
                )
            )
        if not shapes:
            raise RemoteTaskUnavailable(
                f"no task server answered for {name!r}: " + "; ".join(failures)
            )
        if len(shapes) > 1:
            raise ValueError(
                f"the task servers of {name!r} disagree on (agents, turns, tools, tool format, "
                f"tool calls per turn): {shapes}; serve the same task version and options"
            )
        self.num_agents, self.max_turns, tools, self.tool_format, self.max_tool_calls = shapes.pop()
        #: the largest score request to send: the smallest body limit the servers declare
        self.max_body_bytes = min((b for b in limits if b > 0), default=0) or None
        declared = json.loads(tools) or [[] for _ in range(self.num_agents)]
        self._tools = [
            tuple(self._remote_tool(a, d) for d in per_agent)
            for a, per_agent in enumerate(declared)
        ]

    # ------------------------------------------------------------------ transport
    def _request(
        self,
        server: str,
        method: str,
        path: str,
        body: bytes | None,
        timeout_s: float | None = None,
    ) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(_url(server, path), data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:  # noqa: S310
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                err = json.loads(exc.read())
            except ValueError:
                err = {}
            raise _Rejected(
                exc.code, str(err.get("error", "http_error")), str(err.get("message", exc))
            ) from None

    def _call(
        self, op: str, timeout_s: float | None = None, only: str | None = None, **fields: Any
    ) -> Any:
        """One call, failing over across the servers with one request id and body; a
        server silent for ``timeout_s`` (default :attr:`timeout_s`) is left for the next
        (``only``: ask that server alone).

        Raises:
            NotImplementedError: the task has no such call (single-turn ``feedback``).
            ValueError: the task rejected the call (the same on any server), or a
                protocol, token or task mismatch.
            RemoteTaskUnavailable: every server failed.
        """
        payload = {
            "protocol": TASK_PROTOCOL,
            "request_id": uuid.uuid4().hex,
            "task": self.name,
            "op": op,
            **fields,
        }
        body = json.dumps(payload).encode()
        with self._next_lock:
            start = self._next
            self._next = (self._next + 1) % len(self.servers)
        order = [self.servers[(start + i) % len(self.servers)] for i in range(len(self.servers))]
        now = time.monotonic()
        # servers that failed lately go last (still asked when the others fail too)
        order.sort(key=lambda s: self._down_until.get(s, 0.0) > now)
        if only is not None:
            order = [only]
        failures = []
        for server in order:
            try:
                return self._request(server, "POST", "/v1/task", body, timeout_s)["result"]
            except _Rejected as exc:
                if exc.status >= 500 or exc.status in _NEXT_SERVER:
                    failures.append(f"{server}: {exc.kind}: {exc.message}")
                    if exc.status != 421:  # 421: the server is well, the info not its own
                        self._failed(server)
                    continue
                if exc.kind == "not_implemented":
                    raise NotImplementedError(exc.message) from None
                raise ValueError(f"task server {server} refused {op!r}: {exc.message}") from None
            except OSError as exc:  # refused, reset, timed out
                failures.append(f"{server}: {exc}")
                self._failed(server)
        raise RemoteTaskUnavailable(
            f"no task server answered {op!r} of {self.name!r}: " + "; ".join(failures)
        )

    def _failed(self, server: str) -> None:
        """Count a failover and put ``server`` last for the next :data:`DOWN_S` seconds."""
        self.failovers += 1
        self._down_until[server] = time.monotonic() + DOWN_S

    def _remote_tool(self, agent: int, declared: Mapping[str, Any]) -> Tool:
        """A :class:`Tool` of agent ``agent`` as declared by the servers, run on them."""
        name = str(declared["name"])
        timeout_s = float(declared["timeout_s"])

        def run(**arguments: Any) -> str:
            # the rollout stops waiting after timeout_s; the request ends soon after it
            answer = self._call(
                "tool", timeout_s=timeout_s + 5.0, agent=agent, name=name, arguments=arguments
            )
            if "text" in answer:
                return str(answer["text"])
            if answer.get("error") == "failed":
                raise ToolError(str(answer.get("message", "")))
            if answer.get("error") == "timeout":  # a "timeout" result, as for a local tool
                raise TimeoutError(str(answer.get("message", "")))
            raise RuntimeError(
                f"tool {name!r} on the task server: {answer.get('error')}: {answer.get('message')}"
            )

        return Tool(
            name=name,
            description=str(declared.get("description", "")),
            parameters=dict(declared["parameters"]),
            run=run,
            timeout_s=timeout_s,
            max_result_chars=int(declared.get("max_result_chars", 2000)),
        )

    # ------------------------------------------------------------------ Task
    def tools(self, agent: int) -> tuple[Tool, ...]:
        """Agent ``agent``'s tools as the servers declare them; each call runs on a server.

        Raises:
            IndexError: ``agent`` is not in ``[0, num_agents)``.
        """
        if not 0 <= agent < len(self._tools):
            raise IndexError(f"agent {agent} of {self.name!r}: it has {len(self._tools)} agents")
        return self._tools[agent]

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        """The served task's ``split`` as example references (fetched once per split).

        Every server that answers is asked: a reference names an example by its place, so
        all of them must hold the same examples (the same digest of the split).

        Raises:
            ValueError: the servers hold different data for ``split``.
            RemoteTaskUnavailable: no server answered.
        """
        if split not in self._loaded:
            answers: dict[str, dict[str, Any]] = {}
            failures = []
            for server in self.servers:
                try:
                    answers[server] = self._call("load", only=server, split=split)
                except RemoteTaskUnavailable as exc:
                    failures.append(str(exc))
            if not answers:
                raise RemoteTaskUnavailable("; ".join(failures))
            digests = {server: a.get("digest") for server, a in answers.items()}
            if len(set(digests.values())) > 1:
                raise ValueError(
                    f"the task servers of {self.name!r} hold different examples in split "
                    f"{split!r} (digests {digests}); serve the same data on every server"
                )
            self._loaded[split] = list(next(iter(answers.values()))["examples"])
        return self._loaded[split]

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """The agents' prompts for ``example`` (a reference :meth:`load` gave)."""
        data = self._call(
            "prompts", example=_ref(example), history=[encode_feedback(h) for h in history]
        )
        return [decode_prompt(p) for p in data]

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        """The served task's feedback on a joint action that :meth:`reward` scored
        (``info`` as it returned it, seal included)."""
        data = self._call(
            "feedback",
            example=_ref(example),
            joint_action=encode_joint_action(joint_action),
            info=dict(info),
            turn=int(turn),
        )
        return decode_feedback(data)

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions on the servers, in parallel requests of whole prompts
        (see the module docstring).

        Raises:
            ValueError: the shapes disagree, or an example is not a served one.
            RewardFunctionError: the servers rejected or could not score the batch.
        """
        k = self.check_joint_batch(completions, examples)
        if k == 0:
            return RewardBatch([], [])
        texts = [[str(c[i]) for i in range(k)] for c in completions]
        spans = self._spans(texts, examples)
        jobs = [(lo, hi, self._score_fields(texts, examples, lo, hi)) for lo, hi in spans]
        try:
            if len(jobs) == 1:
                answers = [self._call("score", **jobs[0][2])]
            else:
                workers = min(len(jobs), len(self.servers))
                with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                    answers = list(pool.map(lambda job: self._call("score", **job[2]), jobs))
        except (ValueError, RemoteTaskUnavailable) as exc:
            raise RewardFunctionError(f"remote task {self.name!r}: {exc}") from None
        rewards: list[float] = []
        infos: list[dict[str, Any]] = []
        for (lo, hi, _), data in zip(jobs, answers, strict=True):
            got = [float(r) for r in data["rewards"]]
            if len(got) != hi - lo or len(data["infos"]) != hi - lo:
                raise RewardFunctionError(
                    f"remote task {self.name!r} returned {len(got)} rewards for {hi - lo} "
                    "joint actions"
                )
            rewards.extend(got)
            infos.extend(dict(i) for i in data["infos"])
        return RewardBatch(rewards, infos)

    def _spans(
        self, texts: list[list[str]], examples: Sequence[Mapping[str, Any]]
    ) -> list[tuple[int, int]]:
        """``[lo, hi)`` spans of the joint actions, one per score request: whole runs of
        one example (a prompt's group), about ``K / (2 * servers)`` joint actions each (all
        ``K`` with one server), none over the servers' body limit unless one run is."""
        k = len(examples)
        runs, start = [], 0
        for i in range(1, k + 1):
            if i == k or examples[i] is not examples[start]:
                runs.append((start, i))
                start = i
        parts = 1 if len(self.servers) == 1 else 2 * len(self.servers)
        target = -(-k // parts)
        limit = (self.max_body_bytes or 0) - _BODY_SLACK
        size = [sum(len(json.dumps(t[i])) + 2 for t in texts) for i in range(k)]
        spans: list[tuple[int, int]] = []
        for lo, hi in runs:
            if spans:
                first = spans[-1][0]
                heavy = limit > 0 and sum(size[first:hi]) > limit
                if hi - first <= target and not heavy:
                    spans[-1] = (first, hi)
                    continue
            spans.append((lo, hi))
        return spans

    def _score_fields(
        self,
        texts: list[list[str]],
        examples: Sequence[Mapping[str, Any]],
        lo: int,
        hi: int,
    ) -> dict[str, Any]:
        """The fields of one score request for joint actions ``lo..hi-1``: each distinct
        example object named once."""
        named: list[dict[str, Any]] = []
        index: list[int] = []
        seen: dict[int, int] = {}
        for ex in examples[lo:hi]:
            if id(ex) not in seen:
                seen[id(ex)] = len(named)
                named.append(_ref(ex))
            index.append(seen[id(ex)])
        return {
            "examples": named,
            "example_index": index,
            "completions": [t[lo:hi] for t in texts],
        }
