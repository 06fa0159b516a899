"""Benchmark the update's log-prob forward + backward: fused vs materialised logits.

Runs :func:`comlrl.algos.models.logprobs.completion_logprobs` (the update's own code path,
``shared_prefix=True``) on a Qwen2-0.5B-shaped model cut to its last layers: random weights,
``V = 151,936``, ``H = 896``, MLP 4864, 14 heads (2 KV), tied embeddings, ``--layers``
decoder layers (default 1). The loss is ``-(logp * mask).sum()`` and the backward reaches
every parameter, as in :func:`comlrl.algos.training.update.policy.update_policy`.

Methods (each in a fresh subprocess, see below):
- materialised:  ``fused=False``: ``[N, V]`` logits via ``logits_to_keep``, then
  ``comlrl.kernels.token_logprobs`` (today's path before the fused one).
- fused:         ``fused=True`` with the default chunk (256 rows at this V).
- fused_c1024:   ``fused=True``, ``chunk_size=1024`` (the kernels' own default at N >= 1024).
- matmul_x1:     one pass of ``hidden @ W.T`` over the N tokens in chunks of 256, no autograd:
  the cost unit. Materialised fwd+bwd does 3 such matmuls (forward, grad_hidden,
  grad_weight), fused does 4 (the backward recomputes each chunk's logits).

Peak memory (CPU): growth of the process's peak RSS (``ru_maxrss``) over one fwd+bwd,
from just after the model, batch and a warm forward of the decoder exist; it includes the
float32 ``[V, H]`` weight gradient (519 MiB) that both methods allocate. Time: median of
``--repeats`` fwd+bwd runs after the measured one, as wall seconds and as CPU seconds
(user + system of the process: on a machine shared with other jobs the wall time swings
by 2x between runs, the CPU time far less). Results and the environment go to
``benchmarks/results/fused_update_cpu.json``.

    OMP_NUM_THREADS=2 python benchmarks/bench_fused_update.py --tokens 2048,4096
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "fused_update_cpu.json"
VOCAB, HIDDEN, COMPLETION_LEN, PROMPT_LEN, GROUP = 151_936, 896, 256, 32, 4


def _cpu_s() -> float:
    """CPU seconds (user + system) this process has used: steadier than wall time when
    other jobs share the cores."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _model(layers: int) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=0,
    )
    return Qwen2ForCausalLM(cfg)


def _batch(tokens: int) -> Any:
    from comlrl.algos.records import PolicyBatch

    b = tokens // COMPLETION_LEN
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, VOCAB, (b // GROUP, PROMPT_LEN), generator=gen)
    ids = torch.cat(
        [
            prompts.repeat_interleave(GROUP, 0),
            torch.randint(1, VOCAB, (b, COMPLETION_LEN), generator=gen),
        ],
        1,
    )
    comp_mask = torch.ones(b, COMPLETION_LEN, dtype=torch.bool)
    return PolicyBatch(ids, torch.ones_like(ids), comp_mask, torch.zeros(b, COMPLETION_LEN), GROUP)


def child(case: dict[str, Any]) -> dict[str, Any]:
    from comlrl.algos.models.logprobs import completion_logprobs, fused_logprobs_unsupported

    model, batch = _model(case["layers"]), _batch(case["tokens"])
    method = case["method"]
    assert fused_logprobs_unsupported(model) is None
    if method == "matmul_x1":
        hidden = torch.randn(case["tokens"], HIDDEN)
        weight = model.lm_head.weight.detach()

        def run() -> None:
            for s in range(0, hidden.shape[0], 256):
                hidden[s : s + 256] @ weight.t()
    else:
        kw: dict[str, Any] = {"fused": method != "materialised"}
        if method == "fused_c1024":
            kw["chunk_size"] = 1024

        def run() -> None:
            model.zero_grad(set_to_none=True)
            logp = completion_logprobs(model, batch, slice(0, batch.num_prompts), **kw)
            (-(logp * batch.completion_mask).sum()).backward()

        with torch.no_grad():  # warm the decoder's lazy allocations outside the measurement
            model.get_decoder()(input_ids=batch.input_ids[:1, :8], use_cache=False)
    before = _maxrss_mib()
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    peak = _maxrss_mib() - before
    samples, cpu = [], []
    for _ in range(case["repeats"]):
        t0, c0 = time.perf_counter(), _cpu_s()
        run()
        samples.append(time.perf_counter() - t0)
        cpu.append(_cpu_s() - c0)
    return {
        "peak_mib": peak,
        "first_s": first,
        "s": statistics.median(samples) if samples else first,
        "cpu_s": statistics.median(cpu) if cpu else None,
        "samples_s": samples,
        "samples_cpu_s": cpu,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--tokens", default="2048,4096", help="completion tokens N per update (b * L, L=256)"
    )
    p.add_argument("--methods", default="materialised,fused,fused_c1024,matmul_x1")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    rows = []
    for n in (int(x) for x in args.tokens.split(",")):
        for method in args.methods.split(","):
            case = {"tokens": n, "method": method, "layers": args.layers, "repeats": args.repeats}
            proc = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(case)],
                capture_output=True,
                text=True,
            )
            if proc.returncode:
                res = {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
            else:
                res = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append({**case, **res})
            print(json.dumps(rows[-1]), flush=True)
    for n in {r["tokens"] for r in rows}:
        by = {r["method"]: r for r in rows if r["tokens"] == n and "error" not in r}
        base = by.get("materialised")
        for r in by.values():
            if base and r["method"] != "matmul_x1":
                r["peak_vs_materialised"] = r["peak_mib"] / base["peak_mib"]
                r["time_vs_materialised"] = r["s"] / base["s"]
                if r.get("cpu_s") and base.get("cpu_s"):
                    r["cpu_vs_materialised"] = r["cpu_s"] / base["cpu_s"]
            if "matmul_x1" in by and r["method"] != "matmul_x1":
                r["time_in_lm_head_matmuls"] = r["s"] / by["matmul_x1"]["s"]
                if r.get("cpu_s") and by["matmul_x1"].get("cpu_s"):
                    r["cpu_in_lm_head_matmuls"] = r["cpu_s"] / by["matmul_x1"]["cpu_s"]
    cols = [
        "tokens",
        "method",
        "peak_mib",
        "s",
        "peak_vs_materialised",
        "time_vs_materialised",
        "cpu_s",
        "cpu_vs_materialised",
        "cpu_in_lm_head_matmuls",
        "time_in_lm_head_matmuls",
    ]
    print("  ".join(cols))
    for r in rows:
        print(
            "  ".join(
                f"{r.get(c):.2f}" if isinstance(r.get(c), float) else str(r.get(c, "-"))
                for c in cols
            )
        )
    from comlrl.kernels import backend_info

    payload = {
        "benchmark": "bench_fused_update",
        "shape": {
            "vocab": VOCAB,
            "hidden": HIDDEN,
            "completion_len": COMPLETION_LEN,
            "prompt_len": PROMPT_LEN,
            "group": GROUP,
            "layers": args.layers,
            "dtype": "float32",
        },
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "kernels": backend_info(),
            "load_average_at_end": os.getloadavg(),
        },
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
