"""Benchmark token_logprobs against the usual ways of computing per-token log-probs.

Methods (forward, and forward+backward of ``logp.sum()``):
- ours:            comlrl.kernels.token_logprobs (backend chosen by dispatch)
- ours_torch:      comlrl.kernels with the torch reference backend forced
- naive:           torch.log_softmax(logits.float() / T, -1).gather(...)
- trl:             trl's selective_log_softmax, when trl is installed
- liger:           Liger's fused cross entropy (reduction="none", negated), CUDA only,
                   when liger-kernel is installed

Usage:
  python bench_token_logprobs.py                       # CUDA if available: N=16384 V=151936 bf16
  python bench_token_logprobs.py --device cpu          # CPU defaults: N=1024 V=151936 bf16
  python bench_token_logprobs.py --n 4096 --v 32000 --dtype fp32 --out results/tlp.json

Peak memory: see _bench_common.py (CUDA: max_memory_allocated delta; CPU: ru_maxrss
growth in a fresh subprocess per case).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
from _bench_common import DTYPES, environment, peak_mib, print_table, run_child, save, time_ms

TEMPERATURE = 0.9


def make_method(
    name: str,
) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, str]:
    """(function logits, targets -> logp [N], note); function None when unavailable."""
    if name in ("ours", "ours_torch"):
        from comlrl.kernels import token_logprobs, use_backend

        def ours(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            if name == "ours_torch":
                with use_backend("torch"):
                    return token_logprobs(logits, targets, temperature=TEMPERATURE)  # type: ignore[return-value]
            return token_logprobs(logits, targets, temperature=TEMPERATURE)  # type: ignore[return-value]

        return ours, ""
    if name == "naive":

        def naive(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            lp = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
            return lp.gather(1, targets.unsqueeze(1)).squeeze(1)

        return naive, ""
    if name == "trl":
        try:
            from trl.trainer.utils import selective_log_softmax
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
            return None, f"trl not installed/importable ({type(exc).__name__}: {exc})"

        def trl_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return selective_log_softmax(logits / TEMPERATURE, targets)

        return trl_fn, "logits / T done by the caller, as TRL's trainers do"
    if name == "liger":
        try:
            from liger_kernel.transformers.functional import liger_cross_entropy
        except Exception as exc:  # noqa: BLE001
            return None, f"liger-kernel not installed/importable ({type(exc).__name__})"

        def liger_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return -liger_cross_entropy(logits / TEMPERATURE, targets, reduction="none")

        return liger_fn, "CUDA only"
    raise ValueError(name)


def measure(case: dict[str, Any]) -> dict[str, Any]:
    device = torch.device(case["device"])
    dtype = DTYPES[case["dtype"]]
    fn, note = make_method(case["method"])
    if fn is None:
        return {"skipped": note}
    torch.manual_seed(0)
    # created directly in the target dtype so no fp32 temporary inflates the baseline
    logits0 = torch.empty(case["n"], case["v"], dtype=dtype, device=device).normal_(0.0, 2.0)
    targets = torch.randint(0, case["v"], (case["n"],), device=device)

    def fwd() -> None:
        with torch.no_grad():
            fn(logits0, targets)

    def fwd_bwd() -> None:
        logits = logits0.detach().requires_grad_()
        # autograd.grad, not .backward(): no extra copy into a leaf's .grad, as when the
        # logits come from an lm_head and the gradient flows on into the matmul.
        torch.autograd.grad(fn(logits, targets).sum(), logits)

    phase = fwd if case["phase"] == "fwd" else fwd_bwd
    out: dict[str, Any] = {"note": note} if note else {}
    out["peak_mib"] = peak_mib(phase, device)
    out["ms"] = time_ms(phase, device, case["repeats"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--n", type=int, default=None, help="rows (tokens); default 16384 CUDA / 1024 CPU"
    )
    p.add_argument("--v", type=int, default=151936, help="vocabulary size")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument(
        "--repeats", type=int, default=None, help="timed runs (median); default 20 CUDA / 5 CPU"
    )
    p.add_argument("--methods", default="ours,ours_torch,naive,trl,liger")
    p.add_argument("--out", default=None, help="write results as JSON here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return
    device = torch.device(args.device)
    n = args.n or (16384 if device.type == "cuda" else 1024)
    repeats = args.repeats or (20 if device.type == "cuda" else 5)
    rows: list[dict[str, Any]] = []
    for method in args.methods.split(","):
        row: dict[str, Any] = {"method": method}
        for phase in ("fwd", "fwdbwd"):
            case = {
                "method": method,
                "phase": phase,
                "device": args.device,
                "n": n,
                "v": args.v,
                "dtype": args.dtype,
                "repeats": repeats,
            }
            if method == "liger" and device.type != "cuda":
                res: dict[str, Any] = {"skipped": "Liger kernels are Triton/CUDA only"}
            elif device.type == "cpu":
                res = run_child(__file__, case)  # fresh process per phase: honest ru_maxrss
            else:
                res = measure(case)
            print(f"  {method} {phase}: {res}", file=sys.stderr)
            if "ms" in res:
                row[f"{phase}_ms"], row[f"{phase}_peak_mib"] = res.pop("ms"), res.pop("peak_mib")
            row.update(res)
        rows.append(row)
    print(f"token_logprobs  N={n} V={args.v} dtype={args.dtype} device={device} T={TEMPERATURE}")
    print_table(rows, ["method", "fwd_ms", "fwdbwd_ms", "fwd_peak_mib", "fwdbwd_peak_mib", "error"])
    for r in rows:
        if r.get("skipped") or r.get("note"):
            print(f"  {r['method']}: {r.get('skipped') or r.get('note')}")
    logits_mib = n * args.v * DTYPES[args.dtype].itemsize / 2**20
    print(
        f"(one [N, V] {args.dtype} tensor = {logits_mib:.1f} MiB; fp32 = {n * args.v * 4 / 2**20:.1f} MiB)"
    )
    save(
        args.out,
        {
            "benchmark": "token_logprobs",
            "config": {
                "n": n,
                "v": args.v,
                "dtype": args.dtype,
                "temperature": TEMPERATURE,
                "repeats": repeats,
            },
            "memory_method": "cuda: max_memory_allocated delta over the inputs; cpu: ru_maxrss growth over the inputs, fresh subprocess per method and phase",
            "logits_mib": logits_mib,
            "environment": environment(device),
            "results": rows,
        },
    )


if __name__ == "__main__":
    main()
