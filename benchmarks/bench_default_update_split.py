"""Where the default run's update goes, per agent (built-in stories260k, ``coop_story``).

Builds the default ``comlrl train`` run (every setting at its default but ``batch_size``),
takes ``--warmup`` steps, samples one rollout, and then calls ``update_policy`` for agent 0
on it ``--repeats`` times, splitting each call by timers wrapped around the library's own
functions (nothing in the library is changed): the log-prob forward
(``completion_logprobs``), the loss, ``backward``, gradient clipping, ``zero_grad``, the
optimizer step, and the rest (context managers, checks, metric floats). Times are the
calling thread's CPU time (``time.thread_time``), so other processes on a loaded machine
move them less than wall time; the median over the repeats is kept. One agent, one
intra-op thread (what ``small_model_threads`` gives a model this small). A torch.profiler
table of one update (top ATen ops by self CPU time) and the op counts are saved with it.

Usage::

    python benchmarks/bench_default_update_split.py --batch-sizes 1,4 \\
        --output benchmarks/results/default_update_split.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TQDM_DISABLE", "1")

from _bench_common import git_commit  # noqa: E402

PARTS = ("logprob_forward", "loss", "backward", "clip_grad_norm", "zero_grad", "optimizer_step")


def measure(batch_size: int, warmup: int, repeats: int, work: Path) -> dict[str, Any]:
    import torch
    from comlrl.algos.recipes.group_baseline import recipe
    from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
    from comlrl.algos.recipes.launch import load_agents, preflight
    from comlrl.algos.rollout.tree import rollout
    from comlrl.algos.training.config.rl import TrainConfig
    from comlrl.algos.training.update import policy as upd
    from torch.profiler import ProfilerActivity, profile

    cfg = TrainConfig(batch_size=batch_size, output_dir=str(work / f"b{batch_size}"))
    task, examples = preflight(cfg, cfg.models)
    torch.manual_seed(cfg.seed)
    agents = load_agents(cfg, None, **cfg.generation_options())
    run = MultiAgentTrainer(agents, cfg, task=task, dataset=examples)
    for _ in range(warmup):
        recipe.step(run)
    ro = rollout(
        run.agents,
        run.data.next_batch(batch_size),
        run.env,
        run.sampling,
        run.tree,
        map_agents=run.sample_pool.map,
        rng=run.rng,
    )
    adv = recipe.group_advantages(
        ro, estimator=cfg.estimator, scale=cfg.advantage_scale, eps=cfg.advantage_eps
    )
    model, opt = run.agents[0].model, run.optimizers[0]

    def one() -> None:
        upd.update_policy(model, opt, ro.agent_batches(0), [a[0] for a in adv], run.update_settings)

    timers: dict[str, float] = defaultdict(float)

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                timers[name] += time.thread_time() - t0

        return wrapper

    originals: dict[str, Any] = {
        "completion_logprobs": upd.completion_logprobs,
        "policy_loss": upd.policy_loss,
        "clip": torch.nn.utils.clip_grad_norm_,
        "backward": torch.Tensor.backward,
    }
    upd.completion_logprobs = timed("logprob_forward", upd.completion_logprobs)  # type: ignore[assignment]
    upd.policy_loss = timed("loss", upd.policy_loss)  # type: ignore[assignment]
    torch.nn.utils.clip_grad_norm_ = timed("clip_grad_norm", torch.nn.utils.clip_grad_norm_)  # type: ignore[assignment]
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)  # type: ignore[method-assign,assignment]
    opt.step = timed("optimizer_step", opt.step)  # type: ignore[method-assign]
    opt.zero_grad = timed("zero_grad", opt.zero_grad)  # type: ignore[method-assign]
    splits: dict[str, list[float]] = defaultdict(list)
    try:
        for _ in range(3):
            one()
        for _ in range(repeats):
            timers.clear()
            t0 = time.thread_time()
            one()
            total = time.thread_time() - t0
            splits["total"].append(total)
            for k in PARTS:
                splits[k].append(timers.get(k, 0.0))
            splits["other"].append(total - sum(timers.values()))
    finally:
        upd.completion_logprobs = originals["completion_logprobs"]
        upd.policy_loss = originals["policy_loss"]
        torch.nn.utils.clip_grad_norm_ = originals["clip"]
        torch.Tensor.backward = originals["backward"]  # type: ignore[method-assign]
        del opt.step, opt.zero_grad
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        one()
    events = prof.key_averages()
    table = [
        {"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1000, "calls": e.count}
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:20]
    ]
    aten_calls = sum(e.count for e in events if e.key.startswith("aten::"))
    batch = ro.agent_batches(0)[0]
    run.close()
    task.close() if hasattr(task, "close") else None
    return {
        "sequences": int(batch.input_ids.shape[0]),
        "padded_tokens": list(batch.input_ids.shape),
        "completion_tokens": int(batch.completion_mask.sum()),
        "median_ms": {k: 1000 * statistics.median(v) for k, v in splits.items()},
        "aten_calls_per_update": aten_calls,
        "profile_top_ops": table,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,4", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    import torch

    work = Path(tempfile.mkdtemp(prefix="bench_update_split_"))
    result: dict[str, Any] = {
        "benchmark": "default_update_split",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": git_commit(HERE.parent),
        "command": " ".join([sys.executable, *sys.argv]),
        "setup": vars(args) | {"torch": torch.__version__, "unit": "thread CPU ms, one agent"},
        "loadavg_start": os.getloadavg(),
        "batches": {},
    }
    for b in args.batch_sizes:
        r = measure(b, args.warmup, args.repeats, work)
        result["batches"][str(b)] = r
        ms = r["median_ms"]
        print(
            f"b={b}: update {ms['total']:.1f} ms/agent = "
            + ", ".join(f"{k} {ms[k]:.1f}" for k in (*PARTS, "other"))
            + f"; {r['aten_calls_per_update']} aten calls",
            flush=True,
        )
    result["loadavg_end"] = os.getloadavg()
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
