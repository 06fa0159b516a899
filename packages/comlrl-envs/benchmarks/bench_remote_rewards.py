"""Scoring on task servers against local scoring: wall time per batch; prints a JSON report.

Usage::

    python packages/comlrl-envs/benchmarks/bench_remote_rewards.py [--humaneval PATH]
        [--repeats 5] [--out packages/comlrl-envs/benchmarks/results/remote_rewards.json]

Servers are real processes on this host (``python -m comlrl.envs.remote --port 0``), so
the numbers hold the full cost of a remote reward call (:class:`RemoteTask`): JSON
encoding, one HTTP request per share of the batch (about two per server, in parallel), the
server's decoding and lookup of the examples it holds, and the answer. Two cases:

- ``coop_story``: 256 joint actions (64 prompts x 4) of a reward that costs microseconds:
  the remote time is almost all transport overhead (reported per joint action);
- ``coop_humaneval``: the canonical solutions of the first 32 HumanEval problems, 2 joint
  actions each, scored in the sandbox; local with a sandbox pool of ``--pool`` processes,
  remote with 1 server of ``--pool`` processes and with 2 servers of ``--pool / 2``.

Each measurement is repeated ``--repeats`` times (local and remote interleaved, so both see
the same background load) and reported as the median with min and max, in milliseconds.
Every remote batch is checked to equal the local rewards (a served example's reference
names the local example it is scored as).
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
from comlrl.envs.remote import RemoteTask


def start_server(task: str, kwargs: dict[str, Any]) -> tuple[subprocess.Popen[str], str]:
    options = [f"--option={task}.{k}={json.dumps(v)}" for k, v in kwargs.items()]
    proc = subprocess.Popen(
        [sys.executable, "-m", "comlrl.envs.remote", "--task", task, *options, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise RuntimeError(f"server for {task} did not start: {line!r}")
    return proc, line.split(" at ")[1].split()[0]


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
    rows: list[int],
    repeats: int,
) -> dict[str, Any]:
    """Time ``K`` joint actions (``completions``: ``A`` lists of ``K``), joint action ``k``
    answering example ``rows[k]`` of the train split, locally and on each setup's servers
    (``{label: [server options, one per server]}``)."""
    local = get_task(task_name, **local_kwargs)
    loaded = list(local.load("train"))
    examples = [loaded[i] for i in rows]
    expected = local.reward(completions, examples).rewards  # warm-up (pool start)
    procs: list[subprocess.Popen[str]] = []
    clients: dict[str, tuple[RemoteTask, list[Any]]] = {}
    try:
        for label, server_kwargs in setups.items():
            addresses = []
            for kw in server_kwargs:
                proc, address = start_server(task_name, kw)
                procs.append(proc)
                addresses.append(address)
            client = RemoteTask(task_name, addresses, timeout_s=300)
            served = client.load("train")
            clients[label] = client, [served[i] for i in rows]
            assert client.reward(completions, clients[label][1]).rewards == expected  # warm-up
        times: dict[str, list[float]] = {"local": [], **{k: [] for k in clients}}
        for _ in range(repeats):
            times["local"].append(timed(lambda: local.reward(completions, examples))[0])
            for label, (client, refs) in clients.items():
                ms, batch = timed(lambda c=client, r=refs: c.reward(completions, r))
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
    # --- coop_story: transport overhead -------------------------------------------------
    completions: list[list[str]] = [[], []]
    rows: list[int] = []
    words = ["the", "fox", "ran", "to", "the", "sea", "and", "was", "happy", "again"]
    for n in range(64):
        for j in range(4):
            completions[0].append(" ".join(words[: 3 + (n + j) % 8]))
            completions[1].append(" ".join(reversed(words[: 2 + j])))
            rows.append(n)
    story = {"limit": 64}
    report["coop_story"] = bench(
        "coop_story",
        story,
        {"remote_1_server": [story], "remote_2_servers": [story, story]},
        completions,
        rows,
        args.repeats,
    )
    # --- coop_humaneval: sandboxed reward -------------------------------------------------
    path = str(args.humaneval) if args.humaneval else None
    base: dict[str, Any] = {"path": path, "limit": 32} if path else {"limit": 32}
    task = get_task("coop_humaneval", **base)
    problems = task.load("train")
    task.close()
    completions, rows = [[], []], []
    for n, row in enumerate(problems):
        for helper in ("x):\n    return x\n", ""):
            completions[0].append(helper)
            completions[1].append(row["canonical_solution"])
            rows.append(n)
    half = max(1, args.pool // 2)
    report["coop_humaneval"] = bench(
        "coop_humaneval",
        {**base, "max_workers": args.pool},
        {
            "remote_1_server": [{**base, "max_workers": args.pool}],
            "remote_2_servers": [{**base, "max_workers": half}, {**base, "max_workers": half}],
        },
        completions,
        rows,
        args.repeats,
    )
    text = json.dumps(report, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
