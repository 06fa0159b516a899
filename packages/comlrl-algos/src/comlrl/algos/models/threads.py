"""Intra-op threads for small models on the CPU (:func:`small_model_threads`).

A model below :data:`SMALL_MODEL_PARAMS` parameters runs a decode step or a log-prob
forward/backward as a few hundred tensor ops of a few microseconds each. Intra-op threads
cannot speed such ops up, and each parallel region costs a wake-up and a barrier; on a
machine whose cores are busy with other processes a barrier waits for a descheduled
thread, and the whole step slows down many times over. Measured on the 2-core build
machine (``comlrl train batch_size=1 parallel_agents=false``, the built-in stories260k
agents, one after the other): at a load average of 14 the median update took 3.3 s with
2 intra-op threads and 0.18 s with 1; idle, one decode of 64 steps x 32 rows took 0.17 s
with 1 thread and 0.20 s with 2. Such models therefore run on one thread inside these
contexts; bigger models keep the caller's setting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["SMALL_MODEL_PARAMS", "small_model_threads"]

#: Below this many parameters a model's CPU work runs on one intra-op thread.
SMALL_MODEL_PARAMS = 20_000_000


@contextlib.contextmanager
def small_model_threads(model: Any, device: torch.device | str | None = None) -> Iterator[None]:
    """Run the body on one intra-op thread when ``model`` is small and on the CPU.

    torch's intra-op thread count is per Python thread (OpenMP), so this changes only the
    calling thread's count, and restores it on exit (also on an exception).

    Args:
        model: a ``torch.nn.Module`` (its parameters are counted).
        device: where the work runs; ``None`` means the device of the model's first
            parameter (a model without parameters counts as small, on the CPU).
    """
    before = torch.get_num_threads()
    params = list(model.parameters())
    if device is None:
        device = params[0].device if params else torch.device("cpu")
    small = sum(p.numel() for p in params) < SMALL_MODEL_PARAMS
    if torch.device(device).type != "cpu" or before == 1 or not small:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
