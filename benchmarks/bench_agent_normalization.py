"""Per-agent gradient norms under a global baseline against agent-wise normalization.

Two agents (copies of the built-in ``stories260k`` model) write the two halves of a story
opening. Each agent's half earns a score in ``[0, 1]`` (the share of its words of at most
three letters, a property these models vary from sample to sample); the joint reward weighs
the halves unequally, ``w0 * score0 + w1 * score1`` (default ``1`` and ``10``): agent 1's
part decides ten times more of the team's reward, as when one role's outcome is graded on a
larger scale. Joint actions are ``cross`` (every pairing of the agents' ``G`` completions),
so each completion is credited with the mean reward of its own pairings and the two agents'
credited returns vary over ranges ``w0`` and ``w1`` apart.

MAGRPO (``estimator=grpo``) runs once per setting, all from the same seed (the first step's
rollout is the same sample in every run):

- ``advantage_stats=global``: one baseline and std for both agents' returns (GRPO's
  normalization over the multi-agent batch, Dr. MAS eq. 2);
- ``advantage_stats=agent``: each agent's own (Dr. MAS's agent-wise normalization, eq. 5);

each with ``advantage_scale=group`` (GRPO's group std) and ``batch`` (the batch's std).
Every step logs each agent's pre-clip gradient norm and ``grad_norm_ratio`` (the larger
over the smaller, with two agents). Reported per setting: the median, mean and max ratio
over the steps, the first step's ratio (same rollout in every setting), each agent's median
gradient norm, and the mean joint reward of the first and last quarter of the steps.

Usage (about a minute on 2 CPU cores)::

    python benchmarks/bench_agent_normalization.py --out benchmarks/results/agent_normalization.json --plot docs/img/agent_normalization.png
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from _bench_common import git_commit, machine_info
from comlrl.algos import HFAgent, MultiAgentTrainer, TrainConfig, load_model_and_tokenizer
from comlrl.core import Feedback, Prompt, RewardBatch, Task

HERE = Path(__file__).resolve().parent
OPENINGS = (
    "a little dog",
    "a big red ball",
    "the old tree",
    "a tiny bird",
    "the sun",
    "a blue boat",
    "a happy cat",
    "the park",
)


def short_word_share(text: str) -> float:
    """The share of ``text``'s words that have at most three letters (0 without words)."""
    words = [w.strip(".,!?\"'") for w in text.split()]
    words = [w for w in words if w]
    return sum(len(w) <= 3 for w in words) / len(words) if words else 0.0


class WeightedPartsTask(Task):
    """Two agents write the two halves of a story opening; the joint reward weighs the
    halves' scores ``weights[0]`` and ``weights[1]`` (see the module docstring)."""

    name = "weighted_parts"
    num_agents = 2

    def __init__(self, weights: Sequence[float] = (1.0, 10.0)) -> None:
        self.weights = tuple(float(w) for w in weights)

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        return [{"topic": t} for t in OPENINGS]

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        topic = example["topic"]
        return [f"Once upon a time, there was {topic}.", f"One day, {topic} and Lily"]

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        self.check_joint_batch(completions, examples)
        rewards, infos = [], []
        for texts in zip(*completions, strict=True):
            parts = [short_word_share(t) for t in texts]
            rewards.append(sum(w * p for w, p in zip(self.weights, parts, strict=True)))
            infos.append({"agent_rewards": parts})
        return RewardBatch(rewards, infos)


def run(args: argparse.Namespace, stats: str, scale: str, out: Path) -> dict[str, Any]:
    """One MAGRPO run; its per-step gradient norms, ratios and rewards."""
    torch.manual_seed(args.seed)
    agents = [
        HFAgent(*load_model_and_tokenizer("builtin:stories260k"), name=f"agent_{i}")
        for i in range(2)
    ]
    config = TrainConfig(
        num_agents=2,
        num_steps=args.steps,
        batch_size=args.batch_size,
        num_generations=args.group,
        max_new_tokens=args.max_new_tokens,
        joint_mode="cross",
        estimator="grpo",
        advantage_stats=stats,  # type: ignore[arg-type]
        advantage_scale=scale,  # type: ignore[arg-type]
        seed=args.seed,
        output_dir=str(out / f"{stats}_{scale}"),
        progress=False,
        reward_curve=False,
        log_samples=0,
    )
    t0 = time.perf_counter()
    rows = MultiAgentTrainer(agents, config, task=WeightedPartsTask(args.weights)).train()
    seconds = time.perf_counter() - t0
    norms = [[r[f"grad_norm/agent_{a}"] for r in rows] for a in range(2)]
    ratios = [r["grad_norm_ratio"] for r in rows if "grad_norm_ratio" in r]
    rewards = [r["reward_mean"] for r in rows]
    quarter = max(1, len(rewards) // 4)
    return {
        "advantage_stats": stats,
        "advantage_scale": scale,
        "seconds": round(seconds, 2),
        "grad_norm_ratio": ratios,
        "grad_norm": {f"agent_{a}": norms[a] for a in range(2)},
        "ratio_median": statistics.median(ratios),
        "ratio_mean": statistics.fmean(ratios),
        "ratio_max": max(ratios),
        "ratio_first_step": ratios[0],
        "grad_norm_median": {f"agent_{a}": statistics.median(norms[a]) for a in range(2)},
        "reward_first_quarter": statistics.fmean(rewards[:quarter]),
        "reward_last_quarter": statistics.fmean(rewards[-quarter:]),
        "reward_mean": rewards,
    }


def plot(results: list[dict[str, Any]], path: Path, weights: Sequence[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    styles = {"global": "-", "agent": "--"}
    colors = {"group": "tab:red", "batch": "tab:blue"}
    for r in results:
        steps = range(1, len(r["grad_norm_ratio"]) + 1)
        ax.plot(
            steps,
            r["grad_norm_ratio"],
            styles[r["advantage_stats"]],
            color=colors[r["advantage_scale"]],
            label=f"advantage_stats={r['advantage_stats']}, advantage_scale={r['advantage_scale']}",
        )
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("grad_norm_ratio (larger / smaller agent)")
    ax.set_title(f"MAGRPO, joint reward {weights[0]:g} * part 1 + {weights[1]:g} * part 2")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--batch-size", type=int, default=4, help="prompts per step")
    p.add_argument("--group", type=int, default=4, help="G, completions per prompt per agent")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--weights", type=float, nargs=2, default=(1.0, 10.0))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", type=Path, default=None, help="JSON file to write")
    p.add_argument("--plot", type=Path, default=None, help="PNG of the ratio per step")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory() as work:
        for scale in ("group", "batch"):
            for stats in ("global", "agent"):
                results.append(run(args, stats, scale, Path(work)))
    print(f"{'advantage_stats':>15} {'scale':>6} {'ratio median':>12} {'mean':>7} {'max':>7} "
          f"{'step 1':>7} {'|g| agent 0':>11} {'|g| agent 1':>11} {'reward q1->q4':>15}")  # fmt: skip
    for r in results:
        g = r["grad_norm_median"]
        print(
            f"{r['advantage_stats']:>15} {r['advantage_scale']:>6} {r['ratio_median']:>12.2f} "
            f"{r['ratio_mean']:>7.2f} {r['ratio_max']:>7.2f} {r['ratio_first_step']:>7.2f} "
            f"{g['agent_0']:>11.3f} {g['agent_1']:>11.3f} "
            f"{r['reward_first_quarter']:>7.3f}->{r['reward_last_quarter']:.3f}"
        )
    report = {
        "benchmark": "agent_normalization",
        "command": "python "
        + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
        "commit": git_commit(HERE.parent),
        "machine": machine_info(args.threads),
        "settings": {
            "model": "builtin:stories260k",
            "task": "WeightedPartsTask (this script)",
            "weights": list(args.weights),
            "estimator": "grpo",
            "joint_mode": "cross",
            "steps": args.steps,
            "batch_size": args.batch_size,
            "group": args.group,
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
        },
        "results": results,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    if args.plot is not None:
        plot(results, args.plot, args.weights)
    return report


if __name__ == "__main__":
    main()
