"""Per-token cost of sampling on the built-in model: the default ``comlrl train`` step's decode.

One agent's share of a default step at one prompt per step: ``builtin:stories260k``, one
prompt, ``G = 4`` rows, 48 new tokens (no EOS, so every call makes 48 tokens), sampled
at temperature 1 through :class:`~comlrl.algos.rollout.sampling.native.NativeSampler`
(prefill, then :class:`FastDecoder` steps) on one intra-op thread, as each agent runs in
a default two-agent run on two cores. At this size a decode step is a few hundred tensor
ops of microseconds each, so the time is per-op overhead: the script reports the best and
median time per token over ``--repeats`` calls, and the number of top-level ATen ops per
token (torch.profiler), and the sampled ids' and log-probs' checksum (a code change that
should not change results must not change it).

``--compare-src DIR`` also runs the same measurement, alternating with this tree's, in a
subprocess whose ``comlrl.algos`` comes from ``DIR`` (e.g. ``git archive HEAD~1
packages/comlrl-algos/src | tar -x -C /tmp/old``, then ``--compare-src
/tmp/old/packages/comlrl-algos/src``), for a before/after under the same load.

Usage::

    python benchmarks/bench_decode_overhead.py --repeats 30 --output benchmarks/results/decode_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def measure(repeats: int, new_tokens: int, group: int) -> dict[str, Any]:
    """Time ``repeats`` sampling calls of this process's ``comlrl.algos``."""
    import comlrl.algos
    import torch
    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.algos.rollout.sampling.native import NativeSampler
    from comlrl.core import SamplingParams
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer("builtin:stories260k", seed=0, dtype="float32")
    enc = tok(["Once upon a time there was a little dog who"], return_tensors="pt")
    sampler = NativeSampler(model, pad_token_id=0, eos_token_ids=[])
    params = SamplingParams(num_generations=group, max_new_tokens=new_tokens)
    gen = torch.Generator().manual_seed(0)
    sampler.sample(enc.input_ids, enc.attention_mask, params, gen)  # checks the fast step
    gen.manual_seed(0)
    ids, logp = sampler.sample(enc.input_ids, enc.attention_mask, params, gen)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sampler.sample(enc.input_ids, enc.attention_mask, params, gen)
        times.append(time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sampler.sample(enc.input_ids, enc.attention_mask, params, gen)
    top = [e for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    times.sort()
    return {
        "source": str(Path(comlrl.algos.__file__).parent),
        "fast_decode_status": sampler.fast_decode_status,
        "ms_per_token_best": times[0] * 1000 / new_tokens,
        "ms_per_token_median": times[len(times) // 2] * 1000 / new_tokens,
        "top_level_aten_ops_per_token": len(top) / new_tokens,
        "checksum_ids": int(ids.sum()),
        "checksum_logp": float(logp.double().sum()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="alternations with --compare-src")
    p.add_argument("--compare-src", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.repeats, args.new_tokens, args.group)))
        return 0
    sides = {"this_tree": None, "compare": args.compare_src} if args.compare_src else {}
    sides = sides or {"this_tree": None}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for _ in range(args.rounds if args.compare_src else 1):
        for name, src in sides.items():
            env = dict(os.environ)
            if src is not None:
                env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
            cmd = [sys.executable, __file__, "--child", "--repeats", str(args.repeats)]
            cmd += ["--new-tokens", str(args.new_tokens), "--group", str(args.group)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = runs[name][-1]
            print(
                f"{name:10s} {r['ms_per_token_best']:.3f} ms/token best, "
                f"{r['ms_per_token_median']:.3f} median, "
                f"{r['top_level_aten_ops_per_token']:.0f} ops/token, "
                f"checksums {r['checksum_ids']} {r['checksum_logp']:.6f} ({r['source']})",
                flush=True,
            )
    best = {k: min(r["ms_per_token_best"] for r in v) for k, v in runs.items()}
    result = {
        "benchmark": "decode_overhead",
        "setup": vars(args) | {"model": "builtin:stories260k", "threads": 1},
        "loadavg": os.getloadavg(),
        "runs": runs,
        "best_ms_per_token": best,
    }
    if args.compare_src:
        result["speedup_best"] = best["compare"] / best["this_tree"]
        print(f"speed-up (best of rounds): {result['speedup_best']:.2f}x")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
