"""The trainer's side of remote scoring: a batched joint reward backed by reward workers.

:class:`RemoteReward` is a :class:`comlrl.core.JointReward`: called with ``A`` lists of
``K`` completions and ``K`` examples it returns a :class:`comlrl.core.RewardBatch` of
``K`` rewards, like ``task.reward`` does locally. :class:`RemoteRewardTask` wraps a local
task (which still loads the data, builds prompts and turns reward infos into feedback)
and sends only the reward to the workers, so a run switches to remote scoring by
configuration (``task.remote_workers`` in the training config).

How one call is served (no reward lost, none duplicated):

1. Each joint action gets an id ``"<call uuid>:<k>"``. The ``K`` joint actions are cut
   into chunks at example boundaries (all joint actions of one prompt stay together),
   about two chunks per live worker; each chunk is a request with its own idempotent
   ``request_id``.
2. One thread per live worker sends one chunk at a time; the first chunk of worker ``w``
   is chunk ``w``, later chunks go to whichever worker is free.
3. A request that fails in transport (connection refused or reset, the worker died, no
   answer within ``timeout_s``) or with a worker error (HTTP 5xx) is put back at the head
   of the queue for the other live workers (it returns to a worker that failed it only
   when every live worker has); its worker backs off exponentially (with jitter)
   and must pass a health check before it gets work again, and is dropped after
   ``max_worker_failures`` failures in a row. A chunk is tried at most ``max_attempts``
   times.
4. Results are stored by joint-action id; a result for an id that already has one is
   dropped (counted in :attr:`RemoteReward.last_stats`), and a call returns only when
   every id has exactly one reward.

Errors: :class:`NoLiveWorkersError` when every worker is gone (it names each one and its
last error); :class:`RemoteTaskError` when a worker's task rejected the batch (HTTP 422,
not retried: any worker would do the same); :class:`RemoteRewardError` for the rest.
All three are :class:`comlrl.core.RewardFunctionError`, which the training command
reports as a failed reward without a traceback.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from comlrl.core import Feedback, JointAction, Prompt, RewardBatch, RewardFunctionError, Task
from comlrl.envs.remote._protocol import (
    PROTOCOL_VERSION,
    TOKEN_ENV,
    WorkerAddress,
    dumps,
    is_number,
    parse_worker,
)

__all__ = [
    "RemoteReward",
    "RemoteRewardTask",
    "RemoteRewardError",
    "RemoteTaskError",
    "NoLiveWorkersError",
    "HOST_LOCAL_KWARGS",
]

HOST_LOCAL_KWARGS = frozenset({"path", "limit", "train_range", "test_range", "max_workers"})
"""Task options that may differ between trainer and worker: where the data lives, which
rows are loaded, and the worker's own sandbox pool size. Other options must agree."""


class RemoteRewardError(RewardFunctionError):
    """Remote scoring failed (a chunk used up its attempts, a worker broke the protocol)."""


class RemoteTaskError(RemoteRewardError):
    """A worker's task rejected the batch (bad shapes or values); retrying elsewhere would
    not help."""


class NoLiveWorkersError(RemoteRewardError):
    """Every reward worker is unreachable or has failed too often.

    Attributes:
        errors: ``{"host:port": last error message}`` for every worker.
    """

    def __init__(self, message: str, errors: Mapping[str, str]) -> None:
        super().__init__(message)
        self.errors = dict(errors)


class _Transient(Exception):
    """A failure worth retrying on another worker."""


@dataclass
class _Worker:
    address: WorkerAddress
    failures: int = 0  # in a row
    ready_at: float = 0.0  # monotonic time before which it gets no work
    dead: bool = False
    last_error: str = "no request sent yet"
    needs_probe: bool = False


@dataclass
class _Chunk:
    index: int
    request_id: str
    ids: list[str]
    body: bytes
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    failed_on: set[WorkerAddress] = field(default_factory=set)


class RemoteReward:
    """Score joint actions on remote reward workers (a :class:`comlrl.core.JointReward`).

    Args:
        workers: ``"host:port"`` addresses of workers started with
            ``python -m comlrl.envs.remote serve``.
        task_name: the task the workers must serve (checked by the health check and on
            every request).
        num_agents: ``A``; checked against the workers' task (``None``: not checked).
        expect_kwargs: the task options the trainer built its task with; options outside
            :data:`HOST_LOCAL_KWARGS` must equal the workers' (``None``: not checked).
        timeout_s: seconds a worker may stay silent on a request (connect, send, or wait
            for the answer) before the request is retried elsewhere. Set it above the
            slowest chunk's scoring time.
        connect_timeout_s: seconds to wait for a TCP connection.
        max_attempts: tries per chunk before the call fails.
        max_worker_failures: failures in a row after which a worker is dropped; dropped
            workers are probed again at the start of the next call.
        backoff_s, max_backoff_s: a failed worker waits ``min(max_backoff_s, backoff_s *
            2**(failures - 1))`` seconds, times a random factor in ``[0.5, 1]``.
        chunk_size: joint actions per request (``None``: about ``K / (2 * live workers)``,
            rounded to whole prompts).
        token: shared secret (default: the ``COMLRL_REMOTE_TOKEN`` environment variable).
        check: run a health check of every worker now.

    Raises:
        ValueError: an address is not ``host:port``, the list is empty or repeats one, or
            a number is out of range.
        NoLiveWorkersError: ``check`` and no worker answers its health check.
        RemoteRewardError: ``check`` and a worker serves another task (or another
            ``num_agents`` or task options).
    """

    is_joint_reward = True

    def __init__(
        self,
        workers: Sequence[str | WorkerAddress],
        *,
        task_name: str,
        num_agents: int | None = None,
        expect_kwargs: Mapping[str, Any] | None = None,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 10.0,
        max_attempts: int = 3,
        max_worker_failures: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        chunk_size: int | None = None,
        token: str | None = None,
        check: bool = True,
    ) -> None:
        if isinstance(workers, str):
            workers = [workers]
        addresses = [parse_worker(w) for w in workers]
        if not addresses:
            raise ValueError("remote reward needs at least one worker address ('host:port')")
        repeated = sorted({str(a) for a in addresses if addresses.count(a) > 1})
        if repeated:
            raise ValueError(f"reward worker addresses repeat: {repeated}; list each worker once")
        for name, value, low in (
            ("timeout_s", timeout_s, 0.0),
            ("connect_timeout_s", connect_timeout_s, 0.0),
            ("backoff_s", backoff_s, -1e-300),
            ("max_backoff_s", max_backoff_s, -1e-300),
        ):
            if not value > low:
                raise ValueError(f"{name} must be > {max(low, 0)}, got {value}")
        for name, ivalue in (
            ("max_attempts", max_attempts),
            ("max_worker_failures", max_worker_failures),
        ):
            if ivalue < 1:
                raise ValueError(f"{name} must be >= 1, got {ivalue}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
        self.task_name = task_name
        self.num_agents = num_agents
        self.expect_kwargs = dict(expect_kwargs) if expect_kwargs is not None else None
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.max_attempts = max_attempts
        self.max_worker_failures = max_worker_failures
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.chunk_size = chunk_size
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self._workers = [_Worker(a) for a in addresses]
        self._rng = random.Random()
        self._call_lock = threading.Lock()
        #: counters of the last call: chunks, attempts, retries, duplicates dropped, per-worker items
        self.last_stats: dict[str, Any] = {}
        if check:
            self.check_health()

    @property
    def workers(self) -> list[str]:
        """The worker addresses, ``"host:port"``."""
        return [str(w.address) for w in self._workers]

    # ------------------------------------------------------------------ health
    def health(self) -> dict[str, dict[str, Any] | str]:
        """Ask every worker for its health: ``{"host:port": answer dict or error text}``."""
        out: dict[str, dict[str, Any] | str] = {}
        for w in self._workers:
            try:
                out[str(w.address)] = self._probe(w.address)
            except _Transient as exc:
                out[str(w.address)] = str(exc)
        return out

    def check_health(self) -> list[str]:
        """Probe every worker; mark the silent ones dead and return the live addresses.

        Raises:
            NoLiveWorkersError: no worker answers.
            RemoteRewardError: a worker answers for another task, agent count or options.
        """
        for w in self._workers:
            try:
                answer = self._probe(w.address)
            except _Transient as exc:
                w.dead, w.last_error = True, str(exc)
                continue
            self._check_identity(w.address, answer)
            w.dead, w.failures, w.ready_at, w.needs_probe = False, 0, 0.0, False
        live = [str(w.address) for w in self._workers if not w.dead]
        if not live:
            raise self._no_live_workers()
        return live

    def _check_identity(self, address: WorkerAddress, answer: Mapping[str, Any]) -> None:
        problems = []
        if answer.get("protocol") != PROTOCOL_VERSION:
            problems.append(
                f"protocol {answer.get('protocol')!r} (this client: {PROTOCOL_VERSION})"
            )
        if answer.get("task") != self.task_name:
            problems.append(f"task {answer.get('task')!r} (expected {self.task_name!r})")
        if self.num_agents is not None and answer.get("num_agents") != self.num_agents:
            problems.append(f"num_agents={answer.get('num_agents')!r} (expected {self.num_agents})")
        if self.expect_kwargs is not None:
            theirs = answer.get("kwargs") or {}
            keys = (set(theirs) | set(self.expect_kwargs)) - HOST_LOCAL_KWARGS
            differ = {
                k: (self.expect_kwargs.get(k, "<default>"), theirs.get(k, "<default>"))
                for k in sorted(keys)
                if _canonical(self.expect_kwargs.get(k)) != _canonical(theirs.get(k))
            }
            if differ:
                problems.append(
                    "task options "
                    + ", ".join(f"{k}={v[1]!r} (expected {v[0]!r})" for k, v in differ.items())
                )
        if problems:
            raise RemoteRewardError(
                f"reward worker {address} serves a different task: {'; '.join(problems)}. "
                f"Restart it with `python -m comlrl.envs.remote serve --task {self.task_name}` "
                "and the trainer's task options."
            )

    def _no_live_workers(self) -> NoLiveWorkersError:
        errors = {str(w.address): w.last_error for w in self._workers}
        lines = "\n".join(f"  - {a}: {e}" for a, e in errors.items())
        return NoLiveWorkersError(
            f"all {len(errors)} reward workers for task {self.task_name!r} are gone:\n{lines}\n"
            "Start them with `python -m comlrl.envs.remote serve --task "
            f"{self.task_name} --host HOST --port PORT`, or remove task.remote_workers to "
            "score locally.",
            errors,
        )

    # ------------------------------------------------------------------ transport
    def _request(
        self, address: WorkerAddress, method: str, path: str, body: bytes | None, timeout_s: float
    ) -> tuple[int, dict[str, Any]]:
        """One HTTP exchange; transport failures and unreadable answers raise :class:`_Transient`."""
        conn = http.client.HTTPConnection(
            address.host, address.port, timeout=self.connect_timeout_s
        )
        try:
            conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(timeout_s)
            headers = {"Content-Type": "application/json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            status = response.status
        except TimeoutError as exc:
            raise _Transient(f"no answer within {timeout_s:g} s ({exc or 'timed out'})") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise _Transient(f"HTTP {status} with a body that is not JSON: {raw[:200]!r}") from exc
        if not isinstance(answer, dict):
            raise _Transient(f"HTTP {status} with JSON that is not an object")
        return status, answer

    def _probe(self, address: WorkerAddress) -> dict[str, Any]:
        status, answer = self._request(
            address, "GET", "/v1/health", None, min(self.timeout_s, self.connect_timeout_s)
        )
        if status == 401:
            raise RemoteRewardError(f"reward worker {address}: {answer.get('message')}")
        if status != 200 or answer.get("status") != "ok":
            raise _Transient(
                f"health check answered HTTP {status}: {answer.get('message', answer)}"
            )
        return answer

    # ------------------------------------------------------------------ scoring
    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions on the workers.

        Args:
            completions: ``A`` sequences of ``K`` completion texts (agent-major).
            examples: ``K`` task examples (JSON-serialisable mappings).

        Returns:
            ``K`` rewards (floats, in the task's units) and ``K`` infos, in input order;
            infos come back through JSON (tuples as lists, other non-JSON values as
            their ``repr``).

        Raises:
            ValueError: the shapes disagree, or an example cannot be sent as JSON.
            NoLiveWorkersError: every worker is gone.
            RemoteTaskError: a worker's task rejected the batch.
            RemoteRewardError: a chunk failed ``max_attempts`` times.
        """
        with self._call_lock:  # one call at a time: workers' state is per client
            return self._score(completions, examples)

    def _score(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        k = len(examples)
        if self.num_agents is not None and len(completions) != self.num_agents:
            raise ValueError(
                f"{self.task_name} has {self.num_agents} agents but got {len(completions)} "
                "completion lists; pass one list of completions per agent."
            )
        if any(len(c) != k for c in completions):
            raise ValueError(
                f"got {[len(c) for c in completions]} completions per agent for {k} examples; "
                "each agent needs exactly one completion per joint action."
            )
        if k == 0:
            return RewardBatch([], [])
        self._revive_dead()
        live = [w for w in self._workers if not w.dead]
        if not live:
            raise self._no_live_workers()
        call_id = uuid.uuid4().hex
        ids = [f"{call_id}:{i}" for i in range(k)]
        chunks = self._make_chunks(call_id, ids, completions, examples, len(live))
        state = _CallState(chunks, live)
        threads = [
            threading.Thread(
                target=self._worker_loop,
                args=(state, w, chunks[n] if n < len(chunks) else None),
                name=f"comlrl-remote-{w.address}",
                daemon=True,
            )
            for n, w in enumerate(live)
        ]
        # the first len(live) chunks are handed out above; the rest wait in the queue
        state.pending.extend(chunks[len(live) :])
        state.running_threads = len(threads)
        for t in threads:
            t.start()
        with state.cond:
            while state.fatal is None and len(state.results) < k and state.running_threads > 0:
                state.cond.wait(timeout=1.0)
            state.stop = True
            state.cond.notify_all()
            fatal = state.fatal
            complete = len(state.results) == k
        if fatal is not None:
            raise fatal
        if not complete:
            raise self._no_live_workers()
        self.last_stats = {
            "joint_actions": k,
            "chunks": len(chunks),
            "attempts": sum(c.attempts for c in chunks),
            "retried_chunks": sum(1 for c in chunks if c.attempts > 1),
            "duplicates_dropped": state.duplicates,
            "items_by_worker": dict(state.items_by_worker),
            "errors": [e for c in chunks for e in c.errors],
        }
        rewards = [state.results[i][0] for i in ids]
        infos = [state.results[i][1] for i in ids]
        return RewardBatch(rewards, infos)

    def _revive_dead(self) -> None:
        for w in self._workers:
            if not w.dead:
                continue
            try:
                answer = self._probe(w.address)
            except _Transient as exc:
                w.last_error = str(exc)
                continue
            self._check_identity(w.address, answer)
            w.dead, w.failures, w.ready_at, w.needs_probe = False, 0, 0.0, False

    def _make_chunks(
        self,
        call_id: str,
        ids: list[str],
        completions: Sequence[Sequence[str]],
        examples: Sequence[Mapping[str, Any]],
        live: int,
    ) -> list[_Chunk]:
        k = len(ids)
        # runs of joint actions that answer the same example object (one prompt's group)
        runs: list[tuple[int, int]] = []
        start = 0
        for i in range(1, k + 1):
            if i == k or examples[i] is not examples[start]:
                runs.append((start, i))
                start = i
        target = self.chunk_size or max(1, -(-k // (2 * live)))
        spans: list[tuple[int, int]] = []
        for lo, hi in runs:
            if spans and spans[-1][1] == lo and spans[-1][1] - spans[-1][0] + (hi - lo) <= target:
                spans[-1] = (spans[-1][0], hi)
            elif hi - lo > target and self.chunk_size is not None:
                spans.extend((s, min(s + target, hi)) for s in range(lo, hi, target))
            else:
                spans.append((lo, hi))
        chunks = []
        for n, (lo, hi) in enumerate(spans):
            local: dict[int, int] = {}
            sent_examples: list[Mapping[str, Any]] = []
            items = []
            for i in range(lo, hi):
                key = id(examples[i])
                if key not in local:
                    local[key] = len(sent_examples)
                    sent_examples.append(examples[i])
                items.append(
                    {
                        "id": ids[i],
                        "example": local[key],
                        "completions": [str(c[i]) for c in completions],
                    }
                )
            request_id = f"{call_id}/{n}"
            payload = {
                "protocol": PROTOCOL_VERSION,
                "request_id": request_id,
                "task": self.task_name,
                "examples": sent_examples,
                "items": items,
            }
            try:
                body = json.dumps(payload, separators=(",", ":")).encode()
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"an example of joint actions {lo}..{hi - 1} cannot be sent to the reward "
                    f"workers as JSON ({exc}); keep dataset rows to str/int/float/bool/None/"
                    "lists/dicts"
                ) from None
            chunks.append(_Chunk(n, request_id, ids[lo:hi], body))
        return chunks

    def _backoff(self, w: _Worker) -> float:
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (w.failures - 1))
        return delay * (0.5 + 0.5 * self._rng.random())

    def _worker_loop(self, state: _CallState, w: _Worker, first: _Chunk | None) -> None:
        chunk = first
        try:
            while True:
                if chunk is None:
                    chunk = state.take(w)
                    if chunk is None:
                        return
                if w.needs_probe:  # a worker that failed must answer a health check first
                    try:
                        self._check_identity(w.address, self._probe(w.address))
                        w.needs_probe = False
                    except _Transient as exc:
                        self._failed(state, w, chunk, f"health check: {exc}", count_attempt=False)
                        chunk = None
                        continue
                chunk.attempts += 1
                try:
                    status, answer = self._request(
                        w.address, "POST", "/v1/score", chunk.body, self.timeout_s
                    )
                    results = self._read_results(w, chunk, status, answer)
                except _Transient as exc:
                    self._failed(state, w, chunk, str(exc), count_attempt=True)
                    chunk = None
                    continue
                w.failures, w.last_error = 0, "ok"
                state.deliver(w, chunk, results)
                chunk = None
        except RemoteRewardError as exc:
            state.fail(exc)
        except BaseException as exc:  # a bug here must not hang the caller
            state.fail(RemoteRewardError(f"remote scoring thread for {w.address} crashed: {exc!r}"))
            raise
        finally:
            state.thread_exited()

    def _read_results(
        self, w: _Worker, chunk: _Chunk, status: int, answer: Mapping[str, Any]
    ) -> dict[str, tuple[float, dict[str, Any]]]:
        message = str(answer.get("message", answer))
        if status == 422:
            raise RemoteTaskError(f"reward worker {w.address}: {message}")
        if status in (400, 401, 409, 413):
            raise RemoteRewardError(
                f"reward worker {w.address} refused the request (HTTP {status}): {message}"
            )
        if status != 200:
            raise _Transient(f"HTTP {status}: {message}")
        results = answer.get("results")
        if answer.get("request_id") != chunk.request_id or not isinstance(results, list):
            raise _Transient("answer does not match the request (request_id or results missing)")
        out: dict[str, tuple[float, dict[str, Any]]] = {}
        for r in results:
            if not (
                isinstance(r, dict) and r.get("id") in chunk.ids and is_number(r.get("reward"))
            ):
                raise _Transient(f"malformed result {str(r)[:200]}")
            info = r.get("info")
            out[r["id"]] = (float(r["reward"]), info if isinstance(info, dict) else {})
        if len(out) != len(chunk.ids):
            raise _Transient(f"answered {len(out)} of the chunk's {len(chunk.ids)} joint actions")
        return out

    def _failed(
        self, state: _CallState, w: _Worker, chunk: _Chunk, error: str, *, count_attempt: bool
    ) -> None:
        w.failures += 1
        w.last_error = error
        w.needs_probe = True
        w.ready_at = time.monotonic() + self._backoff(w)
        if w.failures >= self.max_worker_failures:
            w.dead = True
        if count_attempt:
            chunk.errors.append(f"{w.address}: {error}")
            chunk.failed_on.add(w.address)
        if count_attempt and chunk.attempts >= self.max_attempts:
            if all(x.failures > 0 for x in state.workers):  # none has answered since failing
                state.fail(self._no_live_workers())
            else:
                state.fail(
                    RemoteRewardError(
                        f"chunk {chunk.index} ({len(chunk.ids)} joint actions) of task "
                        f"{self.task_name!r} failed {chunk.attempts} times: "
                        + "; ".join(chunk.errors)
                        + ". Raise timeout_s if the workers are only slow."
                    )
                )
        state.put_back(chunk)


class _CallState:
    """What the worker threads of one call share (all fields under ``cond``)."""

    def __init__(self, chunks: list[_Chunk], live: list[_Worker]) -> None:
        self.cond = threading.Condition()
        self.pending: deque[_Chunk] = deque()
        self.results: dict[str, tuple[float, dict[str, Any]]] = {}
        self.duplicates = 0
        self.items_by_worker: dict[str, int] = {str(w.address): 0 for w in live}
        self.workers = live
        self.fatal: BaseException | None = None
        self.stop = False
        self.running_threads = 0
        self.in_flight = len(chunks)  # chunks not yet delivered

    def take(self, w: _Worker) -> _Chunk | None:
        """The next chunk for ``w`` (waiting out its backoff), or None when it should stop."""
        with self.cond:
            while True:
                if self.stop or self.fatal is not None or w.dead or self.in_flight == 0:
                    return None
                wait = w.ready_at - time.monotonic()
                if wait <= 0:
                    chunk = self._next_for(w)
                    if chunk is not None:
                        return chunk
                self.cond.wait(timeout=min(1.0, wait) if wait > 0 else 1.0)

    def _next_for(self, w: _Worker) -> _Chunk | None:
        """The first pending chunk that ``w`` has not failed, or one every live worker has
        failed (so a chunk goes back to a worker that failed it only as a last resort)."""
        for chunk in self.pending:
            if w.address not in chunk.failed_on:
                self.pending.remove(chunk)
                return chunk
        live = {x.address for x in self.workers if not x.dead}
        for chunk in self.pending:
            if live <= chunk.failed_on:
                self.pending.remove(chunk)
                return chunk
        return None

    def deliver(
        self, w: _Worker, chunk: _Chunk, results: Mapping[str, tuple[float, dict[str, Any]]]
    ) -> None:
        with self.cond:
            for key, value in results.items():
                if key in self.results:
                    self.duplicates += 1
                else:
                    self.results[key] = value
                    self.items_by_worker[str(w.address)] += 1
            self.in_flight -= 1
            self.cond.notify_all()

    def put_back(self, chunk: _Chunk) -> None:
        with self.cond:
            self.pending.appendleft(chunk)
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.fatal is None:
                self.fatal = exc
            self.cond.notify_all()

    def thread_exited(self) -> None:
        with self.cond:
            self.running_threads -= 1
            self.cond.notify_all()


def _canonical(value: Any) -> str:
    """Options compared as JSON, so a tuple equals the list it became on the wire."""
    return dumps(value).decode()


class RemoteRewardTask(Task):
    """A task whose reward is scored on remote workers; everything else stays local.

    Loading, prompts and feedback are the wrapped task's (the suites' feedback is a pure
    function of the example, the joint action and the reward info, which the workers
    return); :meth:`reward` goes to :class:`RemoteReward`.

    Args:
        task: the local task (its sandbox is never started by this wrapper).
        workers: ``"host:port"`` addresses of workers serving ``task.name``.
        task_kwargs: the options ``task`` was built with, checked against the workers'.
        **options: :class:`RemoteReward` options (``timeout_s``, ``max_attempts``, ...).

    Raises:
        As :class:`RemoteReward` (an unreachable worker set, a worker serving another task).
    """

    def __init__(
        self,
        task: Task,
        workers: Sequence[str | WorkerAddress],
        *,
        task_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self.local = task
        self.name = task.name
        self.num_agents = task.num_agents
        self.max_turns = task.max_turns
        self.remote = RemoteReward(
            workers,
            task_name=task.name,
            num_agents=task.num_agents,
            expect_kwargs=task_kwargs,
            **options,
        )

    def load(self, split: str = "train") -> Sequence[Mapping[str, Any]]:
        """The wrapped task's examples of ``split``."""
        return self.local.load(split)

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """The wrapped task's prompts."""
        return self.local.prompts(example, history)

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions on the workers (see :meth:`RemoteReward.__call__`)."""
        return self.remote(completions, examples)

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        """The wrapped task's feedback on the remotely scored joint action."""
        return self.local.feedback(example, joint_action, info, turn)

    def close(self) -> None:
        """Close the wrapped task. Safe to call twice."""
        self.local.close()

    def __getattr__(self, name: str) -> Any:
        # task-specific helpers (e.g. reference_program) come from the wrapped task
        if name == "local":
            raise AttributeError(name)
        return getattr(self.local, name)
