"""A real instruct LLM learning a cooperative task on CPU, beside a control that cannot learn.

What it runs, as the ``comlrl`` commands a user would type (each printed before it runs):

1. ``comlrl eval``: the untrained team (two copies of the model) on the task's held-out test
   split (``coop_story``: 40 seeds disjoint from the 280 training seeds), sampled at the
   training temperature, ``--eval-samples`` joint actions per problem, fixed seed: the mean
   joint reward *before*;
2. at the same time, two ``comlrl train`` runs (MAGRPO, ``estimator=grpo``), one torch thread
   each: the learning run at ``--lr`` and the control at ``learning_rate=0`` (every update
   runs; the weights cannot move);
3. ``comlrl eval`` of each run's ``final/`` pair with the same problems, settings and seed
   (again side by side): *after* and *control*.

The control's ``final/`` weights equal the initial ones, so its evaluation must equal *before*
exactly (this checks that the evaluation is paired and deterministic), and its training curve
is the untrained policy's reward with sampling noise: the line the learning run must rise
above. One torch thread per process makes each run's numbers independent of what runs beside
it.

Writes ``--out`` (JSON: machine, commands, settings, wall times, the three evaluations and both
runs' per-step rewards) and ``--plot`` (both reward curves, the held-out numbers in the title).
Default model: SmolLM2-135M-Instruct's GGUF file in ``../shared/models``; default task: the
built-in ``coop_story`` (no data file). ``--task mbpp --task-path ../shared/data/mbpp.jsonl
--max-new-tokens 160`` runs the code task instead.

    python benchmarks/real_llm_learning_run.py            # into runs/real-llm-learning/

Refreshing the committed files: add ``--out benchmarks/results/real_llm_learning_run.json
--plot docs/img/real_llm_learning_run.png``. The numbers are exact on one machine but move
by about 0.01 on another CPU (docs/real-models.md says which claims to check).
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


def comlrl_exe() -> str:
    """The ``comlrl`` console script of this Python's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("comlrl")
    return str(beside) if beside.exists() else "comlrl"


def run(cmds: list[list[str]], logs: list[Path]) -> float:
    """Run ``cmds`` side by side (each printed first, one torch thread each, output into its
    log); return the wall seconds until the last one ends.

    Raises:
        SystemExit: a command failed (its log's tail is printed).
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    procs = []
    for cmd, log in zip(cmds, logs, strict=True):
        print("$ OMP_NUM_THREADS=1 " + shlex.join(cmd), flush=True)
        with open(log, "a") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env))
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - start
    for code, cmd, log in zip(codes, cmds, logs, strict=True):
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


def build_parser() -> argparse.ArgumentParser:
    """The script's options. By default everything goes into ``--workdir`` (a fresh folder:
    it is emptied first), never over the committed JSON and plot; pass ``--out`` and
    ``--plot`` to refresh those."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="a .gguf file, folder or Hub id")
    ap.add_argument("--task", default="coop_story", help="a task suite (comlrl tasks)")
    ap.add_argument("--task-path", default=None, help="task.kwargs.path (e.g. mbpp.jsonl)")
    ap.add_argument(
        "--task-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another task.kwargs.KEY=VALUE (repeatable), e.g. level=mul for tool_math",
    )
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument(
        "--optimizer",
        default="adamw",
        help="adamw: full-size Adam steps from step 1 (radam, the built-in default, "
        "rectifies its first steps down to about 5-8%% of the learning rate for ~20 steps)",
    )
    ap.add_argument("--batch-size", type=int, default=4, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="num_generations per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out problems (all)")
    ap.add_argument("--eval-samples", type=int, default=2, help="joint actions per problem")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--loss-reduction",
        default="seq_mean_token_mean",
        help="loss_reduction of both runs (the committed run's; a pretrained model's default "
        "is token_mean since the defaults by model)",
    )
    ap.add_argument("--workdir", default="runs/real-llm-learning", help="the runs' folders")
    ap.add_argument(
        "--out", default=None, help="the JSON (default: WORKDIR/real_llm_learning_run.json)"
    )
    ap.add_argument(
        "--plot", default=None, help="the plot (default: WORKDIR/real_llm_learning_run.png)"
    )
    return ap


def main() -> None:
    args = build_parser().parse_args()
    args.out = args.out or str(Path(args.workdir) / "real_llm_learning_run.json")
    args.plot = args.plot or str(Path(args.workdir) / "real_llm_learning_run.png")

    work = Path(args.workdir)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    exe = comlrl_exe()
    task = [f"task.name={args.task}", f"max_new_tokens={args.max_new_tokens}", f"seed={args.seed}"]
    if args.task_path:
        task.append(f"task.kwargs.path={args.task_path}")
    task += [f"task.kwargs.{kv}" for kv in args.task_kwarg]
    task.append(f"temperature={args.temperature:g}")
    # batch_size too: without prompt-keyed streams an evaluation's samples depend on which
    # problems share a rollout call, and the runs' own config.yaml (read when a run's
    # final/ is evaluated) holds --batch-size, so every evaluation gets the same batches
    evaluation = [
        "eval_greedy=false",
        f"eval_num_samples={args.eval_samples}",
        f"batch_size={args.batch_size}",
    ]
    if args.eval_limit:
        evaluation.append(f"eval_limit={args.eval_limit}")
    training = [f"num_steps={args.steps}", f"batch_size={args.batch_size}"]
    training += [f"num_generations={args.group}", f"optimizer={args.optimizer}"]
    training += [f"loss_reduction={args.loss_reduction}"]
    runs = {"learning": args.lr, "control": 0.0}

    def eval_cmd(models: list[str], out: Path) -> list[str]:
        flags = [a for m in models for a in ("--model", m)]
        return [exe, "eval", *flags, *task, *evaluation, "--output-dir", str(out)]

    def train_cmd(lr: float, out: Path) -> list[str]:
        lr_key = f"learning_rate={lr:g}"
        return [exe, "train", "--model", args.model, *task, *training, lr_key, f"output_dir={out}"]

    result: dict[str, Any] = {
        "what": f"MAGRPO on two-agent {args.task} with a real instruct LLM on CPU: held-out "
        "evaluation before and after, and a learning_rate=0 control",
        "machine": machine_info(1, load_average_1m_at_start=os.getloadavg()[0]),
        "commit": git_commit(REPO),
        "model": args.model,
        "settings": vars(args),
        "commands": {},
        "runs": {},
        "eval": {},
        "wall_s": {},
    }
    started = time.perf_counter()
    before = eval_cmd([args.model, args.model], work / "eval_before")
    result["commands"]["eval_before"] = shlex.join(before)
    result["wall_s"]["eval_before"] = run([before], [work / "eval_before.log"])
    result["eval"]["before"] = last_eval_row(work / "eval_before")

    trains = {name: train_cmd(lr, work / name) for name, lr in runs.items()}
    result["commands"].update({f"train_{n}": shlex.join(c) for n, c in trains.items()})
    logs = [work / f"train_{n}.log" for n in runs]
    result["wall_s"]["train_side_by_side"] = run(list(trains.values()), logs)

    finals = {n: [str(work / n / "final" / f"agent_{i}") for i in range(2)] for n in runs}
    evals = {n: eval_cmd(finals[n], work / n / "eval_after") for n in runs}
    result["commands"].update({f"eval_{n}": shlex.join(c) for n, c in evals.items()})
    logs = [work / f"eval_{n}.log" for n in runs]
    result["wall_s"]["eval_after_side_by_side"] = run(list(evals.values()), logs)
    for name, lr in runs.items():
        key = "after" if name == "learning" else "control"
        result["eval"][key] = last_eval_row(work / name / "eval_after")
        result["runs"][name] = {"learning_rate": lr, "step_rewards": step_rewards(work / name)}
    result["wall_s"]["total"] = time.perf_counter() - started
    result["machine"]["load_average_1m_at_end"] = os.getloadavg()[0]

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in result["eval"].items():
        print(f"held-out {name:>7}: reward_mean={row['reward_mean']:.4f}")
    for name, r in result["runs"].items():
        ys = r["step_rewards"]
        q = max(1, len(ys) // 4)
        first, last = sum(ys[:q]) / q, sum(ys[-q:]) / q
        print(f"{name:>8} training reward: first quarter {first:.3f} -> last quarter {last:.3f}")
    walls = {k: round(v) for k, v in result["wall_s"].items()}
    print(f"wall seconds: {json.dumps(walls)}; JSON in {out}")
    if args.plot:
        plot(result, Path(args.plot))
        print(f"plot in {args.plot}")


if __name__ == "__main__":
    main()
