"""How one remote-scoring call hands its joint actions to the worker threads.

The ``K`` joint actions are cut into chunks (:func:`make_chunks`); the worker threads of
the call share a :class:`CallState`: the queue of pending chunks (a failed chunk goes back
to its head, to a worker that has not failed it), the results by joint-action id
(duplicates dropped and counted) and the first fatal error.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from comlrl.envs.remote._protocol import PROTOCOL_VERSION, WorkerAddress

__all__ = ["CallState", "Chunk", "Worker", "make_chunks"]


@dataclass
class Worker:
    """One reward worker's standing with this client."""

    address: WorkerAddress
    failures: int = 0  # in a row
    ready_at: float = 0.0  # monotonic time before which it gets no work
    dead: bool = False
    last_error: str = "no request sent yet"
    needs_probe: bool = False


@dataclass
class Chunk:
    """One scoring request: a run of joint actions and its JSON body."""

    index: int
    request_id: str
    ids: list[str]
    body: bytes
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    failed_on: set[WorkerAddress] = field(default_factory=set)


def make_chunks(
    call_id: str,
    ids: list[str],
    completions: Sequence[Sequence[str]],
    examples: Sequence[Mapping[str, Any]],
    live: int,
    *,
    task_name: str,
    chunk_size: int | None,
) -> list[Chunk]:
    """Cut ``K`` joint actions into scoring requests, one :class:`Chunk` each.

    Joint actions that answer the same example object (one prompt's group) stay in one
    chunk unless ``chunk_size`` is set and the group is larger; chunks hold about
    ``K / (2 * live)`` joint actions (``chunk_size`` when given). Each chunk's body sends
    each distinct example once.

    Args:
        call_id: the call's id; chunk ``n``'s ``request_id`` is ``"<call_id>/<n>"``.
        ids: the ``K`` joint-action ids.
        completions: ``A`` sequences of ``K`` completion texts.
        examples: ``K`` examples (JSON-serialisable mappings).
        live: how many workers are live.
        task_name: the task the request names.
        chunk_size: joint actions per chunk, or ``None`` for the automatic size.

    Raises:
        ValueError: an example cannot be sent as JSON (naming the joint actions).
    """
    k = len(ids)
    # runs of joint actions that answer the same example object (one prompt's group)
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, k + 1):
        if i == k or examples[i] is not examples[start]:
            runs.append((start, i))
            start = i
    target = chunk_size or max(1, -(-k // (2 * live)))
    spans: list[tuple[int, int]] = []
    for lo, hi in runs:
        if spans and spans[-1][1] == lo and spans[-1][1] - spans[-1][0] + (hi - lo) <= target:
            spans[-1] = (spans[-1][0], hi)
        elif hi - lo > target and chunk_size is not None:
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
            "task": task_name,
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
        chunks.append(Chunk(n, request_id, ids[lo:hi], body))
    return chunks


class CallState:
    """What the worker threads of one call share (all fields under ``cond``)."""

    def __init__(self, chunks: list[Chunk], live: list[Worker]) -> None:
        self.cond = threading.Condition()
        self.pending: deque[Chunk] = deque()
        self.results: dict[str, tuple[float, dict[str, Any]]] = {}
        self.duplicates = 0
        self.items_by_worker: dict[str, int] = {str(w.address): 0 for w in live}
        self.workers = live
        self.fatal: BaseException | None = None
        self.stop = False
        self.running_threads = 0
        self.in_flight = len(chunks)  # chunks not yet delivered

    def take(self, w: Worker) -> Chunk | None:
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

    def _next_for(self, w: Worker) -> Chunk | None:
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
        self, w: Worker, chunk: Chunk, results: Mapping[str, tuple[float, dict[str, Any]]]
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

    def put_back(self, chunk: Chunk) -> None:
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
