"""On a CUDA GPU: FastDecoder vs the model's forward (bf16), decode tokens/s vs Hugging Face
``generate``, and MAGRPO training steps/s and peak memory.

Models (nothing downloaded):
- ``qwen2-0.5b-shape``: a ``Qwen2ForCausalLM`` with Qwen2-0.5B's layer shapes (hidden 896,
  24 layers, 14 heads, 2 KV heads, MLP 4864, vocab 151936, tied embeddings) and random
  weights, bf16, with a word-level tokenizer built on the spot over the same vocabulary;
- ``stories260k``: the pretrained 260K-parameter Llama, from ``--stories260k DIR``.

Usage (on the GPU machine, from the repo root)::

    python benchmarks/bench_gpu_decode_train.py --out results/gpu_decode_train.json \
        [--stories260k path/to/stories260k]

Prints a table and writes JSON: device, driver, CUDA and torch versions, each measurement.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import torch


def _tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="w0", pad_token="w0", unk_token="w1"
    )


def qwen2_05b_shape(seed: int = 0) -> tuple[Any, Any]:
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=0,
        pad_token_id=0,
        rope_theta=1e6,
    )
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=0, pad_token_id=0)
    return model, _tokenizer(cfg.vocab_size)


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (n, length), generator=g)
    return [" ".join(f"w{i}" for i in row.tolist()) for row in ids]


def _reward(c1: list[str], c2: list[str]) -> list[float]:
    """A cheap joint reward (length residues), the same on both sides of the comparison."""
    return [float(len(a) % 7 + len(b) % 5) / 10 for a, b in zip(c1, c2)]


def comlrl143_train_speed(
    site: str, model: str, stories: str | None, steps: int, batch: int, g: int, new_tokens: int
) -> dict[str, Any]:
    """CoMLRL 1.4.3's MAGRPOTrainer on the same GPU, in its own process (see
    ``_comlrl143_gpu_side.py``)."""
    import os
    import sys
    import tempfile

    spec = {"model": model, "stories260k": stories, "steps": steps, "batch": batch, "G": g}
    spec["max_new_tokens"] = new_tokens
    with tempfile.TemporaryDirectory() as tmp:
        sp, op = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        sp.write_text(json.dumps(spec))
        env = {**os.environ, "PYTHONPATH": site}
        side = Path(__file__).resolve().parent / "_comlrl143_gpu_side.py"
        proc = subprocess.run(
            [sys.executable, str(side), "--spec", str(sp), "--out", str(op)],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            return {"model": model, "error": proc.stderr[-3000:]}
        return dict(json.loads(op.read_text()))


def fast_vs_forward(model: Any, tok: Any) -> dict[str, Any]:
    """The agent's own once-per-agent check, plus a whole-sequence comparison."""
    from comlrl.algos import HFAgent
    from comlrl.core import SamplingParams

    agent = HFAgent(model, tok, eos_token_ids=[0])
    agent.seed(0)
    samples = agent.sample(
        _prompts(4, 32, 151936, 1), SamplingParams(num_generations=2, max_new_tokens=16)
    )
    batch = samples.batch
    with torch.no_grad():
        from comlrl.algos.models.logprobs import completion_logprobs

        logp = completion_logprobs(model, batch, slice(0, batch.num_prompts), shared_prefix=False)
    m = batch.completion_mask
    diff = float((logp[m] - batch.behaviour_logprobs[m]).abs().max())
    return {"fast_decode_status": agent.fast_decode_status, "max_abs_logprob_diff_vs_forward": diff}


def decode_speed(
    model: Any, tok: Any, prompts: int, g: int, new_tokens: int, prompt_len: int
) -> dict[str, Any]:
    from comlrl.algos import HFAgent
    from comlrl.core import SamplingParams

    params = SamplingParams(num_generations=g, max_new_tokens=new_tokens)
    texts = _prompts(prompts, prompt_len, 151936, 2)
    never = [151935 + 7]  # no EOS: every row decodes new_tokens tokens on every side
    out: dict[str, Any] = {
        "prompts": prompts,
        "G": g,
        "new_tokens": new_tokens,
        "prompt_len": prompt_len,
    }
    for name, fast in (("ours_fast", True), ("ours_forward", False)):
        agent = HFAgent(model, tok, eos_token_ids=never, fast_decode=fast)
        agent.seed(0)
        agent.sample(texts, params)  # warm-up (and the fast step's check)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        s = agent.sample(texts, params)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        n = int(s.batch.completion_mask.sum())
        out[name] = {
            "s": dt,
            "tokens": n,
            "tokens_per_s": n / dt,
            "status": agent.fast_decode_status,
        }
    enc = tok(texts, return_tensors="pt", padding=True).to("cuda")
    kw = dict(
        do_sample=True,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        num_return_sequences=g,
        pad_token_id=0,
    )
    model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], **kw)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    seq = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n = (seq.shape[1] - enc["input_ids"].shape[1]) * seq.shape[0]
    out["hf_generate"] = {"s": dt, "tokens": n, "tokens_per_s": n / dt}
    return out


def train_speed(
    name: str, agents_fn: Any, steps: int, batch: int, g: int, new_tokens: int
) -> dict[str, Any]:
    import tempfile

    from comlrl.algos import MultiAgentTrainer, TrainConfig

    data = [{"id": i, "text": t} for i, t in enumerate(_prompts(64, 24, 500, 3))]
    agents = agents_fn()
    cfg = TrainConfig(
        num_steps=steps,
        batch_size=batch,
        num_generations=g,
        max_new_tokens=new_tokens,
        learning_rate=1e-5,
        device="cuda",
        output_dir=tempfile.mkdtemp(),
        progress=False,
        log_samples=0,
    )
    trainer = MultiAgentTrainer(
        agents, cfg, dataset=data, reward_func=_reward, formatters=[lambda ex: ex["text"]] * 2
    )
    trainer.step()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    rows = [trainer.step().row for _ in range(steps)]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    trainer.close()
    return {
        "model": name,
        "steps": steps,
        "batch_size": batch,
        "G": g,
        "max_new_tokens": new_tokens,
        "steps_per_s": steps / dt,
        "prompts_per_s": steps * batch / dt,
        "tokens_per_s": sum(r["num_tokens"] for r in rows) / dt,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "stage_s": {
            k: sum(r[f"time/{k}_s"] for r in rows) / steps for k in ("generate", "reward", "update")
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--stories260k", default=None)
    p.add_argument(
        "--comlrl143-site",
        default=None,
        help="folder holding comlrl==1.4.3 and its needs: also time its MAGRPOTrainer",
    )
    p.add_argument("--skip-decode", action="store_true", help="only the training runs")
    args = p.parse_args()
    from comlrl.algos import HFAgent, load_model_and_tokenizer

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    result: dict[str, Any] = {"device": smi, "torch": torch.__version__, "cuda": torch.version.cuda}
    if not args.skip_decode:
        model, tok = qwen2_05b_shape()
        result["fast_vs_forward_bf16"] = fast_vs_forward(model, tok)
        print(result["fast_vs_forward_bf16"], flush=True)
        result["decode"] = [decode_speed(model, tok, 8, 8, 128, 64)]
        print(json.dumps(result["decode"], indent=1), flush=True)
        del model
        torch.cuda.empty_cache()
    runs: list[dict[str, Any]] = []
    qwen = dict(steps=3, batch=4, g=4, new_tokens=64)
    runs.append(
        train_speed(
            "qwen2-0.5b-shape (random, bf16)",
            lambda: [
                HFAgent(*qwen2_05b_shape(seed=i), eos_token_ids=[0], name=f"agent_{i}")
                for i in range(2)
            ],
            **qwen,  # type: ignore[arg-type]
        )
    )
    print(runs[-1], flush=True)
    torch.cuda.empty_cache()
    if args.comlrl143_site:
        runs.append(
            {
                "side": "comlrl-1.4.3",
                **comlrl143_train_speed(args.comlrl143_site, "qwen2-0.5b-shape", None, **qwen),
            }  # type: ignore[arg-type]
        )
        print(runs[-1], flush=True)
    if args.stories260k:
        small = dict(steps=5, batch=8, g=4, new_tokens=64)

        def stories() -> list[Any]:
            out = []
            for i in range(2):
                m, t = load_model_and_tokenizer(args.stories260k)
                out.append(HFAgent(m.cuda(), t, name=f"agent_{i}"))
            return out

        runs.append(train_speed("stories260k (fp32)", stories, **small))  # type: ignore[arg-type]
        print(runs[-1], flush=True)
        if args.comlrl143_site:
            runs.append(
                {
                    "side": "comlrl-1.4.3",
                    **comlrl143_train_speed(
                        args.comlrl143_site, "stories260k", args.stories260k, **small
                    ),
                }  # type: ignore[arg-type]
            )
            print(runs[-1], flush=True)
    result["train"] = runs
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
