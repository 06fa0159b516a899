"""Test-only tasks for tests/test_remote_serving.py, imported by the server processes.

:class:`GatedTask` is a two-agent task with eight built-in examples and a cheap
deterministic reward behind a gate, so a test can hold a server inside a ``score``
request for as long as it needs (to SIGKILL it there) without sleeping for a guessed time:

- on entering ``reward`` it creates ``<gate_dir>/started-<pid>-<n>`` (the test waits for
  these files to know which requests are in flight);
- it then waits until ``<gate_dir>/open`` exists, checking every 20 ms, for at most
  ``max_wait_s``;
- after scoring it creates ``<gate_dir>/scored-<pid>-<n>-<k>``: that process scored ``k``
  joint actions in its ``n``-th call.

:func:`serve` runs a :class:`~comlrl.envs.remote.task_server.TaskServer` of it on a free
loopback port and prints ``serving gated at HOST:PORT`` (``python -c "import
_remote_tasks; _remote_tasks.serve(GATE_DIR)"`` with this folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.core import RewardBatch, Task


class GatedTask(Task):
    """Two agents, examples ``{"id": "q<i>", "n": i}``; reward ``len(a) - len(b) + n``."""

    name = "gated"
    num_agents = 2

    def __init__(self, gate_dir: str, max_wait_s: float = 120.0) -> None:
        self.gate_dir = Path(gate_dir)
        self.max_wait_s = max_wait_s
        self._calls = itertools.count()

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        return [{"id": f"q{i}", "n": i} for i in range(8)]

    def prompts(self, example: Mapping[str, Any], history: Sequence[Any] = ()) -> list[str]:
        return [f"question {example['n']}"] * 2

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        n = next(self._calls)
        (self.gate_dir / f"started-{os.getpid()}-{n}").touch()
        gate = self.gate_dir / "open"
        deadline = time.monotonic() + self.max_wait_s
        while not gate.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"gate {gate} did not open within {self.max_wait_s} s")
            time.sleep(0.02)
        rewards = [
            float(len(a) - len(b) + ex["n"])
            for a, b, ex in zip(*completions, examples, strict=True)
        ]
        (self.gate_dir / f"scored-{os.getpid()}-{n}-{len(rewards)}").touch()
        return RewardBatch(rewards)


def serve(gate_dir: str) -> None:
    """Serve a :class:`GatedTask` on loopback until the process is killed."""
    from comlrl.envs.remote.task_server import TaskServer

    server = TaskServer({"gated": GatedTask(gate_dir)}).start()
    host, port = server.address
    print(f"serving gated at {host}:{port}", flush=True)
    threading.Event().wait()
