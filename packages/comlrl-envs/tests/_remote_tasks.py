"""Test-only task for tests/test_remote_workers.py, imported by the worker processes.

:class:`GatedGsm8kTask` is the real GSM8K reward behind a gate, so a test can hold a
worker inside a request for as long as it needs (to SIGKILL it there, or to let the
client's timeout fire) without sleeping for a guessed time:

- on entering ``reward`` it creates ``<gate_dir>/started-<pid>-<n>`` (the test waits for
  these files to know which requests are in flight);
- it then waits until ``<gate_dir>/open`` exists (``hang=True``: until
  ``<gate_dir>/release-hang`` exists), checking every 20 ms, for at most ``max_wait_s``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.core import RewardBatch
from comlrl.envs.math import Gsm8kTask


class GatedGsm8kTask(Gsm8kTask):
    """GSM8K (name ``gsm8k``) whose reward announces itself and waits at a file gate."""

    def __init__(self, gate_dir: str, hang: bool = False, max_wait_s: float = 120.0) -> None:
        super().__init__()
        self.gate_dir = Path(gate_dir)
        self.hang = hang
        self.max_wait_s = max_wait_s
        self._calls = itertools.count()

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        (self.gate_dir / f"started-{os.getpid()}-{next(self._calls)}").touch()
        gate = self.gate_dir / ("release-hang" if self.hang else "open")
        deadline = time.monotonic() + self.max_wait_s
        while not gate.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"gate {gate} did not open within {self.max_wait_s} s")
            time.sleep(0.02)
        return super().reward(completions, examples)
