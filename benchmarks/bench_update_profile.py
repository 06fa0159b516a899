"""Where one update's time goes on a real chat LLM (SmolLM2-135M-Instruct, CPU).

Trains two agents (two copies of the model, converted from the GGUF file once as in
``bench_real_llm_speed.py``) on cooperative HumanEval through our chat prompts, one
intra-op thread, agents one after the other; after ``--warmup`` steps it measures
``--steps`` steps and splits each agent's ``update_policy`` into: the log-prob forward
(``completion_logprobs``: prompt pass with its KV cache, completion pass, fused LM head
and log-probs), the loss, ``backward``, gradient clipping and the optimizer step (timers
wrapped around those functions; nothing in the library is changed). A torch.profiler
table of one step's update (top ATen ops by self CPU time) is saved with it.

Usage::

    python benchmarks/bench_update_profile.py --output benchmarks/results/update_profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_real_llm_speed as real  # noqa: E402
import bench_train_throughput as btt  # noqa: E402
from _bench_common import git_commit  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", default=real.DEFAULT_GGUF)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--num-generations", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "bench_real_llm"))
    p.add_argument("--output", default=str(HERE / "results" / "update_profile.json"))
    args = p.parse_args(argv)
    btt._import_ours()
    import torch
    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.algos.recipes.group_baseline.recipe import MAGRPOTrainer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.training.config.rl import TrainConfig
    from comlrl.algos.training.update import policy as upd
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = real.convert_gguf(args.gguf, work)
    task = btt._load_task_class()()
    cfg = TrainConfig(
        models=[model_dir, model_dir],
        num_agents=2,
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        learning_rate=1e-6,
        shuffle=False,
        output_dir=str(work / "update_profile_run"),
        progress=False,
        reward_curve=False,
    )
    agents = []
    for i in range(2):
        model, tok = load_model_and_tokenizer(model_dir, seed=i, dtype="float32")
        agents.append(HFAgent(model, tok, name=f"agent_{i}"))
    trainer = MAGRPOTrainer(agents, cfg, task=task, dataset=list(task.load("train")))

    timers: dict[str, float] = defaultdict(float)

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timers[name] += time.perf_counter() - t0

        return wrapper

    upd.completion_logprobs = timed("logprob_forward", upd.completion_logprobs)
    upd.policy_loss = timed("loss", upd.policy_loss)
    torch.nn.utils.clip_grad_norm_ = timed("clip_grad_norm", torch.nn.utils.clip_grad_norm_)
    backward = torch.Tensor.backward
    torch.Tensor.backward = timed("backward", backward)  # type: ignore[method-assign]
    for opt in trainer.optimizers:
        opt.step = timed("optimizer_step", opt.step)  # type: ignore[method-assign]

    for _ in range(args.warmup):
        trainer.step()
    timers.clear()
    rows = []
    for _ in range(args.steps):
        rows.append(trainer.step().row)
    update_s = sum(r["time/update_s"] for r in rows) / args.steps
    split = {k: v / args.steps for k, v in timers.items()}
    split["other"] = update_s - sum(split.values())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.step()
    table = [
        {"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1000, "calls": e.count}
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    ]
    lens = {a: rows[-1][f"completion_len_mean/agent_{a}"] for a in range(2)}
    result = {
        "benchmark": "update_profile",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": git_commit(HERE.parent),
        "command": " ".join([sys.executable, *sys.argv]),
        "setup": vars(args) | {"threads": 1, "agents": 2, "model_dir": model_dir},
        "loadavg": os.getloadavg(),
        "generate_s_per_step": sum(r["time/generate_s"] for r in rows) / args.steps,
        "update_s_per_step": update_s,
        "update_split_s_per_step": split,
        "completion_len_mean": lens,
        "profile_top_ops_one_step": table,
        "note": "update_split sums both agents (they run one after the other); the profile "
        "covers a whole step (sampling too); its ops under autograd are the update's",
    }
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"update {update_s:.2f} s/step: " + ", ".join(f"{k} {v:.2f}" for k, v in split.items()))
    for row in table[:12]:
        print(f"  {row['op']:45s} {row['self_cpu_ms']:10.1f} ms  x{row['calls']}")
    print(f"wrote {args.output}")
    task.close() if hasattr(task, "close") else None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
