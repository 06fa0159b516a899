"""Bandwidth ceilings for token_logprobs on a CUDA GPU.

Two modes, at N=16384, V=151936, bf16, T=0.9 by default:

- default: times a device-to-device copy of the [N, V] logits (``y.copy_(x)``, bytes read
  plus written), the practical ceiling for the backward (which reads the logits and writes
  their gradient), and prints JSON;
- ``--ncu``: runs one forward and one backward (after one warm-up each) for Nsight Compute::

      ncu --clock-control none -k regex:"forward_kernel|backward_kernel" -c 2 \\
          --section SpeedOfLight --section Occupancy \\
          python benchmarks/roofline_token_logprobs.py --ncu

The numbers measured on an H100 are in ``results/cuda_roofline.json``.
"""

from __future__ import annotations

import argparse
import json

import torch
from comlrl.kernels._token_logprobs import token_logprobs_backward, token_logprobs_forward


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--v", type=int, default=151936)
    p.add_argument("--ncu", action="store_true", help="one forward and backward, for ncu")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    x = torch.randn(args.n, args.v, device="cuda", dtype=torch.bfloat16)
    if args.ncu:
        t = torch.randint(0, args.v, (args.n,), device="cuda")
        g = torch.randn(args.n, device="cuda")
        for _ in range(2):
            _, lse, _, used = token_logprobs_forward("cuda", x, t, 0.9, False, -100)
            token_logprobs_backward("cuda", x, t, 0.9, -100, lse, g, None, None, False)
        torch.cuda.synchronize()
        print("backend", used)
        return
    y = torch.empty_like(x)
    gb = 2 * x.numel() * x.element_size() / 1e9
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(args.repeats):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / args.repeats
    print(json.dumps({"copy_read_write": {"ms": ms, "GB_moved": gb, "TB_s": gb / ms}}))


if __name__ == "__main__":
    main()
