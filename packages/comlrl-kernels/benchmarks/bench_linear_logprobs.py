"""Benchmark linear_token_logprobs (chunked lm_head + log-probs) against materializing
the logits.

Methods, forward and forward+backward (gradients for hidden and weight):
- fused:             comlrl.kernels.linear_token_logprobs (default chunk size)
- materialized_ours: logits = hidden @ W.T, then comlrl.kernels.token_logprobs
- materialized_naive: logits = hidden @ W.T, then log_softmax(logits.float()).gather
- matmul_only:       the bare matmuls (forward: hidden @ W.T; forward+backward: plus the
                     two gradient matmuls), a lower bound for any method

Defaults: CUDA N=16384, V=151936, bf16; CPU N=256, V=32000, fp32 (CPU bf16 matmuls are
slow without AMX). With the CPU defaults the library's default chunk is all N rows, so
pass e.g. --chunk-size 64 to see chunking at work. H is swept over --hidden (default 896,3584: Qwen2.5-0.5B and -7B).
Peak memory: see _bench_common.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch
from _bench_common import DTYPES, environment, peak_mib, print_table, run_child, save, time_ms

METHODS = ["fused", "materialized_ours", "materialized_naive", "matmul_only"]


def measure(case: dict[str, Any]) -> dict[str, Any]:
    from comlrl.kernels import linear_token_logprobs, token_logprobs

    device = torch.device(case["device"])
    dtype = DTYPES[case["dtype"]]
    n, h, v = case["n"], case["h"], case["v"]
    torch.manual_seed(0)
    hidden0 = torch.empty(n, h, dtype=dtype, device=device).normal_()
    weight0 = torch.empty(v, h, dtype=dtype, device=device).normal_(0.0, h**-0.5)
    targets = torch.randint(0, v, (n,), device=device)
    method = case["method"]

    def f(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if method == "fused":
            return linear_token_logprobs(hidden, weight, targets, chunk_size=case["chunk_size"])
        logits = hidden @ weight.t()
        if method == "materialized_ours":
            return token_logprobs(logits, targets)  # type: ignore[return-value]
        if method == "materialized_naive":
            return torch.log_softmax(logits.float(), -1).gather(1, targets.unsqueeze(1)).squeeze(1)
        return logits

    def fwd() -> None:
        with torch.no_grad():
            f(hidden0, weight0)

    def fwd_bwd() -> None:
        hidden = hidden0.detach().requires_grad_()
        weight = weight0.detach().requires_grad_()
        out = f(hidden, weight)
        # matmul_only: a ones upstream gradient runs the two gradient matmuls, nothing else
        g = torch.ones_like(out) if method == "matmul_only" else None
        torch.autograd.grad(out if g is not None else out.sum(), (hidden, weight), g)

    phase = fwd if case["phase"] == "fwd" else fwd_bwd
    return {"peak_mib": peak_mib(phase, device), "ms": time_ms(phase, device, case["repeats"])}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--v", type=int, default=None)
    p.add_argument("--hidden", default="896,3584")
    p.add_argument("--dtype", choices=list(DTYPES), default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument(
        "--chunk-size", type=int, default=None, help="fused chunk rows (default: library default)"
    )
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    n = args.n or (16384 if gpu else 256)
    v = args.v or (151936 if gpu else 32000)
    dtype = args.dtype or ("bf16" if gpu else "fp32")
    repeats = args.repeats or (10 if gpu else 3)
    rows: list[dict[str, Any]] = []
    for h in (int(x) for x in args.hidden.split(",")):
        for method in METHODS:
            row: dict[str, Any] = {"h": h, "method": method}
            for phase in ("fwd", "fwdbwd"):
                case = {
                    "method": method,
                    "phase": phase,
                    "device": args.device,
                    "n": n,
                    "h": h,
                    "v": v,
                    "dtype": dtype,
                    "repeats": repeats,
                    "chunk_size": args.chunk_size,
                }
                res = run_child(__file__, case) if not gpu else measure(case)
                print(f"  H={h} {method} {phase}: {res}", file=sys.stderr)
                if "ms" in res:
                    row[f"{phase}_ms"], row[f"{phase}_peak_mib"] = (
                        res.pop("ms"),
                        res.pop("peak_mib"),
                    )
                row.update(res)
            rows.append(row)
    print(
        f"linear_token_logprobs  N={n} V={v} dtype={dtype} device={device} chunk_size={args.chunk_size or 'default'}"
    )
    print_table(
        rows, ["h", "method", "fwd_ms", "fwdbwd_ms", "fwd_peak_mib", "fwdbwd_peak_mib", "error"]
    )
    save(
        args.out,
        {
            "benchmark": "linear_token_logprobs",
            "config": {
                "n": n,
                "v": v,
                "dtype": dtype,
                "repeats": repeats,
                "chunk_size": args.chunk_size,
            },
            "memory_method": "cuda: max_memory_allocated delta over the inputs; cpu: ru_maxrss growth over the inputs, fresh subprocess per method and phase",
            "environment": environment(device),
            "results": rows,
        },
    )


if __name__ == "__main__":
    main()
