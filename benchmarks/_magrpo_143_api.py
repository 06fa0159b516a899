"""The MAGRPO script of ``gpu_bench.py``'s ``compat`` phase, written against CoMLRL 1.4.3's
public API (``comlrl.trainers.reinforce.MAGRPOTrainer``), run by either implementation.

Not meant to be run by hand: ``gpu_bench.py`` calls

    python benchmarks/_magrpo_143_api.py --spec SPEC.json --out OUT.json

once with our packages (``comlrl-compat`` provides ``comlrl.trainers``) and once with
``PYTHONPATH=SITE`` where ``SITE`` holds ``comlrl==1.4.3`` (a regular package named
``comlrl``, so it cannot share a process with our ``comlrl.*`` namespace). Both build the
same two random-initialised models of the spec's shape (``gpu_bench.SHAPES``, seeds 0 and
1) with the spec's tokenizer, train on the same prompts with the same reward and sizes,
and time ``train()`` over ``prompts`` prompts after a warm-up ``train()`` over
``warmup_prompts``: seconds per prompt and CUDA peak memory.

Where ``wandb`` or ``datasets`` is not installed (the GPU machine has neither and no network),
CoMLRL 1.4.3 gets empty stand-ins: it imports both at module level but, with
``wandb_config=None`` and a list as dataset, uses ``wandb`` not at all and ``datasets`` only in
type annotations.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import sys
import time
import types
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _stand_in(name: str, **attrs: object) -> None:
    """An empty module ``name`` where the real one is not installed."""
    if importlib.util.find_spec(name) is not None:
        return
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    _stand_in("wandb")
    _stand_in(
        "datasets", Dataset=type("Dataset", (), {}), IterableDataset=type("IterableDataset", (), {})
    )

    import torch
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from gpu_bench import build_model, load_tokenizer, prompt_texts, side_reward

    tok = load_tokenizer(spec["tokenizer"])
    device = torch.device(spec["device"])
    agents = [build_model(spec["shape"], tok, device, seed=i) for i in range(2)]
    b, g = int(spec["batch"]), int(spec["G"])
    texts = prompt_texts(tok, spec["warmup_prompts"] + spec["prompts"], 48, seed=3)
    data = [{"id": i, "text": t} for i, t in enumerate(texts)]
    warm, meas = data[: spec["warmup_prompts"]], data[spec["warmup_prompts"] :]
    cfg = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=1e-6,
        logging_steps=10**6,
        num_agents=2,
        num_generations=g,
        max_new_tokens=int(spec["max_new_tokens"]),
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        num_turns=1,
        eval_interval=0,
        rollout_buffer_size=b,
        train_batch_size=b,
    )
    trainer = MAGRPOTrainer(
        agents=agents,
        tokenizer=tok,
        num_agents=2,
        reward_func=side_reward,
        formatters=[lambda ex: ex["text"]] * 2,
        train_dataset=warm,
        args=cfg,
        wandb_config=None,
    )
    cuda = device.type == "cuda"
    trainer.train()  # warm-up
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    trainer.train_dataset = meas
    t0 = time.perf_counter()
    trainer.train()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    out = {
        "shape": spec["shape"],
        "prompts": len(meas),
        "s": dt,
        "s_per_prompt": dt / max(1, len(meas)),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "comlrl_module": str(Path(sys.modules["comlrl.trainers"].__file__ or "").parent),
        "comlrl_version": _version(),
    }
    Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


def _version() -> str | None:
    for dist in ("comlrl", "comlrl-compat"):
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return None


if __name__ == "__main__":
    raise SystemExit(main())
