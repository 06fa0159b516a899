"""Sandbox overhead and HumanEval throughput; prints a JSON report (``--out`` saves it).

Usage::

    python packages/comlrl-envs/benchmarks/bench_sandbox.py [--humaneval PATH] [--out FILE]

Measures, per isolation setting: sequential wall time of a trivial program (the fixed cost
of one sandboxed run), and the per-program time of ``run_many`` over 64 trivial programs
with 1, 2 and 4 workers; then the time to check all canonical HumanEval solutions.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import time
from pathlib import Path

from comlrl.envs.sandbox import CheckJob, SandboxLimits, SandboxPool, run_many, run_python


def sequential(limits: SandboxLimits, n: int = 30) -> dict[str, float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        run_python("x = 1", limits)
        times.append(time.perf_counter() - start)
    return {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times)}


def pooled(limits: SandboxLimits, workers: int, n: int = 64) -> float:
    start = time.perf_counter()
    run_many(["x = 1"] * n, limits, max_workers=workers)
    return 1e3 * (time.perf_counter() - start) / n


def humaneval(path: Path, workers: int) -> dict[str, float]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    jobs = [
        CheckJob(r["prompt"] + r["canonical_solution"], r["test"], r["entry_point"]) for r in rows
    ]
    start = time.perf_counter()
    with SandboxPool(workers) as pool:
        verdicts = pool.check_many(jobs, SandboxLimits(timeout_s=10.0))
    elapsed = time.perf_counter() - start
    return {
        "problems": len(rows),
        "workers": workers,
        "seconds": elapsed,
        "all_passed": all(v.status == "passed" for v in verdicts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--humaneval", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report: dict[str, object] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }
    for label, limits in {
        "full_isolation": SandboxLimits(),
        "no_namespaces": SandboxLimits(allow_network=True, pid_namespace=False),
    }.items():
        report[label] = {
            "isolation": run_python("pass", limits).isolation,
            "sequential": sequential(limits),
            "run_many_ms_per_program": {w: pooled(limits, w) for w in (1, 2, 4)},
        }
    path = args.humaneval
    if path is None:
        from comlrl.envs.code import default_humaneval_path

        path = default_humaneval_path()
    report["humaneval_canonical"] = humaneval(path, os.cpu_count() or 1)
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
