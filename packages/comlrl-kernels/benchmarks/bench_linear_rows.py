"""linear_rows (C++ few-row GEMV) vs torch's F.linear on CPU, float32, in GB/s of weight read.

For each weight shape ``[N, K]`` and row count R, both ops run on a pool of distinct
weights (> 256 MiB together, so every call reads its weight from memory, as a decode
step does), alternating, best of ``--outer`` timings of ``--reps`` calls each. The
streaming bandwidth (best ``x.sum()`` over 512 MiB) is measured in the same run, and the
1-minute load average is recorded before and after (the build machine is shared: compare
only ratios measured side by side). Default shapes: SmolLM2-135M's decode linears (q|k|v
960x576, o 576x576, gate|up 3072x576, down 576x1536, LM head 49152x576).

Usage::

    python packages/comlrl-kernels/benchmarks/bench_linear_rows.py --rows 1,4,8,16,24,32 \\
        --out packages/comlrl-kernels/benchmarks/results/cpu_linear_rows.json

``COMLRL_KERNELS_CPU_ISA=base|avx2|avx512`` runs that build of the kernel. ``--in-cache``
reuses one weight per shape instead (shapes that fit in L3, e.g. 4096x576; in L2 the calls are too short for the Python call overhead): the
kernel's arithmetic rate without the memory, reported as GFLOP/s (2 * rows * N * K per
call) beside the GB/s of every case.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _bench_common import environment
from comlrl.kernels import _dispatch, linear_rows

SHAPES = "960x576,576x576,3072x576,576x1536,49152x576"


def best_s(fn: Callable[[], Any], reps: int, outer: int) -> float:
    fn()
    best = float("inf")
    for _ in range(outer):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def xsum_gb_s(mib: int = 512) -> float:
    """Best-of-7 ``x.sum()`` read rate over a float32 tensor of ``mib`` MiB."""
    big = torch.ones(mib * (1 << 20) // 4)
    return big.numel() * 4 / best_s(big.sum, 1, 7) / 1e9


def kernel_and_torch_s(
    pool: list[torch.Tensor], x: torch.Tensor, reps: int, outer: int
) -> tuple[float, float]:
    """Best seconds per call of linear_rows and F.linear, each call on the next weight."""
    weights = itertools.cycle(pool)
    kern = best_s(lambda: linear_rows(x, next(weights)), reps, outer)
    ref = best_s(lambda: F.linear(x, next(weights)), reps, outer)
    return kern, ref


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=SHAPES, help="comma list of NxK")
    p.add_argument("--rows", default="1,4,8,16", help="comma list of row counts")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--outer", type=int, default=5)
    p.add_argument("--pool-mib", type=int, default=256)
    p.add_argument("--in-cache", action="store_true", help="one weight per shape, reused")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if _dispatch._cpu is None:
        raise SystemExit(f"the _cpu module is not built ({_dispatch._CPU_ERROR})")
    torch.set_num_threads(args.threads)
    load = [os.getloadavg()[0]]
    result: dict[str, Any] = {
        "benchmark": "linear_rows",
        "isa": _dispatch._cpu.isa(),
        "threads": args.threads,
        "in_cache": args.in_cache,
        "xsum_gb_s": xsum_gb_s(),
        "environment": environment(torch.device("cpu")),
        "cases": [],
    }
    print(f"isa {result['isa']}, x.sum {result['xsum_gb_s']:.1f} GB/s, load {load[0]:.1f}")
    with torch.no_grad():
        for shape in args.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            nbytes = n * k * 4
            count = 1 if args.in_cache else max(2, (args.pool_mib << 20) // nbytes)
            pool = [torch.randn(n, k) for _ in range(count)]
            for rows in (int(r) for r in args.rows.split(",")):
                kern, ref = kernel_and_torch_s(pool, torch.randn(rows, k), args.reps, args.outer)
                case = {
                    "n": n,
                    "k": k,
                    "rows": rows,
                    "kernel_ms": kern * 1e3,
                    "torch_ms": ref * 1e3,
                    "kernel_gb_s": nbytes / kern / 1e9,
                    "torch_gb_s": nbytes / ref / 1e9,
                    "kernel_gflop_s": 2 * rows * n * k / kern / 1e9,
                    "torch_gflop_s": 2 * rows * n * k / ref / 1e9,
                    "speedup": ref / kern,
                    "loadavg_1m": os.getloadavg()[0],
                }
                result["cases"].append(case)
                print(
                    f"{n}x{k} rows={rows}: kernel {case['kernel_ms']:.3f} ms "
                    f"({case['kernel_gb_s']:.1f} GB/s, {case['kernel_gflop_s']:.1f} GFLOP/s), "
                    f"torch {case['torch_ms']:.3f} ms ({case['torch_gb_s']:.1f} GB/s, "
                    f"{case['torch_gflop_s']:.1f} GFLOP/s): {case['speedup']:.2f}x, "
                    f"load {case['loadavg_1m']:.1f}",
                    flush=True,
                )
            del pool
    load.append(os.getloadavg()[0])
    result["loadavg_1m"] = load
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
