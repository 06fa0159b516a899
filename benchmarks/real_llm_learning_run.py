"""A real instruct LLM learning a cooperative code task on CPU, with a control that cannot learn.

What it runs, with the ``comlrl`` commands a user would type (each printed before it runs):

1. ``comlrl eval``: the untrained team (two copies of the model) on the first
   ``--eval-limit`` held-out problems (the task's test split, disjoint from its train
   split), sampled at the training temperature, ``--eval-samples`` joint actions per
   problem, fixed seed: the mean joint reward and pass@k *before*;
2. ``comlrl train``: MAGRPO (``estimator=grpo``) for ``--steps`` steps at ``--lr``;
3. ``comlrl eval`` of the trained pair (``final/agent_0``, ``final/agent_1``) with the same
   problems, settings and seed: *after*;
4. the control: the same ``comlrl train`` with ``learning_rate=0`` (every update runs, the
   weights cannot move), then the same ``comlrl eval`` of its ``final/`` pair.

With ``learning_rate=0`` the control's ``final/`` weights equal the initial ones, so its
``after`` must equal ``before`` exactly (a check that the evaluation is paired and
deterministic); its training reward curve is the untrained policy's reward with sampling
noise, the line the learning run must rise above.

Writes ``--out`` (JSON: machine, commands, settings, wall times, the before/after/control
evaluations and both runs' per-step rewards) and ``--plot`` (the two reward curves and the
held-out numbers). Default model: SmolLM2-135M-Instruct's GGUF file in ``../shared/models``;
default task: two-agent MBPP from ``../shared/data/mbpp.jsonl`` (``--data``).

    python benchmarks/real_llm_learning_run.py \\
        --out benchmarks/results/real_llm_learning_run.json \\
        --plot docs/img/real_llm_learning_run.png
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import git_commit, machine_info  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DEFAULT_MODEL = SHARED / "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DATA = SHARED / "data/mbpp.jsonl"


def torch_threads() -> int:
    """The intra-op thread count torch uses in the ``comlrl`` processes (its default)."""
    import torch

    return torch.get_num_threads()


def comlrl_exe() -> str:
    """The ``comlrl`` console script of this Python's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("comlrl")
    return str(beside) if beside.exists() else "comlrl"


def run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` (printed first), its output appended to ``log``; return its wall seconds.

    Raises:
        SystemExit: the command failed (its log's tail is printed).
    """
    print("$ " + shlex.join(cmd), flush=True)
    start = time.perf_counter()
    with open(log, "a") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if code != 0:
        print(log.read_text()[-3000:])
        raise SystemExit(f"command failed with exit code {code}: {shlex.join(cmd)}")
    print(f"  ({wall:.0f} s)", flush=True)
    return wall


def last_eval_row(folder: Path) -> dict[str, Any]:
    """The last row of ``folder/eval.jsonl`` (what ``comlrl eval`` just appended)."""
    lines = (folder / "eval.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def step_rewards(run_dir: Path) -> list[float]:
    """``reward_mean`` of every row of a run's ``metrics.jsonl``, in step order."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [float(r["reward_mean"]) for r in sorted(rows, key=lambda r: r["step"])]


def plot(result: dict[str, Any], path: Path) -> None:
    """Both runs' per-step training reward (and an 8-step moving mean), with the held-out
    before/after numbers in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, color in (("learning", "tab:blue"), ("control", "tab:gray")):
        ys = result["runs"][name]["step_rewards"]
        xs = list(range(1, len(ys) + 1))
        ax.plot(xs, ys, color=color, alpha=0.35, linewidth=1)
        w = min(8, len(ys))
        mean = [
            sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1])
            for i in range(len(ys))
        ]
        lr = result["runs"][name]["learning_rate"]
        ax.plot(xs, mean, color=color, linewidth=2, label=f"{name} (lr={lr:g}), {w}-step mean")
    ev = result["eval"]
    ax.set_title(
        f"held-out reward: before {ev['before']['reward_mean']:.3f}, "
        f"after {ev['after']['reward_mean']:.3f}, control {ev['control']['reward_mean']:.3f}",
        fontsize=10,
    )
    ax.set_xlabel("training step")
    ax.set_ylabel("mean joint reward of the step's rollouts")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="a .gguf file, folder or Hub id")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="MBPP's mbpp.jsonl")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--batch-size", type=int, default=2, help="prompts per step")
    ap.add_argument(
        "--group", type=int, default=4, help="num_generations: joint actions per prompt"
    )
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--eval-limit", type=int, default=16, help="held-out problems")
    ap.add_argument("--eval-samples", type=int, default=2, help="sampled joint actions per problem")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="runs/real-llm-learning", help="the runs' folders")
    ap.add_argument("--skip-control", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/real_llm_learning_run.json")
    ap.add_argument("--plot", default="docs/img/real_llm_learning_run.png")
    args = ap.parse_args()

    work = Path(args.workdir)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log = work / "commands.log"
    exe = comlrl_exe()
    task = [
        "task.name=mbpp",
        f"task.kwargs.path={args.data}",
        f"max_new_tokens={args.max_new_tokens}",
        f"seed={args.seed}",
    ]
    evaluation = [
        f"eval_limit={args.eval_limit}",
        "eval_greedy=false",
        f"eval_num_samples={args.eval_samples}",
    ]
    training = [
        f"num_steps={args.steps}",
        f"batch_size={args.batch_size}",
        f"num_generations={args.group}",
    ]

    def evaluate(models: list[str], out: Path) -> tuple[dict[str, Any], float]:
        cmd = [
            exe,
            "eval",
            *[a for m in models for a in ("--model", m)],
            *task,
            *evaluation,
            "--output-dir",
            str(out),
        ]
        wall = run(cmd, log)
        return last_eval_row(out), wall

    def train(lr: float, out: Path) -> float:
        return run(
            [
                exe,
                "train",
                "--model",
                args.model,
                *task,
                *training,
                f"learning_rate={lr:g}",
                f"output_dir={out}",
            ],
            log,
        )

    result: dict[str, Any] = {
        "what": "MAGRPO on two-agent MBPP with a real instruct LLM on CPU; held-out eval before/after; lr=0 control",
        "machine": machine_info(torch_threads(), load_average_1m_at_start=os.getloadavg()[0]),
        "commit": git_commit(REPO),
        "model": args.model,
        "settings": vars(args),
        "runs": {},
        "eval": {},
        "wall_s": {},
    }
    started = time.perf_counter()
    result["eval"]["before"], result["wall_s"]["eval_before"] = evaluate(
        [args.model, args.model], work / "eval_before"
    )
    for name, lr in (("learning", args.lr), ("control", 0.0)):
        if name == "control" and args.skip_control:
            continue
        run_dir = work / name
        result["wall_s"][f"train_{name}"] = train(lr, run_dir)
        final = [str(run_dir / "final" / f"agent_{i}") for i in range(2)]
        key = "after" if name == "learning" else "control"
        result["eval"][key], result["wall_s"][f"eval_{key}"] = evaluate(
            final, run_dir / "eval_after"
        )
        result["runs"][name] = {"learning_rate": lr, "step_rewards": step_rewards(run_dir)}
    result["wall_s"]["total"] = time.perf_counter() - started
    result["machine"]["load_average_1m_at_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    keys = ("reward_mean", "pass@1", f"pass@{args.eval_samples}")
    for name, row in result["eval"].items():
        print(f"{name:>7}: " + ", ".join(f"{k}={row.get(k, float('nan')):.4f}" for k in keys))
    for name, r in result["runs"].items():
        ys = r["step_rewards"]
        q = max(1, len(ys) // 4)
        print(
            f"{name:>8} training reward: first quarter {sum(ys[:q]) / q:.3f} -> last quarter {sum(ys[-q:]) / q:.3f}"
        )
    print(f"wall: {json.dumps({k: round(v) for k, v in result['wall_s'].items()})}; JSON in {out}")
    if "control" in result["runs"] and args.plot:
        plot(result, Path(args.plot))
        print(f"plot in {args.plot}")


if __name__ == "__main__":
    main()
