"""SandboxPool back-pressure: bounded in-flight work, results in input order."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from comlrl.envs.sandbox import SandboxLimits, SandboxPool
from comlrl.envs.sandbox.pool import bounded_map
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=40, deadline=None)
@given(
    items=st.lists(st.integers(), max_size=60),
    workers=st.integers(1, 4),
    window=st.integers(1, 8),
)
def test_bounded_map_keeps_order_and_never_exceeds_the_window(
    items: list[int], workers: int, window: int
) -> None:
    lock = threading.Lock()
    submitted = 0
    finished = 0
    peak = 0

    def fn(x: int) -> int:
        nonlocal finished
        with lock:
            finished += 1
        return x * 2

    def tracked():  # type: ignore[no-untyped-def]
        nonlocal submitted, peak
        for x in items:
            with lock:
                submitted += 1
                peak = max(peak, submitted - finished)
            yield x

    with ThreadPoolExecutor(workers) as ex:
        out = bounded_map(ex, fn, tracked(), window)
    assert out == [2 * x for x in items]
    # one more may be pulled from the iterator before the oldest is awaited
    assert peak <= window + 1


def test_bounded_map_cancels_the_rest_on_error() -> None:
    calls: list[int] = []

    def fn(x: int) -> int:
        calls.append(x)
        if x == 1:
            raise RuntimeError("boom")
        time.sleep(0.01)
        return x

    with ThreadPoolExecutor(1) as ex, pytest.raises(RuntimeError, match="boom"):
        bounded_map(ex, fn, range(100), 3)
    assert len(calls) < 10, "work past the window was started after the error"


def test_pool_rejects_a_bad_window() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        SandboxPool(2, max_in_flight=0)


def test_pool_with_a_window_of_one_still_runs_everything_in_order() -> None:
    codes = [f"print({i})" for i in range(6)]
    with SandboxPool(2, max_in_flight=1) as pool:
        out = pool.run_many(codes, SandboxLimits(timeout_s=10.0))
    assert [r.stdout for r in out] == [f"{i}\n" for i in range(6)]
