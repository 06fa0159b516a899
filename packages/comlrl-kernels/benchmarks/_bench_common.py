"""Helpers shared by the benchmark scripts (timing, peak memory, JSON output).

Peak memory, stated honestly per device:

- CUDA: ``torch.cuda.max_memory_allocated()`` minus the memory allocated before the case
  (inputs already on the device), i.e. the extra device memory the op needed at its peak.
- CPU: each case runs in a fresh subprocess; the number is the growth of the process's
  peak resident set (``getrusage(RUSAGE_SELF).ru_maxrss``) from just after the inputs
  were created to just after one run of the case. It counts every allocation the op
  touched (torch's CPU allocator returns large blocks to the OS, so reuse between cases
  cannot hide it), plus noise of a few MiB from lazily loaded code.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` in milliseconds (device synchronized around each run)."""
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def peak_mib(fn: Callable[[], Any], device: torch.device) -> float:
    """Extra peak memory of one call of ``fn`` (see the module docstring)."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    before = maxrss_mib()
    fn()
    return maxrss_mib() - before


def run_child(script: str, case: dict[str, Any]) -> dict[str, Any]:
    """Run one CPU case in a fresh interpreter (``script --child JSON``); return its JSON."""
    proc = subprocess.run(
        [sys.executable, script, "--child", json.dumps(case)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def environment(device: torch.device) -> dict[str, Any]:
    from comlrl.kernels import backend_info

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "backends": backend_info(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def save(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"saved {path}")
