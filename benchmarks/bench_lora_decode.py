"""Sampling speed of a LoRA agent (forward fallback) vs the same model without adapters
(fast decode step), on CPU.

LoRA layers are not plain ``nn.Linear``, so :class:`comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder`
refuses them and a LoRA agent decodes through the model's own forward (peft's LoRA
layers, one ``model(...)`` call per token). This script samples the same prompts with:

- ``full_fast``: the base model, fast decode step on (what a full fine-tuning agent gets);
- ``full_forward``: the base model, ``fast_decode=False`` (the forward path alone);
- ``lora_shared``: an agent's adapter on a shared base (2 agents, forward fallback).

Usage (repository root, comlrl-algos[lora] installed)::

    OMP_NUM_THREADS=1 python benchmarks/bench_lora_decode.py \
        --model builtin:stories260k --output benchmarks/results/lora_decode.json

Prints a table and writes JSON: per variant the median seconds per ``sample`` call over
``--repeats`` calls, new tokens per second, and the fast-decode status.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from comlrl.algos import HFAgent, load_model_and_tokenizer
from comlrl.algos.models.lora import LoraSettings, attach_lora
from comlrl.core import SamplingParams

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Once upon a time", "The little dog", "Tom and Lily went", "One day, a bird"]


def _time(agent: HFAgent, params: SamplingParams, repeats: int) -> dict[str, float | str]:
    agent.seed(0)
    agent.sample(PROMPTS, params)  # warm-up (and the fast decode check)
    times, tokens = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = agent.sample(PROMPTS, params)
        times.append(time.perf_counter() - t0)
        tokens.append(float(out.batch.completion_mask.sum()))
    med = statistics.median(times)
    return {
        "median_s": med,
        "tokens_per_s": statistics.median(tokens) / med,
        "fast_decode_status": agent.fast_decode_status,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:stories260k")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument(
        "--output", default=str(REPO / "benchmarks" / "results" / "lora_decode.json")
    )
    args = parser.parse_args()
    params = SamplingParams(num_generations=args.generations, max_new_tokens=args.max_new_tokens)

    def agent(fast: bool = True) -> HFAgent:
        torch.manual_seed(0)
        model, tok = load_model_and_tokenizer(args.model)
        return HFAgent(model, tok, fast_decode=fast, name="bench")

    results = {
        "full_fast": _time(agent(True), params, args.repeats),
        "full_forward": _time(agent(False), params, args.repeats),
    }
    lora_agents = [agent(True), agent(True)]
    attach_lora(lora_agents, LoraSettings(r=args.rank, target_modules="all-linear"), seed=0)
    results["lora_shared"] = _time(lora_agents[0], params, args.repeats)
    row = {
        "model": args.model,
        "prompts": len(PROMPTS),
        "generations": args.generations,
        "max_new_tokens": args.max_new_tokens,
        "lora_rank": args.rank,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "results": results,
    }
    print(f"{'variant':<14}{'median s':>10}{'tok/s':>10}  fast decode")
    for name, r in results.items():
        print(
            f"{name:<14}{r['median_s']:>10.3f}{r['tokens_per_s']:>10.0f}  {r['fast_decode_status']}"
        )
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(row, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
