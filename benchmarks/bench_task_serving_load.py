"""Load test of served tasks on loopback: several trainers, one task server killed mid-run.

Starts ``--servers`` task servers (``python -m comlrl.envs.remote --task coop_story``,
real processes), then ``--trainers`` threads, each with its own
:class:`~comlrl.envs.remote.client.RemoteTask` over all servers, each doing ``--rounds``
rounds of: ``prompts`` for an example, then ``score`` for ``--batch`` joint actions of
seeded random completions (one reward call, which the client spreads over the servers in
about two requests each). When half of all rounds are done, server 0 gets SIGKILL (no
goodbye: its connections drop mid-call). Every reward that comes back is compared with the
local task's reward for the same joint action (the served example's reference names the
local example).

Prints, per call kind, the latency percentiles (ms) and writes them with the counts to
``benchmarks/results/task_serving_load.json``: calls made, answered, failed (lost), wrong
rewards, joint actions scored vs sent, failovers (a server failed a call and the next
was asked), and the surviving servers' counters (requests
answered, duplicates served from the idempotency cache). Run from the repository root:

    python benchmarks/bench_task_serving_load.py [--trainers 4 --rounds 40 --batch 8]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any


def _start_server(limit: int) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "comlrl.envs.remote"]
    args = ["--task", "coop_story", "--option", f"coop_story.limit={limit}"]
    proc = subprocess.Popen(
        [*cmd, *args, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"serving coop_story at (\S+):(\d+) ", line)
    if not found:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return proc, f"{found[1]}:{found[2]}"


def _percentiles(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {}
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {
        "count": len(ms),
        "p50_ms": q[49],
        "p90_ms": q[89],
        "p99_ms": q[98],
        "max_ms": max(ms),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--trainers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--limit", type=int, default=32, help="examples of coop_story served")
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--out", default="benchmarks/results/task_serving_load.json")
    args = parser.parse_args()

    from comlrl.core import get_task
    from comlrl.envs.remote import RemoteTask

    local = get_task("coop_story", limit=args.limit)
    local_rows = list(local.load("train"))
    servers = [_start_server(args.limit) for _ in range(args.servers)]
    addresses = [address for _, address in servers]
    latencies: dict[str, list[float]] = {"load": [], "prompts": [], "score": []}
    counts = {"calls": 0, "answered": 0, "failed": 0, "wrong_rewards": 0, "sent": 0, "scored": 0}
    failures: list[str] = []
    lock = threading.Lock()
    done_rounds = [0]
    killed_at: list[float] = []
    failovers = [0] * args.trainers
    total_rounds = args.trainers * args.rounds
    start = time.perf_counter()

    def timed(kind: str, fn: Any, *a: Any) -> Any:
        t0 = time.perf_counter()
        with lock:
            counts["calls"] += 1
        try:
            out = fn(*a)
        except Exception as exc:
            with lock:
                counts["failed"] += 1
                failures.append(f"{kind}: {type(exc).__name__}: {exc}"[:300])
            return None
        with lock:
            counts["answered"] += 1
            latencies[kind].append((time.perf_counter() - t0) * 1000)
        return out

    def trainer(i: int) -> None:
        rng = random.Random(i)
        task = RemoteTask(
            "coop_story", addresses, kwargs={"limit": args.limit}, timeout_s=args.timeout_s
        )
        examples = timed("load", task.load, "train") or []
        for _ in range(args.rounds):
            ex = examples[rng.randrange(len(examples))]
            timed("prompts", task.prompts, ex)
            words = ["sea", "fox", "moon", "ran", "and", "the", "happy", "end", "a", "big"]
            comps = [
                [" ".join(rng.choices(words, k=rng.randint(3, 30))) for _ in range(args.batch)]
                for _ in range(2)
            ]
            exs = [ex] * args.batch
            batch = timed("score", task.reward, comps, exs)
            with lock:
                counts["sent"] += args.batch
            if batch is not None:
                mine = local_rows[int(ex["ref"][1])]
                want = local.reward(comps, [mine] * args.batch).rewards
                with lock:
                    counts["scored"] += len(batch.rewards)
                    counts["wrong_rewards"] += sum(
                        abs(a - b) > 1e-9 for a, b in zip(batch.rewards, want, strict=True)
                    ) + abs(len(batch.rewards) - len(want))
            with lock:
                done_rounds[0] += 1
                failovers[i] = task.failovers
                if not killed_at and done_rounds[0] >= total_rounds // 2:
                    servers[0][0].send_signal(signal.SIGKILL)
                    killed_at.append(time.perf_counter() - start)

    threads = [threading.Thread(target=trainer, args=(i,)) for i in range(args.trainers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    survivors = []
    for proc, address in servers[1:]:
        with urllib.request.urlopen(f"http://{address}/v1/health", timeout=30) as resp:
            health = json.loads(resp.read())
        survivors.append(
            {k: health[k] for k in ("calls", "duplicates_served", "in_flight", "max_concurrency")}
        )
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    servers[0][0].wait(60)
    result = {
        "setup": {
            "servers": args.servers,
            "trainers": args.trainers,
            "rounds_per_trainer": args.rounds,
            "joint_actions_per_score": args.batch,
            "task": f"coop_story (limit={args.limit})",
            "killed": f"server 0 by SIGKILL after {total_rounds // 2} of {total_rounds} rounds",
            "timeout_s": args.timeout_s,
            "machine": f"{platform.machine()}, {platform.python_version()}",
        },
        "wall_s": wall,
        "killed_at_s": killed_at[0] if killed_at else None,
        "latency": {kind: _percentiles(ms) for kind, ms in latencies.items()},
        "counts": counts,
        "lost_joint_actions": counts["sent"] - counts["scored"],
        "failovers": sum(failovers),
        "survivors": survivors,
        "failures": failures[:10],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'call':8} {'count':>6} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for kind, p in result["latency"].items():
        if p:
            print(
                f"{kind:8} {p['count']:>6} {p['p50_ms']:>8.1f} {p['p90_ms']:>8.1f} "
                f"{p['p99_ms']:>8.1f} {p['max_ms']:>8.1f}"
            )
    print(
        f"calls {counts['calls']}, answered {counts['answered']}, failed {counts['failed']}, "
        f"wrong rewards {counts['wrong_rewards']}, joint actions sent {counts['sent']} / "
        f"scored {counts['scored']}; {sum(failovers)} failovers; survivors {survivors}; "
        f"wrote {out}"
    )
    return 0 if counts["failed"] == 0 and counts["wrong_rewards"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
