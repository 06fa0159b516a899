"""The trainer's side of remote scoring: a batched joint reward backed by reward workers.

:class:`RemoteReward` is a :class:`comlrl.core.JointReward`: called with ``A`` lists of
``K`` completions and ``K`` examples it returns a :class:`comlrl.core.RewardBatch` of
``K`` rewards, like ``task.reward`` does locally. :class:`~comlrl.envs.remote.task.RemoteRewardTask` wraps a local
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

import os
import random
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.core import RewardBatch
from comlrl.envs.remote._dispatch import CallState, Chunk, Worker, make_chunks
from comlrl.envs.remote._protocol import TOKEN_ENV, WorkerAddress, parse_worker
from comlrl.envs.remote._transport import check_identity, probe, read_results, request
from comlrl.envs.remote.errors import (
    NoLiveWorkersError,
    RemoteRewardError,
    TransientError,
)

__all__ = [
    "RemoteReward",
    "HOST_LOCAL_KWARGS",
]

HOST_LOCAL_KWARGS = frozenset({"path", "limit", "train_range", "test_range", "max_workers"})
"""Task options that may differ between trainer and worker: where the data lives, which
rows are loaded, and the worker's own sandbox pool size. Other options must agree."""


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
        self._workers = [Worker(a) for a in addresses]
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
            except TransientError as exc:
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
            except TransientError as exc:
                w.dead, w.last_error = True, str(exc)
                continue
            self._check_identity(w.address, answer)
            w.dead, w.failures, w.ready_at, w.needs_probe = False, 0, 0.0, False
        live = [str(w.address) for w in self._workers if not w.dead]
        if not live:
            raise self._no_live_workers()
        return live

    def _check_identity(self, address: WorkerAddress, answer: Mapping[str, Any]) -> None:
        check_identity(
            address,
            answer,
            task_name=self.task_name,
            num_agents=self.num_agents,
            expect_kwargs=self.expect_kwargs,
            host_local=HOST_LOCAL_KWARGS,
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

    def _probe(self, address: WorkerAddress) -> dict[str, Any]:
        return probe(
            address,
            timeout_s=self.timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            token=self.token,
        )

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
        state = CallState(chunks, live)
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
            except TransientError as exc:
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
    ) -> list[Chunk]:
        return make_chunks(
            call_id,
            ids,
            completions,
            examples,
            live,
            task_name=self.task_name,
            chunk_size=self.chunk_size,
        )

    def _backoff(self, w: Worker) -> float:
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (w.failures - 1))
        return delay * (0.5 + 0.5 * self._rng.random())

    def _worker_loop(self, state: CallState, w: Worker, first: Chunk | None) -> None:
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
                    except TransientError as exc:
                        self._failed(state, w, chunk, f"health check: {exc}", count_attempt=False)
                        chunk = None
                        continue
                chunk.attempts += 1
                try:
                    status, answer = request(
                        w.address,
                        "POST",
                        "/v1/score",
                        chunk.body,
                        timeout_s=self.timeout_s,
                        connect_timeout_s=self.connect_timeout_s,
                        token=self.token,
                    )
                    results = read_results(w.address, chunk.request_id, chunk.ids, status, answer)
                except TransientError as exc:
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

    def _failed(
        self, state: CallState, w: Worker, chunk: Chunk, error: str, *, count_attempt: bool
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
