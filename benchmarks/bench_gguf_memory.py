"""Where the memory of a training process on a GGUF model goes (RSS at each stage).

One process does what ``comlrl train --model FILE.gguf`` does for a group-baseline run,
stage by stage, and records the resident set (``VmRSS``) after each stage and its peak
during it (``VmHWM``, reset before each stage through ``/proc/self/clear_refs``):

- ``imports``: torch, transformers and comlrl imported;
- ``load agent i``: the GGUF file read and dequantized to float32 (``load_model_and_tokenizer``);
- ``setup``: the trainer built (optimizers, environment, the task's examples);
- ``step k rollout`` / ``step k update i``: the rollout (sampling) and agent ``i``'s update
  (forward, backward, optimizer step) of step ``k``; ``step k trim``: what the training
  loop does after each step (:func:`comlrl.algos.training.run.host_memory.release_freed_memory`;
  ``--no-trim`` leaves it out);
- ``gc``, ``malloc_trim``: ``gc.collect()``, then glibc's ``malloc_trim(0)`` (memory freed
  but kept by the allocator goes back to the system).

After the last step it counts what the live tensors hold: the weights, gradients and
optimizer states of every agent, and every other tensor reachable from Python (caches),
each storage once. The rest of the RSS is the interpreter, the libraries and freed memory
the allocator keeps.

Usage (one process per run; Linux only):
  python benchmarks/bench_gguf_memory.py --model ../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf --out benchmarks/results/gguf_memory.json
  python benchmarks/bench_gguf_memory.py --model builtin:stories260k   # a quick dry run
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MIB = 2**20


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


STAGES: list[dict[str, Any]] = []


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Record the RSS after ``name`` and its peak during it."""
    _reset_peak()
    before = _status("VmRSS")
    t0 = time.perf_counter()
    yield
    row = {
        "stage": name,
        "rss_mib": _status("VmRSS") / MIB,
        "peak_mib": _status("VmHWM") / MIB,
        "delta_mib": (_status("VmRSS") - before) / MIB,
        "seconds": time.perf_counter() - t0,
    }
    STAGES.append(row)
    print(
        f"{name:<22} rss {row['rss_mib']:8.0f} MiB  peak {row['peak_mib']:8.0f} MiB  "
        f"delta {row['delta_mib']:+8.0f} MiB  ({row['seconds']:.1f} s)",
        file=sys.stderr,
    )


def _wrap(module: Any, name: str, label: Callable[[], str]) -> None:
    """Run ``module.name`` inside a :func:`stage` named by ``label()``."""
    inner = getattr(module, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with stage(label()):
            return inner(*args, **kwargs)

    setattr(module, name, wrapped)


def _storages(tensors: Any) -> dict[int, int]:
    """``{storage pointer: bytes}`` of the tensors (each storage once)."""
    import torch

    out: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_meta:
            s = t.untyped_storage()
            out[s.data_ptr()] = s.nbytes()
    return out


def census(agents: list[Any], optimizers: list[Any]) -> dict[str, float]:
    """What the live CPU tensors hold, in MiB: weights, gradients, optimizer states of the
    agents, and every other tensor the garbage collector can reach."""
    import torch

    params = [p for a in agents for p in a.model.parameters()]
    weights = _storages(params)
    grads = _storages(p.grad for p in params if p.grad is not None)
    states = _storages(v for opt in optimizers for st in opt.state.values() for v in st.values())
    with warnings.catch_warnings():  # isinstance() wakes deprecated torch attributes up
        warnings.simplefilter("ignore")
        everything = _storages(o for o in gc.get_objects() if isinstance(o, torch.Tensor))
    known = {**weights, **grads, **states}
    other = {k: v for k, v in everything.items() if k not in known}
    return {
        "weights_mib": sum(weights.values()) / MIB,
        "gradients_mib": sum(grads.values()) / MIB,
        "optimizer_states_mib": sum(states.values()) / MIB,
        "other_tensors_mib": sum(other.values()) / MIB,
        "other_tensors_count": len(other),
        "parameters": sum(p.numel() for p in params),
    }


def malloc_trim() -> bool:
    """Give memory the allocator keeps back to the system (glibc only)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.malloc_trim(0))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="a .gguf file or any model name")
    p.add_argument("--agents", type=int, default=2, help="as many as the task has")
    p.add_argument("--task", default="coop_story")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--group", type=int, default=4, help="num_generations")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--no-trim",
        action="store_true",
        help="skip the loop's release_freed_memory() after each step",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args()

    with stage("imports"):
        import torch
        import transformers
        from comlrl.algos.models.loading import load_model_and_tokenizer
        from comlrl.algos.recipes.group_baseline import recipe
        from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
        from comlrl.algos.rollout.agent import HFAgent
        from comlrl.algos.training.config.rl import TrainConfig
        from comlrl.algos.training.run.host_memory import release_freed_memory
        from comlrl.core import get_task

        torch.set_num_threads(args.threads)
    agents = []
    for i in range(args.agents):
        with stage(f"load agent {i}"):
            model, tok = load_model_and_tokenizer(args.model, dtype="float32")
            agents.append(HFAgent(model, tok, name=f"agent_{i}"))
    with stage("setup"):
        task = get_task(args.task)
        config = TrainConfig(
            models=[args.model],
            num_agents=args.agents,
            task={"name": args.task},
            num_steps=args.steps,
            batch_size=args.batch_size,
            num_generations=args.group,
            max_new_tokens=args.max_new_tokens,
            output_dir="/tmp/bench-gguf-memory",
            progress=False,
            parallel_agents=False,
            report_to=[],
            reward_curve=False,
        )
        trainer = MultiAgentTrainer(agents, config, task=task)
    at = {"step": 0, "update": 0}

    def next_update() -> str:
        at["update"] += 1
        return f"step {at['step']} update {at['update'] - 1}"

    _wrap(recipe, "rollout", lambda: f"step {at['step']} rollout")
    _wrap(recipe, "update_sharers", next_update)  # one call per agent
    for k in range(1, args.steps + 1):
        at["step"], at["update"] = k, 0
        trainer.train_step()
        if not args.no_trim:
            with stage(f"step {k} trim"):  # what the training loop does after each step
                release_freed_memory()
    optimizers = list(trainer.optimizers)
    counted = census(agents, optimizers)
    with stage("gc"):
        gc.collect()
    with stage("malloc_trim"):
        trimmed = malloc_trim()
    rss = STAGES[-1]["rss_mib"]
    counted["rss_after_trim_mib"] = rss
    counted["unaccounted_after_trim_mib"] = rss - (
        counted["weights_mib"]
        + counted["gradients_mib"]
        + counted["optimizer_states_mib"]
        + counted["other_tensors_mib"]
    )
    print(json.dumps(counted, indent=1), file=sys.stderr)
    task.close()
    result = {
        "benchmark": "gguf_memory",
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "settings": vars(args),
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "machine": platform.machine(),
        },
        "malloc_trim": trimmed,
        "stages": STAGES,
        "after_last_step": counted,
        "peak_mib": max(s["peak_mib"] for s in STAGES),
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
