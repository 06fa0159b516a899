"""Does a small chat model call a task's tool without a worked example in its prompt?

The task is ``StockCountTask`` exactly as ``docs/custom-tasks.md`` writes it (section "A task
with a tool, taught by a worked example"; this script runs the definitions of that page's
block): two agents each look up one item's count with a JSON-format ``stock`` tool and end
with an ``Answer:`` line. Untrained SmolLM2-135M-Instruct (a GGUF file; its chat template renders no
tools, so the rollout declares the tool as text in the system message) is evaluated twice
on the first ``--limit`` test pairs, ``--samples`` sampled joint actions each at
``--temperature``: with ``example=False`` and with ``example=True`` (the worked exchange
opening every prompt). Reported per setting: the mean joint reward, tool calls per
completion per agent, and the calls that ended in each error kind.

Usage (about 4 minutes on 2 CPU cores)::

    python benchmarks/bench_tool_worked_example.py --model ../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf --out benchmarks/results/tool_worked_example.json
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _bench_common import git_commit, machine_info
from comlrl.algos import HFAgent, MultiAgentTrainer, TrainConfig, load_model_and_tokenizer

HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "docs" / "custom-tasks.md"
SECTION = "## A task with a tool, taught by a worked example"


def documented_task() -> type:
    """``StockCountTask`` from the page's first Python block of :data:`SECTION`: its
    definitions, up to the line ``task = StockCountTask()`` where the page starts using it."""
    text = PAGE.read_text(encoding="utf-8")
    block = re.findall(r"```python\n(.*?)```", text[text.index(SECTION) :], re.S)[0]
    block = block[: block.index("\ntask = StockCountTask()")]
    namespace: dict[str, Any] = {"__name__": "stock_count"}
    exec(compile(block, f"{PAGE}:{SECTION}", "exec"), namespace)  # noqa: S102 - our docs
    return namespace["StockCountTask"]


def evaluate(args: argparse.Namespace, task_cls: type, example: bool, work: Path) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    model, tokenizer = load_model_and_tokenizer(args.model)
    agents = [HFAgent(model, tokenizer, name=f"agent_{i}") for i in range(2)]
    task = task_cls(example=example)
    config = TrainConfig(
        num_agents=2,
        num_steps=1,
        batch_size=args.limit,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        eval_every=1,
        eval_greedy=False,
        eval_num_samples=args.samples,
        eval_limit=args.limit,
        learning_rate=0.0,
        prompt_format="chat",
        seed=args.seed,
        progress=False,
        output_dir=str(work / f"example_{example}"),
    )
    t0 = time.perf_counter()
    row = MultiAgentTrainer(agents, config, task=task, eval_dataset=task.load("test")).evaluate()
    return {
        "example": example,
        "seconds": round(time.perf_counter() - t0, 1),
        "reward_mean": row["reward_mean"],
        "completions_per_agent": args.limit * args.samples,
        "tool_calls_per_completion": [row.get(f"tool_calls_mean/agent_{a}", 0.0) for a in (0, 1)],
        "tool_errors": {
            k.split("/", 1)[1]: v for k, v in row.items() if k.startswith("tool_errors/") and v
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="a chat model: Hub id, folder or .gguf file")
    p.add_argument("--limit", type=int, default=4, help="test pairs")
    p.add_argument("--samples", type=int, default=4, help="sampled joint actions per pair")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    task_cls = documented_task()
    with tempfile.TemporaryDirectory() as work:
        results = [evaluate(args, task_cls, example, Path(work)) for example in (False, True)]
    for r in results:
        calls = " / ".join(f"{c:.2f}" for c in r["tool_calls_per_completion"])
        print(
            f"example={r['example']!s:5}  reward {r['reward_mean']:.3f}  calls per completion "
            f"{calls}  errors {r['tool_errors']}  ({r['seconds']} s)"
        )
    report = {
        "benchmark": "tool_worked_example",
        "command": "python "
        + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
        "commit": git_commit(HERE.parent),
        "machine": machine_info(args.threads),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
