"""Baselines of a real instruct LLM on the task suites: greedy reward and pass@1, raw vs chat
prompts, the two-agent team vs the main agent alone.

Default model: SmolLM2-135M-Instruct from its GGUF file in ``../shared/models`` (any
``--model`` that ``comlrl train`` accepts works: a ``.gguf`` file, a ``save_pretrained``
folder, a cached Hub id). For every task and prompt format the agents (two copies of the
model; one model object, nothing is trained) roll out the task's evaluation split greedily
(:func:`comlrl.algos.rollout.evaluate.evaluate`, the same code as ``comlrl eval``):

- ``team``: the task's joint reward of the two agents' completions, and ``pass@1`` where the
  task has a verdict (the code suites: every test passed; gsm8k: both answers right);
- ``single``: the same completions re-scored with the teammate's share removed, i.e. what
  the main agent achieves alone: for the code suites agent 1's helper is replaced by an
  empty completion (agent 2's entry point alone must pass the tests); for gsm8k the
  reasoner's answer alone is checked (``info["correct"][0]``); for coop_story there is no
  single-agent version of the task (``null``).

``raw`` feeds the tasks' completion-style texts (what a base model needs), ``chat`` applies
the tokenizer's chat template to the tasks' chat messages (``prompt_format`` of the agents).

    python benchmarks/bench_real_llm_baselines.py --limit 16   # runs/real-llm-baselines/

(``--out benchmarks/results/real_llm_baselines.json`` refreshes the committed JSON.)

prints one line per (task, format) and writes the JSON (machine, settings, rows) after each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import git_commit, machine_info  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = REPO.parent / "shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
TASKS = ["coop_humaneval", "coop_humaneval_che", "mbpp", "gsm8k", "coop_story"]
#: Local data files of the suites that have no copy inside a package (``../shared/data``).
TASK_KWARGS: dict[str, dict[str, Any]] = {
    "coop_humaneval_che": {"path": str(REPO.parent / "shared/data/CoopHumanEval_che_raw.json")},
    "mbpp": {"path": str(REPO.parent / "shared/data/mbpp.jsonl")},
    "gsm8k": {"path": str(REPO.parent / "shared/data/gsm8k_test.jsonl")},
}
CODE_TASKS = {"coop_humaneval", "coop_humaneval_che", "mbpp"}


def single_agent_scores(task: Any, name: str, rollouts: list[Any]) -> dict[str, float] | None:
    """Reward mean and pass rate of the main agent alone (see the module docstring)."""
    if name == "coop_story":
        return None
    rewards, passed = [], []
    for ro in rollouts:
        turn = ro.turns[0]
        k = turn.joint_index.shape[0]
        examples = [ro.examples[int(turn.example_index[n])] for n in range(turn.num_nodes)]
        main = [turn.agents[1].completions[n][0].text for n in range(turn.num_nodes)]
        if name in CODE_TASKS:
            scored = task.reward([[""] * len(main), main], examples)
            rewards += [float(r) for r in scored.rewards]
            passed += [info.get("status") == "passed" for info in scored.infos]
        else:  # gsm8k: the reasoner's (agent 1's) own answer
            for n in range(turn.num_nodes):
                info = turn.infos[n * k]
                correct = bool(info.get("correct", [False])[0])
                passed.append(correct)
                rewards.append(float(correct))
    return {
        "reward_mean": sum(rewards) / len(rewards),
        "pass@1": sum(passed) / len(passed),
    }


def build_parser() -> argparse.ArgumentParser:
    """The script's options; ``--out`` defaults to a fresh path under ``runs/``, never the
    committed ``benchmarks/results/real_llm_baselines.json`` (pass it to refresh that)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_GGUF))
    parser.add_argument("--tasks", nargs="+", default=TASKS)
    parser.add_argument("--formats", nargs="+", default=["raw", "chat"])
    parser.add_argument("--limit", type=int, default=16, help="problems per task (eval split)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/real-llm-baselines/real_llm_baselines.json")
    parser.add_argument(
        "--keep", action="store_true", help="keep --out's rows and measure only the missing ones"
    )
    return parser


def main() -> None:
    args = build_parser().parse_args()

    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.rollout.environment import TaskEnvironment
    from comlrl.algos.rollout.evaluate import eval_sampling, evaluate
    from comlrl.core import get_task

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(args.model)
    load_s = time.perf_counter() - t0
    model.eval()
    result: dict[str, Any] = {
        "benchmark": "real_llm_baselines",
        "command": " ".join(sys.argv),
        "commit": git_commit(REPO),
        "machine": machine_info(args.threads),
        "model": args.model,
        "load_s": round(load_s, 1),
        "settings": {
            "limit": args.limit,
            "max_new_tokens": args.max_new_tokens,
            "greedy": True,
            "split": "test",
        },
        "rows": [],
    }
    done: set[tuple[str, str]] = set()
    if args.keep and Path(args.out).is_file():
        result["rows"] = json.loads(Path(args.out).read_text())["rows"]
        done = {(r["task"], r["format"]) for r in result["rows"]}
    params = eval_sampling(1, args.max_new_tokens, greedy=True)
    for name in args.tasks:
        task = get_task(name, **TASK_KWARGS.get(name, {}))
        try:
            data = list(task.load("test"))[: args.limit]
            env = TaskEnvironment(task)
            for fmt in args.formats:
                if (name, fmt) in done:
                    continue
                agents = [
                    HFAgent(model, tokenizer, name=f"agent_{i}", prompt_format=fmt)
                    for i in range(task.num_agents)
                ]
                start = time.perf_counter()
                row, rollouts = evaluate(
                    agents, env, data, params, batch_size=args.batch_size, seed=0
                )
                single = single_agent_scores(task, name, rollouts)
                out = {
                    "task": name,
                    "format": fmt,
                    "problems": len(data),
                    "team": {k: row[k] for k in ("reward_mean", "pass@1") if k in row},
                    "single": single,
                    "seconds": round(time.perf_counter() - start, 1),
                }
                result["rows"].append(out)
                print(json.dumps(out), flush=True)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        finally:
            task.close()


if __name__ == "__main__":
    main()
