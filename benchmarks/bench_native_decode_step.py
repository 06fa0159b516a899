"""Per-call time of the native sampler (prefill + one-token decode steps) on CPU, and where
the time goes (cProfile, top functions by own time).

Measures :class:`comlrl.algos.rollout.sampling.native.NativeSampler.sample` for ``--rows`` prompts
of ``--prompt-tokens`` random tokens and ``--new-tokens`` sampled tokens with the built-in
stories260k model (or ``--model``), one torch thread by default. Prints a summary and
writes JSON to ``--output``.

    /work/venv/bin/python benchmarks/bench_native_decode_step.py --rows 4
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF folder (default: built-in stories260k)")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=50)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--output", default=str(REPO / "benchmarks" / "results" / "native_decode_step.json")
    )
    args = parser.parse_args(argv)
    sys.path[:0] = [str(REPO / "packages" / p / "src") for p in ("comlrl-core", "comlrl-algos")]

    import torch
    from comlrl.algos.models.loading import builtin_model_path
    from comlrl.algos.rollout.sampling.native import NativeSampler
    from comlrl.algos.rollout.tree import SamplingParams
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model_dir = args.model or str(builtin_model_path())
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    vocab = model.config.vocab_size
    # no EOS id: every call decodes all --new-tokens steps
    sampler = NativeSampler(model, pad_token_id=0, eos_token_ids=[vocab + 1])
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (args.rows, args.prompt_tokens), generator=gen)
    mask = torch.ones_like(ids)
    params = SamplingParams(
        num_generations=1, max_new_tokens=args.new_tokens, temperature=1.0, top_p=1.0, top_k=0
    )
    with torch.no_grad():
        for _ in range(3):
            sampler.sample(ids, mask, params, gen)
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            sampler.sample(ids, mask, params, gen)
        per_call = (time.perf_counter() - t0) / args.repeats
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.repeats):
            sampler.sample(ids, mask, params, gen)
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
    result = {
        "benchmark": "NativeSampler.sample per call (prefill + decode steps), CPU",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "setup": vars(args) | {"model": model_dir, "fast_decode": sampler.fast_decode_status},
        "per_call_ms": per_call * 1e3,
        "per_new_token_ms": per_call * 1e3 / args.new_tokens,
        "torch": torch.__version__,
        "profile_top_by_own_time": text.getvalue().splitlines()[:40],
    }
    print(
        f"{args.rows} rows x {args.new_tokens} tokens (prompt {args.prompt_tokens}): "
        f"{result['per_call_ms']:.1f} ms per call, {result['per_new_token_ms']:.2f} ms per "
        f"token step (fast decode: {sampler.fast_decode_status})"
    )
    print(text.getvalue())
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
