"""Remote reward workers against local scoring: wall time per batch; prints a JSON report.

Usage::

    python packages/comlrl-envs/benchmarks/bench_remote_rewards.py [--humaneval PATH]
        [--repeats 5] [--out packages/comlrl-envs/benchmarks/results/remote_rewards.json]

Workers are real processes on this host (``python -m comlrl.envs.remote serve --port
0``), so the numbers hold the full cost of a remote call: JSON encoding, one HTTP request
per chunk, the worker's decoding and the answer. Two cases:

- ``gsm8k``: 256 joint actions (64 prompts x 4) of a reward that costs microseconds: the
  remote time is almost all transport overhead (reported per joint action);
- ``coop_humaneval``: the canonical solutions of the first 32 HumanEval problems, 2 joint
  actions each, scored in the sandbox; local with a sandbox pool of ``--pool`` processes,
  remote with 1 worker of ``--pool`` processes and with 2 workers of ``--pool / 2``.

Each measurement is repeated ``--repeats`` times (local and remote interleaved, so both see
the same background load) and reported as the median with min and max, in milliseconds.
Every remote batch is checked to equal the local rewards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from comlrl.core import get_task
from comlrl.envs.remote import RemoteReward


def start_worker(task: str, kwargs: dict[str, Any]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "comlrl.envs.remote", "serve", "--task", task]
        + ["--task-kwargs", json.dumps(kwargs), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise RuntimeError(f"worker for {task} did not start: {line!r}")
    return proc, line.split(" on ")[1].split()[0]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1e3, out


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def bench(
    task_name: str,
    local_kwargs: dict[str, Any],
    setups: dict[str, list[dict[str, Any]]],
    completions: list[list[str]],
    examples: list[Any],
    repeats: int,
) -> dict[str, Any]:
    local = get_task(task_name, **local_kwargs)
    expected = local.reward(completions, examples).rewards  # warm-up (pool start)
    procs: list[subprocess.Popen[str]] = []
    clients: dict[str, RemoteReward] = {}
    try:
        for label, worker_kwargs in setups.items():
            addresses = []
            for kw in worker_kwargs:
                proc, address = start_worker(task_name, kw)
                procs.append(proc)
                addresses.append(address)
            clients[label] = RemoteReward(addresses, task_name=task_name, timeout_s=300)
            assert clients[label](completions, examples).rewards == expected  # warm-up
        times: dict[str, list[float]] = {"local": [], **{k: [] for k in clients}}
        for _ in range(repeats):
            times["local"].append(timed(lambda: local.reward(completions, examples))[0])
            for label, client in clients.items():
                ms, batch = timed(lambda c=client: c(completions, examples))
                assert batch.rewards == expected, f"{label}: remote rewards differ from local"
                times[label].append(ms)
    finally:
        local.close()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    k = len(examples)
    out: dict[str, Any] = {
        "joint_actions": k,
        "ms_per_batch": {},
        "overhead_ms_per_joint_action": {},
    }
    for label, values in times.items():
        out["ms_per_batch"][label] = summary(values)
        if label != "local":
            extra = statistics.median(values) - statistics.median(times["local"])
            out["overhead_ms_per_joint_action"][label] = round(extra / k, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--humaneval", type=Path, default=None, help="HumanEval.jsonl.gz")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pool", type=int, default=2, help="sandbox processes (local / 1 worker)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "remote_rewards.json"
    )
    args = parser.parse_args()

    report: dict[str, Any] = {
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "repeats": args.repeats,
    }
    # --- gsm8k: transport overhead ------------------------------------------------------
    completions: list[list[str]] = [[], []]
    examples: list[Any] = []
    for n in range(64):
        ex = {"question": f"What is {n} + 1?", "answer": f"#### {n + 1}"}
        for j in range(4):
            completions[0].append(f"{n} + 1 = {n + 1 + j % 2}. #### {n + 1 + j % 2}")
            completions[1].append(f"#### {n + 1}")
            examples.append(ex)
    report["gsm8k"] = bench(
        "gsm8k",
        {},
        {"remote_1_worker": [{}], "remote_2_workers": [{}, {}]},
        completions,
        examples,
        args.repeats,
    )
    # --- coop_humaneval: sandboxed reward -------------------------------------------------
    path = str(args.humaneval) if args.humaneval else None
    base = {"path": path} if path else {}
    task = get_task("coop_humaneval", **base)
    rows = task.load("train")[:32]
    task.close()
    completions, examples = [[], []], []
    for row in rows:
        for helper in ("x):\n    return x\n", ""):
            completions[0].append(helper)
            completions[1].append(row["canonical_solution"])
            examples.append(row)
    half = max(1, args.pool // 2)
    report["coop_humaneval"] = bench(
        "coop_humaneval",
        {**base, "max_workers": args.pool},
        {
            "remote_1_worker": [{**base, "max_workers": args.pool}],
            "remote_2_workers": [{**base, "max_workers": half}, {**base, "max_workers": half}],
        },
        completions,
        examples,
        args.repeats,
    )
    text = json.dumps(report, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
