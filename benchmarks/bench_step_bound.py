"""Lower bound on a training step's time for a real LLM on this CPU, and so the largest
speed-up over CoMLRL 1.4.3 any implementation of the same step could reach.

Issue 18 item 7 asks for "at least 5x CoMLRL at every batch size". On SmolLM2-135M at one
and two prompts per step (G = 2, two agents) we measured 1.92x and 2.27x
(``results/real_llm_step_quiet.json``). This script asks how far that can go at all: it
counts the floating-point work a step *must* do with exact float32 gradients, and the
bytes a decode step must read, and divides by the best rates this machine reaches, both
measured here:

- ``peak_gflops``: the best float32 matmul rate over the update's own shapes (tokens x
  hidden x intermediate, both orders), a 2048^3 product and a cache-resident 256^3 product
  repeated (the best of all is used: generous to us, so the bound is a true lower bound
  for torch's kernels on this machine);
- ``bandwidth_gb_s``: the best streaming read (``x.sum()`` over 512 MiB).

The work, per agent and prompt, with ``P`` prompt tokens (our agents' chat rendering of
the benchmark's problems, counted with the model's tokenizer), ``G`` completions of ``C``
tokens, ``N`` linear-layer weights (attention and MLP projections of all layers), ``E``
the LM head's weights (``hidden x vocab``), ``a(q, k)`` the attention FLOPs of ``q``
query positions over ``k`` keys (``4 * hidden * q * k`` per layer, summed causally):

- update (ours: the prompt run once per group, logits only at completion positions):
  forward ``2 N (P + G C) + 2 E G C + attention``; backward twice the forward (input and
  weight gradients), so ``3x`` the forward;
- generation: one prefill of ``P`` tokens (``2 N P + attention``), then ``C`` decode steps
  of ``G`` rows, each at least ``max(4 (N + E) bytes / bandwidth, 2 (N + E) G / peak)``.

A step's bound is the sum over agents and prompts; the best possible speed-up is CoMLRL
1.4.3's *measured* step time (from ``--step-json``) over that bound. Nothing else (reward,
sampling, optimizer step, norms, rotary, softmax) is counted, so real steps are slower.

Usage (from the repo root)::

    python benchmarks/bench_step_bound.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _bench_common import git_commit, machine_info  # noqa: E402


def best_seconds(fn: Any, repeats: int) -> float:
    """Best wall time of ``repeats`` calls of ``fn`` (after one warm-up call), seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_rates(hidden: int, inter: int, tokens: int, repeats: int) -> dict[str, Any]:
    """Best float32 matmul rates (GFLOP/s) over the update's shapes and two square ones,
    and the streaming read bandwidth (GB/s), on the current torch thread count."""
    import torch

    shapes = {
        f"[{tokens},{hidden}]x[{hidden},{inter}]": (tokens, hidden, inter),
        f"[{tokens},{inter}]x[{inter},{hidden}]": (tokens, inter, hidden),
        "[2048,2048]x[2048,2048]": (2048, 2048, 2048),
    }
    rates: dict[str, float] = {}
    for name, (m, k, n) in shapes.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        rates[name] = 2 * m * k * n / best_seconds(lambda a=a, b=b: a @ b, repeats) / 1e9
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def in_cache() -> None:
        for _ in range(64):
            a @ b

    rates["[256,256]x[256,256] x64 (in cache)"] = (
        64 * 2 * 256**3 / best_seconds(in_cache, repeats) / 1e9
    )
    x = torch.ones(512 * (1 << 20) // 4)
    bandwidth = x.numel() * 4 / best_seconds(lambda: x.sum(), repeats) / 1e9
    return {"matmul_gflops": rates, "peak_gflops": max(rates.values()), "bandwidth_gb_s": bandwidth}


def attention_flops(hidden: int, layers: int, queries: int, past: int) -> float:
    """Causal attention FLOPs (scores and weighted values) of ``queries`` new positions
    after ``past`` cached ones: ``4 * hidden * sum_i (past + i)`` per layer."""
    keys = queries * past + queries * (queries + 1) / 2
    return 4.0 * hidden * keys * layers


def step_bound(
    cfg: dict[str, int], prompt_tokens: list[int], g: int, c: float, agents: int, rates: dict
) -> dict[str, float]:
    """Lower bounds (seconds) of one step's update and generation for prompts of
    ``prompt_tokens`` tokens each (one per prompt of the batch and agent), times ``agents``
    (1 when ``prompt_tokens`` already lists every agent's prompts)."""
    d, layers, n_lin, e = cfg["hidden"], cfg["layers"], cfg["linear_params"], cfg["head_params"]
    peak = rates["peak_gflops"] * 1e9
    update_flops = gen_flops = decode_s = 0.0
    for p in prompt_tokens:
        fwd = 2 * n_lin * (p + g * c) + 2 * e * g * c
        fwd += attention_flops(d, layers, p, 0) + g * attention_flops(d, layers, int(c), p)
        update_flops += 3 * fwd
        gen_flops += 2 * n_lin * p + 2 * e + attention_flops(d, layers, p, 0)
        per_step = max(
            4 * (n_lin + e) / (rates["bandwidth_gb_s"] * 1e9), 2 * (n_lin + e) * g / peak
        )
        decode_s += c * per_step
    update_s = agents * update_flops / peak
    generate_s = agents * (gen_flops / peak + decode_s)
    return {
        "update_gflop": agents * update_flops / 1e9,
        "update_s": update_s,
        "generate_s": generate_s,
        "step_s": update_s + generate_s,
    }


def model_shape(model_dir: str) -> dict[str, int]:
    """Hidden size, layers and weight counts of a Llama-style ``config.json``."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    d, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or d // heads
    per_layer = d * heads * head_dim * 2 + 2 * d * kv * head_dim + 3 * d * inter
    return {
        "hidden": d,
        "intermediate": inter,
        "layers": layers,
        "linear_params": per_layer * layers,
        "head_params": d * cfg["vocab_size"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", default=None, help="default: bench_real_llm_speed's DEFAULT_GGUF")
    p.add_argument(
        "--step-json",
        default=str(HERE / "results" / "real_llm_step_quiet.json"),
        help="a bench_real_llm_speed.py result with measured 'step' rows (both sides)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (the step runs used 1)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--target", type=float, default=5.0, help="speed-up to test against")
    p.add_argument(
        "--theoretical-peak-gflops",
        type=float,
        default=118.4,
        help="a second bound at this float32 rate (default: Zen 4, one core: 2 FMA pipes x "
        "8 lanes x 2 FLOP x 3.7 GHz boost)",
    )
    p.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "bench_real_llm"))
    p.add_argument("--output", default=str(HERE / "results" / "step_bound_smollm2.json"))
    args = p.parse_args(argv)
    import bench_real_llm_speed as speed
    import bench_train_throughput as btt
    import torch

    gguf = args.gguf or speed.DEFAULT_GGUF
    if not Path(gguf).is_file():
        raise SystemExit(f"no GGUF file at {gguf}; pass --gguf PATH")
    measured = json.loads(Path(args.step_json).read_text())["results"]["step"]
    setup, rows = measured["setup"], measured["rows"]
    btt._import_ours()
    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = speed.convert_gguf(gguf, work)
    shape = model_shape(model_dir)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    task = btt._load_task_class()()
    max_b = max(r["batch_size"] for r in rows)
    examples = speed.rendered_examples(
        task, model_dir, (setup["warmup"] + setup["steps"]) * max_b, "train"
    )
    g, agents = setup["num_generations"], setup.get("num_agents", 2)
    out_rows = []
    load = [os.getloadavg()[0]]
    rates = measure_rates(shape["hidden"], shape["intermediate"], 300, args.repeats)
    load.append(os.getloadavg()[0])
    for row in rows:
        b = row["batch_size"]
        # the measured step is the one after `warmup` warm-up steps: its prompts
        step_ex = examples[setup["warmup"] * b : (setup["warmup"] + 1) * b]
        # one prompt per agent per example: the bound sums over all of them
        lens = [len(tok(text).input_ids) for ex in step_ex for text in ex["_prompts"]]
        c = float(row["ours"]["completion_len_mean"])
        bound = step_bound(shape, lens, g, c, 1, rates)
        ideal = step_bound(
            shape, lens, g, c, 1, rates | {"peak_gflops": args.theoretical_peak_gflops}
        )
        theirs, ours = row["comlrl_1_4_3"]["step_s"], row["ours"]["step_s"]
        out_rows.append(
            {
                "batch_size": b,
                "prompt_tokens": lens,
                "completion_tokens": c,
                "bound": bound,
                "ours_measured_s": ours,
                "ours_update_measured_s": row["ours"]["stage_s_per_step"]["update"],
                "comlrl_1_4_3_measured_s": theirs,
                "measured_speedup": theirs / ours,
                "best_possible_speedup": theirs / bound["step_s"],
                "bound_at_theoretical_peak": ideal,
                "best_possible_speedup_at_theoretical_peak": theirs / ideal["step_s"],
                "step_s_needed_for_target": theirs / args.target,
                "update_gflop_s_needed_for_target_alone": bound["update_gflop"]
                / (theirs / args.target),
            }
        )
    result = {
        "benchmark": "step_bound",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([sys.executable, *sys.argv]),
        "commit": git_commit(HERE.parent),
        "machine": machine_info(args.threads),
        "model": gguf,
        "shape": shape,
        "step_json": args.step_json,
        "setup": {
            "num_generations": g,
            "agents": agents,
            "target": args.target,
            "theoretical_peak_gflops": args.theoretical_peak_gflops,
        },
        "rates": rates,
        "loadavg_1m": load,
        "rows": out_rows,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"peak {rates['peak_gflops']:.1f} GFLOP/s, bandwidth {rates['bandwidth_gb_s']:.1f} GB/s")
    for r in out_rows:
        bd = r["bound"]
        print(
            f"b={r['batch_size']} P={r['prompt_tokens']} C={r['completion_tokens']:.1f}: bound "
            f"{bd['step_s']:.2f} s (update {bd['update_s']:.2f}, {bd['update_gflop']:.0f} GFLOP; "
            f"generate {bd['generate_s']:.2f}); measured ours {r['ours_measured_s']:.2f}, 1.4.3 "
            f"{r['comlrl_1_4_3_measured_s']:.2f}: best possible {r['best_possible_speedup']:.2f}x "
            f"(at {args.theoretical_peak_gflops:g} GFLOP/s: "
            f"{r['best_possible_speedup_at_theoretical_peak']:.2f}x; measured "
            f"{r['measured_speedup']:.2f}x; {args.target:g}x needs "
            f"{r['step_s_needed_for_target']:.2f} s/step)"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
