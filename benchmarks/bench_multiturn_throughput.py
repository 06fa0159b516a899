"""Multi-turn training throughput: our MAGRPO recipe vs the published CoMLRL 1.4.3, in one run.

Both sides train two stories260k agents (the same local folder) on the cooperative story
task of ``benchmarks/_story_reward.py`` (the same file on both sides: prompts, joint reward
and CoMLRL's ``external_transition``), with ``num_turns=2``, ``G=4`` aligned joint actions,
every joint action of turn 1 opening a turn-2 node (the full tree, as CoMLRL builds it; no
early termination), temperature 1.0, ``max_new_tokens``, lr 1e-3, the examples in the same
order, after the same number of warm-up steps. One step = ``batch_size`` prompts with their
whole trees and every agent's update. CoMLRL 1.4.3 runs in its own venv through
``benchmarks/_comlrl143_multiturn_side.py`` (its ``comlrl`` cannot share a venv with our
``comlrl.*`` namespace packages).

Metrics: prompts per second and completion tokens per second (the sum of every sampled
completion's length up to its EOS; learned lengths change decode time, so both are shown).

Usage (from the repo root)::

    /work/venv/bin/python benchmarks/bench_multiturn_throughput.py \
        --comlrl143-python /work/venv-comlrl143/bin/python

Writes ``benchmarks/results/multiturn_throughput.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("TQDM_DISABLE", "1")
from _bench_common import git_commit, machine_info, run_side  # noqa: E402

TARGET_SPEEDUP = 5.0


def run_ours(
    args: argparse.Namespace, examples: list[dict[str, Any]], batch_size: int, steps: int
) -> dict[str, Any]:
    import torch
    from _story_reward import agent_prompt, story_reward, transition
    from comlrl.algos import HFAgent, MultiAgentTrainer, TrainConfig, load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = TrainConfig(
        models=[args.model],
        num_agents=2,
        num_turns=2,
        num_generations=4,
        joint_mode="align",
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        learning_rate=args.learning_rate,
        batch_size=batch_size,
        seed=args.seed,
        shuffle=False,
        log_samples=0,
        progress=False,
        reward_curve=False,  # no plot inside the timed run
        output_dir=tempfile.mkdtemp(prefix="comlrl-mt-"),
    )
    agents = [HFAgent(*load_model_and_tokenizer(args.model), name=f"agent_{i}") for i in range(2)]
    trainer = MultiAgentTrainer(
        agents,
        cfg,
        dataset=examples,
        formatters=[lambda ex: agent_prompt(ex, 0), lambda ex: agent_prompt(ex, 1)],
        reward_func=lambda c1, c2, example: story_reward(c1, c2, example),
        transition=transition,
    )
    for _ in range(args.warmup):
        trainer.step()
    history = []
    t0 = time.perf_counter()
    for _ in range(steps):
        history.append(trainer.step().row)
    wall = time.perf_counter() - t0
    trainer.close()
    tokens = sum(h["num_tokens"] for h in history)
    prompts = steps * batch_size
    stage = {
        k: sum(h[f"time/{k}_s"] for h in history) / steps
        for k in ("generate", "reward", "transition", "update")
    }
    return {
        "side": "ours",
        "prompts": prompts,
        "steps": steps,
        "batch_size": batch_size,
        "wall_s": wall,
        "prompts_per_s": prompts / wall,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "stage_s_per_step": stage,
        "reward_mean_by_turn": {
            f"turn_{t}": sum(h[f"turn_{t}/reward_mean"] for h in history) / steps for t in (0, 1)
        },
        "nodes_per_step_by_turn": {f"turn_{t}": history[0][f"turn_{t}/num_nodes"] for t in (0, 1)},
    }


def run_theirs(
    args: argparse.Namespace, examples_path: Path, batch_size: int, steps: int, work: Path
) -> dict[str, Any]:
    spec = {
        "model_dirs": [args.model, args.model],
        "examples_path": str(examples_path),
        "batch_size": batch_size,
        "steps": steps,
        "warmup": args.warmup,
        "num_turns": 2,
        "num_generations": 4,
        "max_new_tokens": args.max_new_tokens,
        "temperature": 1.0,
        "learning_rate": args.learning_rate,
        "seed": args.seed,
        "threads": args.threads,
    }
    script = REPO / "benchmarks" / "_comlrl143_multiturn_side.py"
    return run_side(args.comlrl143_python, script, spec, work, f"b{batch_size}")


def _median(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The trial with the median prompts/s."""
    ranked = sorted(trials, key=lambda t: t["prompts_per_s"])
    return ranked[len(ranked) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--comlrl143-python", help="python of a venv with comlrl==1.4.3 (omit: ours only)"
    )
    parser.add_argument("--model", default=str(REPO.parent / "shared" / "models" / "stories260k"))
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument(
        "--prompts", type=int, default=8, help="measured prompts per batch size and trial"
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=3, help="alternating trials per side (median)"
    )
    parser.add_argument(
        "--output", default=str(REPO / "benchmarks" / "results" / "multiturn_throughput.json")
    )
    args = parser.parse_args(argv)
    sys.path[:0] = [
        str(REPO / "packages" / p / "src")
        for p in ("comlrl-core", "comlrl-algos", "comlrl-kernels")
    ]
    import torch
    from _story_reward import story_examples

    args.threads = args.threads or torch.get_num_threads()
    examples = story_examples(400, args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        examples_path = work / "examples.json"
        examples_path.write_text(json.dumps(examples))
        for b in (int(x) for x in args.batch_sizes.split(",")):
            steps = max(1, args.prompts // b)
            trials: dict[str, list[dict[str, Any]]] = {"ours": [], "comlrl143": []}
            for _ in range(args.repeats):  # alternate the sides so both see the same machine load
                trials["ours"].append(
                    {**run_ours(args, examples, b, steps), "loadavg": os.getloadavg()}
                )
                if args.comlrl143_python:
                    trials["comlrl143"].append(
                        {
                            **run_theirs(args, examples_path, b, steps, work),
                            "loadavg": os.getloadavg(),
                        }
                    )
            ours = _median(trials["ours"])
            theirs = _median(trials["comlrl143"]) if trials["comlrl143"] else None
            row: dict[str, Any] = {
                "batch_size": b,
                "steps": steps,
                "ours": ours,
                "comlrl143": theirs,
            }
            if theirs:
                ratios = [
                    o["prompts_per_s"] / t["prompts_per_s"]
                    for o, t in zip(trials["ours"], trials["comlrl143"])
                ]
                row["speedup_prompts_per_s"] = ours["prompts_per_s"] / theirs["prompts_per_s"]
                row["speedup_tokens_per_s"] = ours["tokens_per_s"] / theirs["tokens_per_s"]
                row["speedup_per_trial"] = ratios
            row["trials"] = {
                k: [{m: t[m] for m in ("prompts_per_s", "tokens_per_s", "loadavg")} for t in v]
                for k, v in trials.items()
            }
            rows.append(row)
            print(
                json.dumps({k: v for k, v in row.items() if k.startswith(("batch", "speedup"))}),
                flush=True,
            )
    result = {
        "benchmark": "multi-turn MAGRPO throughput (T=2, G=4 align, full tree), stories260k x2, story task",
        "command": " ".join([Path(sys.executable).as_posix(), *sys.argv]),
        "target_speedup": TARGET_SPEEDUP,
        "rows": rows,
        "machine": machine_info(args.threads),
        "git_commit": git_commit(REPO),
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2))
    print(
        f"{'batch':>5} {'ours p/s':>9} {'1.4.3 p/s':>9} {'x':>6} {'ours tok/s':>10} {'1.4.3 tok/s':>11} {'x':>6}"
    )
    for r in rows:
        o, t = r["ours"], r["comlrl143"] or {}
        print(
            f"{r['batch_size']:>5} {o['prompts_per_s']:>9.3f} {t.get('prompts_per_s', float('nan')):>9.3f} "
            f"{r.get('speedup_prompts_per_s', float('nan')):>6.2f} {o['tokens_per_s']:>10.0f} "
            f"{t.get('tokens_per_s', float('nan')):>11.0f} {r.get('speedup_tokens_per_s', float('nan')):>6.2f}"
        )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
