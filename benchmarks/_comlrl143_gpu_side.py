"""CoMLRL 1.4.3 side of ``bench_gpu_decode_train.py`` (MAGRPO on a CUDA GPU).

Not meant to be run by hand: ``bench_gpu_decode_train.py --comlrl143-site DIR`` calls

    PYTHONPATH=DIR python benchmarks/_comlrl143_gpu_side.py --spec SPEC.json --out OUT.json

where DIR holds ``comlrl==1.4.3`` (a regular package named ``comlrl``, so it cannot share a
process with our ``comlrl.*`` namespace) and its needs. Same models, prompts, reward and
sizes as our side (``train_speed``): two agents, ``batch`` prompts per optimizer step
(``rollout_buffer_size = train_batch_size = batch``), ``G`` completions per prompt,
``max_new_tokens``; one warm-up ``train()`` over ``batch`` prompts, then ``train()`` over
``steps * batch`` prompts is timed, with the CUDA peak memory reset in between.

``wandb`` is imported by CoMLRL 1.4.3 at module level but never called with
``wandb_config=None``; where it is not installed (the GPU machine has no network to fetch
it) an empty stand-in module is registered so the import succeeds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        import wandb  # noqa: F401
    except ImportError:
        import importlib.machinery

        stub = types.ModuleType("wandb")
        stub.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # find_spec() works
        sys.modules["wandb"] = stub

    import torch
    from bench_gpu_decode_train import _prompts, _reward, qwen2_05b_shape
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    b, steps = int(spec["batch"]), int(spec["steps"])
    if spec["model"] == "qwen2-0.5b-shape":
        pairs = [qwen2_05b_shape(seed=i) for i in range(2)]
        agents, tok = [m for m, _ in pairs], pairs[0][1]
    else:
        agents = [AutoModelForCausalLM.from_pretrained(spec["stories260k"]) for _ in range(2)]
        tok = AutoTokenizer.from_pretrained(spec["stories260k"])
    texts = _prompts(64, 24, 500, 3)
    data = [{"id": i, "text": t} for i, t in enumerate(texts)]
    warm, meas = data[:b], data[b : b + steps * b]
    cfg = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=1e-5,
        logging_steps=10**6,
        num_agents=2,
        num_generations=int(spec["G"]),
        max_new_tokens=int(spec["max_new_tokens"]),
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        num_turns=1,
        eval_interval=0,
        rollout_buffer_size=b,
        train_batch_size=b,
    )
    lens: list[int] = []
    trainer = MAGRPOTrainer(
        agents=agents,
        tokenizer=tok,
        num_agents=2,
        reward_func=_reward,
        formatters=[lambda ex: ex["text"]] * 2,
        train_dataset=warm,
        args=cfg,
        wandb_config=None,
    )
    gen = trainer._generate_completions

    def counted(*a, **kw):
        out = gen(*a, **kw)
        lens.extend(int(x) for x in out["response_lens"])
        return out

    trainer._generate_completions = counted
    cuda = torch.cuda.is_available()
    trainer.train()  # warm-up
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    lens.clear()
    trainer.train_dataset = meas
    t0 = time.perf_counter()
    trainer.train()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    out = {
        "model": spec["model"],
        "steps": steps,
        "batch_size": b,
        "G": int(spec["G"]),
        "max_new_tokens": int(spec["max_new_tokens"]),
        "steps_per_s": steps / dt,
        "prompts_per_s": steps * b / dt,
        "tokens_per_s": sum(lens) / dt,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "comlrl": metadata.version("comlrl"),
    }
    Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
