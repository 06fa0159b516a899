"""Run many sandboxed programs at once.

Each worker is a thread that drives one child process at a time (start it, feed its
instructions, read capped output, enforce the deadline), so the parallelism is in the
children; the threads mostly wait on pipes. With the ``"fork"`` executor each busy thread
uses its own fork server (process-wide, reused across pools; see
:mod:`comlrl.envs.sandbox.fork_executor`). Results come back in input order.

Back-pressure: a batch is not queued whole. At most ``max_in_flight`` programs of one call
are submitted (running or waiting for a worker) at any time; the next one is submitted
when the oldest finished, so a batch of 100 000 programs holds a bounded number of
payloads and futures, and several callers sharing a pool take turns.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from comlrl.envs.sandbox.executor import execute, run_python
from comlrl.envs.sandbox.harness import Verdict, check_payload, split_test, verdict_from_execution
from comlrl.envs.sandbox.limits import ExecutionResult, SandboxLimits

__all__ = ["CheckJob", "SandboxPool", "run_many", "bounded_map"]

T = TypeVar("T")
R = TypeVar("R")


def bounded_map(
    executor: ThreadPoolExecutor, fn: Callable[[T], R], items: Iterable[T], max_in_flight: int
) -> list[R]:
    """``[fn(x) for x in items]`` on ``executor``, in order, at most ``max_in_flight`` at once.

    Items are submitted lazily: the next one only after the oldest submitted one
    finished, so at most ``max_in_flight`` futures exist at any time. On an exception the
    futures not yet started are cancelled and the exception propagates.

    Raises:
        ValueError: when ``max_in_flight`` is below 1.
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight!r}")
    pending: deque[Future[R]] = deque()
    results: list[R] = []
    try:
        for item in items:
            if len(pending) >= max_in_flight:
                results.append(pending.popleft().result())
            pending.append(executor.submit(fn, item))
        while pending:
            results.append(pending.popleft().result())
    finally:
        for future in pending:
            future.cancel()
    return results


@dataclass(frozen=True, slots=True)
class CheckJob:
    """One program to score: see :func:`comlrl.envs.sandbox.check_solution` (the tests
    always run in a process of their own, the program in another)."""

    program: str
    test: str
    entry_point: str
    track_calls: tuple[str, ...] = ()


def default_workers() -> int:
    """Default worker count: the CPUs this process may use (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class SandboxPool:
    """A pool of ``max_workers`` threads, each driving one sandboxed child at a time.

    Use as a context manager or call :meth:`close`. Thread-safe: several callers may
    submit batches at once.

    Args:
        max_workers: concurrent children; ``None`` means the number of usable CPUs.
        max_in_flight: programs of one call submitted at once (running or queued for a
            worker); ``None`` means ``2 * max_workers`` (workers never wait for work).

    Raises:
        ValueError: when ``max_workers`` or ``max_in_flight`` is below 1.
    """

    def __init__(self, max_workers: int | None = None, max_in_flight: int | None = None) -> None:
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be >= 1 or None, got {max_workers!r}")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight!r}")
        self.max_workers = max_workers or default_workers()
        self.max_in_flight = max_in_flight or 2 * self.max_workers
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=self.max_workers, thread_name_prefix="comlrl-sandbox"
        )

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            raise RuntimeError("SandboxPool is closed; create a new one.")
        return self._executor

    def run_many(
        self, codes: Sequence[str], limits: SandboxLimits | None = None
    ) -> list[ExecutionResult]:
        """Run every program in ``codes`` (``[M]`` sources) and return ``M`` results."""
        lim = limits or SandboxLimits()
        return bounded_map(self._pool(), lambda c: run_python(c, lim), codes, self.max_in_flight)

    def check_many(
        self,
        jobs: Sequence[CheckJob],
        limits: SandboxLimits | None = None,
        *,
        assert_timeout_s: float | None = 2.0,
    ) -> list[Verdict]:
        """Score ``M`` :class:`CheckJob` s; returns ``M`` verdicts in order.

        Raises:
            ValueError: when a job's test source is malformed (checked before anything runs).
            SandboxUnavailableError: the OS refuses the isolation ``limits`` ask for.
        """
        lim = limits or SandboxLimits()
        plans = [split_test(job.test) for job in jobs]

        def one(i: int) -> Verdict:
            job, plan = jobs[i], plans[i]
            payload = check_payload(
                job.program,
                plan,
                job.entry_point,
                track_calls=job.track_calls,
                assert_timeout_s=assert_timeout_s,
            )
            return verdict_from_execution(execute(payload, lim), plan.num_units)

        return bounded_map(self._pool(), one, range(len(jobs)), self.max_in_flight)

    def close(self) -> None:
        """Wait for running programs and stop the workers. Safe to call twice."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_many(
    codes: Sequence[str],
    limits: SandboxLimits | None = None,
    max_workers: int | None = None,
) -> list[ExecutionResult]:
    """Run ``M`` programs with a temporary :class:`SandboxPool`; results in input order."""
    with SandboxPool(max_workers) as pool:
        return pool.run_many(codes, limits)
