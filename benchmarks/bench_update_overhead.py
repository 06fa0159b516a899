"""What one policy update costs beyond its arithmetic, on CPU: time, host reads, profile.

Builds the built-in default agent (stories260k; ``--model`` another folder, e.g. SmolLM2
converted by ``bench_real_llm_speed.py``), samples one fixed batch (``--prompts``
prompts x ``--group`` completions x ``--new-tokens`` tokens, two turns of it) and times
``update_policy`` on it (``--micro-batch`` sequences per forward/backward, RAdam, the
``token_mean`` reduction with TIS on, so every per-micro-batch metric path runs), best
and median of ``--repeats`` after a warm-up, on one intra-op thread, in wall time and in
process CPU time (which a machine shared with other jobs inflates less). It also counts the
update's reads of tensor values into Python (``item``, ``tolist``, ``float``, ...: on a GPU
each waits for all queued work) made by comlrl's own code, and saves torch.profiler's
table of one update (top ops by self CPU time, with ``aten::item`` /
``aten::_local_scalar_dense`` counts).

``--compare-src DIR`` runs the same measurement, alternating round by round, with
``comlrl.algos`` and ``comlrl.estimators`` taken from an older tree (``git worktree add
/tmp/old REV``, then ``--compare-src /tmp/old``), each side in its own process.

Usage::

    python benchmarks/bench_update_overhead.py --compare-src /tmp/old \\
        --output benchmarks/results/update_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _bench_common import git_commit, machine_info  # noqa: E402

_READS = {"tolist", "item", "__float__", "__int__", "__bool__"}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One side's numbers, in this process (whatever ``comlrl`` it imports)."""
    import torch
    from comlrl.algos import HFAgent, load_model_and_tokenizer
    from comlrl.algos.models.loading import STORIES260K
    from comlrl.algos.training.update.agents import build_optimizer
    from comlrl.algos.training.update.policy import update_policy
    from comlrl.algos.training.update.settings import UpdateSettings
    from comlrl.core import SamplingParams
    from torch.overrides import TorchFunctionMode
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(args.model or STORIES260K, seed=0, dtype="float32")
    agent = HFAgent(model, tok)
    agent.seed(0)
    prompts = [f"Once upon a time there was a {w}" for w in ("cat", "dog", "girl", "king")]
    batch = agent.sample(
        prompts[: args.prompts],
        SamplingParams(num_generations=args.group, max_new_tokens=args.new_tokens),
    ).batch
    adv = torch.linspace(-1, 1, batch.completion_mask.shape[0])
    settings = UpdateSettings(
        loss_reduction="token_mean",
        tis_level="token",
        clip_ratio=0.2,
        micro_batch_size=args.micro_batch,
    )
    opt = build_optimizer(agent.model.parameters(), "radam", lr=1e-6)

    def update() -> dict[str, float]:
        return update_policy(agent.model, opt, [batch, batch], [adv, adv], settings)

    class Reads(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.reads: Counter[str] = Counter()

        def __torch_function__(self, func: Any, types: Any, a: Any = (), k: Any = None) -> Any:
            if getattr(func, "__name__", "") in _READS:
                caller = traceback.extract_stack(limit=2)[0]
                if "/comlrl/" in caller.filename:
                    self.reads[f"{Path(caller.filename).name}:{caller.lineno}"] += 1
            return func(*a, **(k or {}))

    update()  # warm-up
    times, cpu = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        update()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    with Reads() as seen:
        update()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update()
    events = prof.key_averages()
    table = [
        {"op": e.key, "self_cpu_ms": round(e.self_cpu_time_total / 1000, 3), "calls": e.count}
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]
    ]
    syncs = {e.key: e.count for e in events if e.key in ("aten::item", "aten::_local_scalar_dense")}
    return {
        "update_ms_best": 1000 * min(times),
        "update_ms_median": 1000 * statistics.median(times),
        "update_cpu_ms_median": 1000 * statistics.median(cpu),
        "micro_batches": 2 * -(-batch.num_prompts // max(1, args.micro_batch // args.group)),
        "host_reads_by_comlrl": sum(seen.reads.values()),
        "host_reads_where": dict(seen.reads.most_common()),
        "profiler_item_calls": syncs,
        "profile_top_ops": table,
    }


def _side(src: str | None, args: argparse.Namespace, work: Path, tag: str) -> dict[str, Any]:
    out = work / f"side_{tag}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if src:
        paths = [
            str(Path(src) / "packages" / p / "src") for p in ("comlrl-algos", "comlrl-estimators")
        ]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--side-out", str(out)]
    for key in ("prompts", "group", "new_tokens", "micro_batch", "repeats", "top"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    if args.model:
        cmd += ["--model", args.model]
    subprocess.run(cmd, env=env, check=True)
    return dict(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model folder (default: the built-in one)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--compare-src", default=None, help="an older checkout to compare with")
    p.add_argument("--output", default=str(HERE / "results" / "update_overhead_cpu.json"))
    p.add_argument("--side-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side_out:
        Path(args.side_out).write_text(json.dumps(measure(args)))
        return 0
    sides = {"this": None} | ({"compare": args.compare_src} if args.compare_src else {})
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, src in sides.items():
                rounds[name].append(_side(src, args, Path(tmp), f"{name}{r}"))
                got = rounds[name][-1]
                print(
                    f"round {r} {name:8s} update {got['update_ms_median']:.1f} ms (best "
                    f"{got['update_ms_best']:.1f}, CPU time {got['update_cpu_ms_median']:.1f}), "
                    f"host reads {got['host_reads_by_comlrl']}",
                    flush=True,
                )
    result: dict[str, Any] = {
        "benchmark": "update_overhead_cpu",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": git_commit(HERE.parent),
        "compare_src": args.compare_src,
        "compare_commit": git_commit(Path(args.compare_src)) if args.compare_src else None,
        "command": " ".join([sys.executable, *sys.argv]),
        "setup": {k: v for k, v in vars(args).items() if k not in ("side_out", "output")},
        "machine": machine_info(1),
        "loadavg": os.getloadavg(),
    }
    for name, rows in rounds.items():
        result[name] = {
            "update_ms_median_of_rounds": statistics.median(r["update_ms_median"] for r in rows),
            "update_ms_best": min(r["update_ms_best"] for r in rows),
            "update_cpu_ms_median_of_rounds": statistics.median(
                r["update_cpu_ms_median"] for r in rows
            ),
            "rounds": rows,
        }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    for name in sides:
        last = rounds[name][-1]
        print(f"\n{name}: top ops of one update (self CPU ms, calls)")
        for row in last["profile_top_ops"][:10]:
            print(f"  {row['op']:45s} {row['self_cpu_ms']:9.2f}  x{row['calls']}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
