"""Benchmark group_advantages against a Python loop over groups.

Methods (M rewards in groups of --group-size; also variable-size unsorted group_ids):
- ours:        comlrl.kernels.group_advantages (backend chosen by dispatch)
- ours_torch:  the vectorized torch reference backend
- python_loop: one Python iteration per group (what loop-heavy trainers do)

On CUDA the script also counts kernel launches per call with torch.profiler.
Defaults: M=65536, G=8, baseline loo, scale group.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from _bench_common import environment, print_table, save, time_ms


def python_loop(rewards: torch.Tensor, ids: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(rewards)
    for g in torch.unique(ids).tolist():
        idx = (ids == g).nonzero().squeeze(1)
        r = rewards[idx]
        n = r.numel()
        a = (r - r.mean()) * (n / (n - 1)) if n > 1 else torch.zeros_like(r)
        out[idx] = a / (r.std(unbiased=False) + eps)
    return out


def count_launches(fn: Callable[[], Any]) -> dict[str, int]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    counts: dict[str, int] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            counts[e.name] = counts.get(e.name, 0) + 1
    return counts


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--m", type=int, default=65536)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--loop-repeats", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from comlrl.kernels import group_advantages, use_backend

    device = torch.device(args.device)
    torch.manual_seed(0)
    rewards = torch.randn(args.m, device=device)
    fixed_ids = torch.arange(args.m, device=device) // args.group_size
    var_ids = torch.randint(
        0, args.m // args.group_size, (args.m,), device=device
    )  # unsorted, variable sizes
    eps = 1e-6
    rows: list[dict[str, Any]] = []
    layouts: tuple[tuple[str, dict[str, Any], torch.Tensor], ...] = (
        ("fixed", {"group_size": args.group_size}, fixed_ids),
        ("group_ids", {"group_ids": var_ids}, var_ids),
    )
    for layout, kwargs, ids in layouts:

        def ours(kw: dict[str, Any] = kwargs) -> torch.Tensor:
            return group_advantages(rewards, baseline="loo", scale="group", eps=eps, **kw)

        def ours_torch(kw: dict[str, Any] = kwargs) -> torch.Tensor:
            with use_backend("torch"):
                return group_advantages(rewards, baseline="loo", scale="group", eps=eps, **kw)

        def loop(ids: torch.Tensor = ids) -> torch.Tensor:
            return python_loop(rewards, ids, eps)

        torch.testing.assert_close(ours(), python_loop(rewards, ids, eps), atol=1e-4, rtol=1e-4)
        rows.append({"layout": layout, "method": "ours", "ms": time_ms(ours, device, args.repeats)})
        rows.append(
            {
                "layout": layout,
                "method": "ours_torch",
                "ms": time_ms(ours_torch, device, args.repeats),
            }
        )
        rows.append(
            {
                "layout": layout,
                "method": "python_loop",
                "ms": time_ms(loop, device, args.loop_repeats, warmup=0),
            }
        )
        if device.type == "cuda":
            launches = count_launches(ours)
            rows[-3]["cuda_ops"] = sum(launches.values())
            rows[-3]["launches"] = launches
    print(
        f"group_advantages  M={args.m} G={args.group_size} baseline=loo scale=group device={device}"
    )
    print_table(rows, ["layout", "method", "ms", "cuda_ops"])
    save(
        args.out,
        {
            "benchmark": "group_advantages",
            "config": {
                "m": args.m,
                "group_size": args.group_size,
                "baseline": "loo",
                "scale": "group",
            },
            "environment": environment(device),
            "results": rows,
        },
    )


if __name__ == "__main__":
    main()
