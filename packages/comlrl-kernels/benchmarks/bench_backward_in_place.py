"""Why ``token_logprobs`` has no in-place backward: the kernel's two ways of writing the
gradient, and the copy an in-place caller pays.

``token_logprobs(..., inplace_backward=True)`` wrote the gradient over the logits. Its
backward runs the same kernel as the out-of-place one (read ``[N, V]`` logits, write
``[N, V]`` gradient, no ``__restrict__`` on either pointer in the CPU or CUDA code), so the
two move the same bytes; what differs is where the gradient goes: a new buffer (on a GPU
the caching allocator hands back memory it holds; on a CPU a buffer this large is freshly
mapped, and its first write faults every page in) or the logits, which a caller that still
needs them (as ``bench_token_logprobs.py``'s ``ours_inplace`` did, and as anything that
saved them for its own backward does) must copy first. This script times, on the backend
``--device`` picks, with the copies made outside the timed region:

- ``backward``: the out-of-place backward (a new ``[N, V]`` gradient);
- ``backward_in_place``: the same kernel writing over a fresh copy of the logits;
- ``clone``: one copy of the logits, what ``ours_inplace`` added to every
  forward+backward it timed.

The internal ``token_logprobs_backward`` keeps its ``inplace`` argument for the fused
``linear_token_logprobs``, which overwrites the chunk of logits it recomputed itself.

Usage:
  python bench_backward_in_place.py --device cpu --n 1024 --out results/cpu_backward_in_place.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from _bench_common import DTYPES, environment, save
from comlrl.kernels._dispatch import select
from comlrl.kernels._token_logprobs import (
    token_logprobs_backward,
    token_logprobs_forward,
    token_logprobs_unsupported,
)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(run: Any, prepare: Any, device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        arg = prepare()
        _sync(device)
        t0 = time.perf_counter()
        run(arg)
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--v", type=int, default=151936)
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    logits = torch.empty(args.n, args.v, dtype=DTYPES[args.dtype], device=device).normal_(0, 2)
    targets = torch.randint(0, args.v, (args.n,), device=device)
    g = torch.randn(args.n, device=device)
    backend = select("token_logprobs", device, token_logprobs_unsupported(logits))
    _, lse, _, used = token_logprobs_forward(backend, logits, targets, 0.9, False, -100)

    def backward(x: torch.Tensor, inplace: bool) -> torch.Tensor:
        return token_logprobs_backward(backend, x, targets, 0.9, -100, lse, g, None, None, inplace)

    out_of_place = backward(logits, False)
    in_place = backward(logits.clone(), True)
    assert torch.equal(out_of_place, in_place), "the two ways must write the same gradient"
    del out_of_place, in_place
    rows = {
        "backward": _median_ms(lambda x: backward(x, False), lambda: logits, device, args.repeats),
        "backward_in_place": _median_ms(
            lambda x: backward(x, True), logits.clone, device, args.repeats
        ),
        "clone": _median_ms(lambda x: x.clone(), lambda: logits, device, args.repeats),
    }
    print(f"token_logprobs backward  N={args.n} V={args.v} {args.dtype} on {used}")
    for name, ms in rows.items():
        print(f"  {name:<18} {ms:9.2f} ms")
    save(
        args.out,
        {
            "benchmark": "token_logprobs backward, in place or not",
            "config": {**vars(args), "backend": used},
            "median_ms": rows,
            "environment": environment(device),
        },
    )


if __name__ == "__main__":
    main()
