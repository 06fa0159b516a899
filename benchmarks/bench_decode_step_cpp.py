"""Time of one FastDecoder decode step on CPU: the Python step vs the one-call C++ step.

Prefills ``--prompt-tokens`` random tokens of the built-in stories260k model (or
``--model``) once per prompt, then times ``--new-tokens`` teacher-forced steps of
``FastDecoder.step`` for ``R`` rows (one prompt x ``G = R`` completions, as a
``comlrl train`` step samples them), alternating the Python step and the C++ step
(``start(native=False / True)``) round by round so both see the same machine load.
Reports the median over rounds of the mean ms per step, the load average, and writes JSON.

    nice -n 10 python benchmarks/bench_decode_step_cpp.py --rows 2,4,8 \\
        --output benchmarks/results/decode_step_cpp.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF folder (default: built-in stories260k)")
    parser.add_argument("--rows", default="2,4,8", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    import torch
    from comlrl.algos.models.hf_cache import output_cache
    from comlrl.algos.models.loading import builtin_model_path
    from comlrl.algos.rollout.sampling.fast_decode.decoder import FastDecoder
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model_dir = args.model or str(builtin_model_path())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (1, args.prompt_tokens), generator=gen)
    mask = torch.ones_like(ids)
    steps = args.new_tokens

    def run(rows: int, native: bool) -> tuple[float, str]:
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
            new = torch.randint(3, vocab, (steps, rows), generator=gen)
            fast = FastDecoder(model)
            pos = torch.full((rows, 1), args.prompt_tokens) + torch.arange(steps)
            fast.start(
                output_cache(out), mask, rows, pos, args.prompt_tokens + steps, native=native
            )
            t0 = time.perf_counter()
            for t in range(steps):
                fast.step(new[t])
            per_step = (time.perf_counter() - t0) / steps
            status = fast.native_status
            fast.release()
        return per_step * 1e3, status

    result: dict = {
        "benchmark": "FastDecoder.step ms per step, Python step vs one-call C++ step (CPU)",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "setup": vars(args) | {"model": model_dir, "torch": torch.__version__},
        "loadavg_start": os.getloadavg(),
        "rows": {},
    }
    for rows in args.rows:
        for native in (False, True):  # warm-up
            run(rows, native)
        times: dict[str, list[float]] = {"python": [], "cpp": []}
        status = ""
        for _ in range(args.rounds):
            for native in (False, True):
                ms, st = run(rows, native)
                times["cpp" if native else "python"].append(ms)
                status = st if native else status
        py, cpp = statistics.median(times["python"]), statistics.median(times["cpp"])
        result["rows"][str(rows)] = {
            "python_ms_per_step": py,
            "cpp_ms_per_step": cpp,
            "speedup": py / cpp,
            "cpp_status": status,
            "python_all": times["python"],
            "cpp_all": times["cpp"],
        }
        print(
            f"R={rows}: python {py:.3f} ms/step, C++ {cpp:.3f} ms/step ({py / cpp:.1f}x; {status})"
        )
    result["loadavg_end"] = os.getloadavg()
    print(f"load average start {result['loadavg_start']} end {result['loadavg_end']}")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
