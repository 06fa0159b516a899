"""A real instruct LLM learns a tool-use skill it lacked, on CPU, beside a control that cannot.

The task is ``tool_math`` at a level where the untrained team is mostly wrong even greedily
(default ``level=expr``: each of two agents computes one parenthesised expression such as
``(22 - 34 + 25) * 4`` with the sandboxed Python tool; the team is right when both parts
are; ``partial_credit=0.5`` pays half for one part right).
What it runs, as the ``comlrl`` commands a user would type (each printed before it runs):

1. ``comlrl eval`` of the untrained team (two copies of ``--model``) on the first
   ``--eval-limit`` held-out test problems, twice side by side: greedy, and sampled at the
   training temperature (``--eval-samples`` joint actions per problem, seeded streams);
   ``--skip-before`` leaves them out (the control's evaluations stand for them);
2. side by side, one torch thread each, two ``comlrl train`` runs (MAGRPO): the learning run
   at ``--lr`` and the control at ``learning_rate=0`` (every rollout and update runs; the
   weights stay as loaded), each logging every joint action of every step
   (``log_samples``), so the team's accuracy per step is known;
3. the same two evaluations of each run's ``final/`` pair (two at a time; a run stopped
   with Ctrl-C: its latest checkpoint; ``--evaluate-only`` runs this step alone on the runs
   already in ``--workdir``).

The control's evaluations must equal the untrained ones exactly (same weights, seeded and
paired evaluation: the script checks it), and its training curve is the untrained policy's
accuracy with sampling noise: the line the learning run must rise above.

Writes ``--out`` (JSON: machine, commit, commands, settings, wall and CPU seconds of each
phase, the six evaluation rows with the team's and each agent's accuracy, both runs' per-step
reward and team accuracy, and held-out problems the training turned from wrong to right with
the completions before and after) and ``--plot`` (both runs' training accuracy, and the
held-out numbers).

    python benchmarks/tool_math_headroom_run.py --skip-before --steps 32

Refreshing the committed files: add ``--out benchmarks/results/tool_math_headroom_run.json
--plot docs/img/tool_math_headroom_run.png``. The committed run stopped its control with
Ctrl-C after 6 steps (to give the learning run the shared CPU), then ran again with
``--evaluate-only``; the JSON says at which step each run was evaluated.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import git_commit, machine_info  # noqa: E402
from real_llm_learning_run import comlrl_exe, last_eval_row, run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO.parent / "shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


def children_cpu_s() -> float:
    """User + system CPU seconds of every child process waited for so far (tool sandboxes
    included: each process's waited-for children count into its own)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(cmds: list[list[str]], logs: list[Path]) -> dict[str, float]:
    """:func:`run` the commands side by side; their wall and CPU seconds."""
    cpu0 = children_cpu_s()
    wall = run(cmds, logs)
    return {"wall_s": round(wall, 1), "cpu_s": round(children_cpu_s() - cpu0, 1)}


def sample_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``samples.jsonl`` / ``eval_samples.jsonl`` file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def accuracy(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Team accuracy (``info.team_correct``), each agent's (``info.correct``) and the
    fraction of completions with an ``Answer:`` value, over joint actions ``rows``."""
    n = len(rows)
    if n == 0:
        return {"joint_actions": 0}
    agents = len(rows[0]["info"]["correct"])
    return {
        "joint_actions": n,
        "team": sum(bool(r["info"]["team_correct"]) for r in rows) / n,
        "parts": part_outcomes(rows),
        "agents": [sum(bool(r["info"]["correct"][a]) for r in rows) / n for a in range(agents)],
        "answered": [
            sum(r["info"]["values"][a] is not None for r in rows) / n for a in range(agents)
        ],
    }


def paren_lost(prompt: str, calls: list[dict[str, Any]]) -> bool:
    """Whether the part the prompt asks for (its last ``Compute <expression>.`` line) opens
    with ``(`` and the first call prints something that does not."""
    asked = re.findall(r"Compute (.+?)\.\n", prompt)
    if not asked or not asked[-1].startswith("(") or not calls:
        return False
    code = str(calls[0].get("arguments", {}).get("code", "")).strip()
    return code.startswith("print(") and not code.startswith("print((")


def part_outcomes(rows: list[dict[str, Any]]) -> dict[str, float]:
    """How each agent's part of the joint actions ``rows`` ended, as fractions of all parts:
    ``right``; ``no_answer`` (no ``Answer:`` value); ``sign_dropped`` (the answer is the
    target with the opposite sign); ``answer_differs_from_output`` (the last tool output was
    the target, the answer line something else); ``parenthesis_lost`` (the part, as the
    agent's prompt asks ``Compute (...) ...``, opens with a parenthesis that the first call
    ``print(...`` does not: ``print(22 - 40) * 8`` prints ``-18`` and fails); and
    ``wrong_program`` (the rest: another value computed, a failed program, no call)."""
    counts = dict.fromkeys(
        (
            "right",
            "no_answer",
            "sign_dropped",
            "answer_differs_from_output",
            "parenthesis_lost",
            "wrong_program",
        ),
        0,
    )
    total = 0
    for row in rows:
        info = row["info"]
        for a, target in enumerate(info["targets"]):
            total += 1
            value = info["values"][a]
            calls = (row.get("tool_calls") or [[]] * len(info["targets"]))[a]
            last_output = str(calls[-1].get("result", "")).strip() if calls else None
            if info["correct"][a]:
                counts["right"] += 1
            elif value is None:
                counts["no_answer"] += 1
            elif str(value) == str(-int(target)):
                counts["sign_dropped"] += 1
            elif last_output == target:
                counts["answer_differs_from_output"] += 1
            elif paren_lost(row["prompts"][a], calls):
                counts["parenthesis_lost"] += 1
            else:
                counts["wrong_program"] += 1
    return {k: v / max(1, total) for k, v in counts.items()}


def trained_agents(run_dir: Path) -> tuple[Path, int]:
    """The folder holding a run's trained ``agent_<i>`` models and its step: ``final/``
    when the run finished, else its latest checkpoint (a run stopped with Ctrl-C writes one:
    ``checkpoints/step-<N>/``)."""
    steps = len(sample_rows(run_dir / "metrics.jsonl"))
    if (run_dir / "final").is_dir():
        return run_dir / "final", steps
    ckpts = sorted((run_dir / "checkpoints").glob("step-*"))
    if not ckpts:
        raise SystemExit(f"{run_dir} has neither final/ nor a checkpoint to evaluate")
    return ckpts[-1], int(ckpts[-1].name.split("-")[-1])


def step_curve(run_dir: Path) -> dict[str, Any]:
    """Per training step: ``reward_mean`` (``metrics.jsonl``) and the team accuracy of the
    step's logged joint actions (``samples.jsonl``)."""
    metrics = sample_rows(run_dir / "metrics.jsonl")
    metrics = sorted(metrics, key=lambda r: r["step"])
    rewards = [float(r["reward_mean"]) for r in metrics]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in sample_rows(run_dir / "samples.jsonl"):
        by_step.setdefault(int(row["step"]), []).append(row)
    team = [accuracy(by_step[s])["team"] for s in sorted(by_step)]
    return {
        "steps": len(metrics),
        "step_wall_s_sum": round(sum(float(r["time/step_s"]) for r in metrics), 1),
        "reward_mean": rewards,
        "team_accuracy": team,
    }


def turned_right(before: Path, after: Path, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` problems whose greedy joint action was wrong before and right after,
    with both completions of each agent (``eval_samples.jsonl`` of both evaluations)."""
    old = {r["example_id"]: r for r in sample_rows(before / "eval_samples.jsonl")}
    out = []
    for row in sample_rows(after / "eval_samples.jsonl"):
        prev = old.get(row["example_id"])
        if prev is None or prev["info"]["team_correct"] or not row["info"]["team_correct"]:
            continue
        out.append(
            {
                "example_id": row["example_id"],
                "targets": row["info"]["targets"],
                "before": {"completions": prev["completions"], "values": prev["info"]["values"]},
                "after": {"completions": row["completions"], "values": row["info"]["values"]},
            }
        )
        if len(out) >= limit:
            break
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """Left: both runs' team accuracy per training step (and an 8-step moving mean).
    Right: held-out team accuracy, greedy and sampled, before / after / control."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from comlrl.algos.training.run.summary import rolling_mean

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    for name, color in (("learning", "tab:blue"), ("control", "tab:gray")):
        ys = result["runs"][name]["team_accuracy"]
        xs = list(range(1, len(ys) + 1))
        ax.plot(xs, ys, color=color, alpha=0.3, linewidth=1)
        lr = result["runs"][name]["learning_rate"]
        w = min(8, len(ys))
        ax.plot(
            xs,
            rolling_mean(ys, w),
            color=color,
            linewidth=2,
            label=f"{name} (lr={lr:g}), {w}-step mean",
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("team accuracy of the step's joint actions")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title("training (sampled, training problems)", fontsize=10)
    ev = result["accuracy"]
    labels = ["before", "after", "control"]
    for k, (mode, hatch) in enumerate((("greedy", ""), ("sampled", "//"))):
        vals = [ev[f"{who}_{mode}"]["team"] for who in labels]
        xs = [i + (k - 0.5) * 0.38 for i in range(3)]
        bars = bx.bar(
            xs,
            vals,
            width=0.36,
            hatch=hatch,
            color=["tab:gray", "tab:blue", "silver"],
            edgecolor="black",
            label=mode,
        )
        for b, v in zip(bars, vals, strict=True):
            bx.text(b.get_x() + b.get_width() / 2, v + 0.02, f"{v:.2f}", ha="center", fontsize=8)
    bx.set_xticks(range(3), labels)
    bx.set_ylim(0, 1.05)
    bx.set_ylabel("held-out team accuracy")
    bx.set_title("held-out test problems: greedy | sampled (hatched)", fontsize=10)
    fig.suptitle(result["title"], fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """The script's options; the defaults are the committed run's."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="a .gguf file, folder or Hub id")
    ap.add_argument("--level", default="expr", help="task.kwargs.level of tool_math")
    ap.add_argument(
        "--task-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another task.kwargs.KEY=VALUE (repeatable; default: partial_credit=0.5)",
    )
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--batch-size", type=int, default=2, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="num_generations per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--train-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another override of both training runs (repeatable; default: optimizer=adamw "
        "joint_mode=cross)",
    )
    ap.add_argument("--eval-limit", type=int, default=32, help="held-out problems")
    ap.add_argument("--eval-samples", type=int, default=2, help="sampled joint actions per problem")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--evaluate-only",
        action="store_true",
        help="keep WORKDIR and its two runs (no training): evaluate each run's final/ or, for a "
        "run stopped with Ctrl-C, its latest checkpoint; evaluations already in WORKDIR are kept",
    )
    ap.add_argument(
        "--skip-before",
        action="store_true",
        help="skip the untrained evaluations (step 1): the control's stand for them (its "
        "weights are the loaded ones), and the check that they are equal is not made",
    )
    ap.add_argument(
        "--examples", type=int, default=6, help="wrong-to-right problems kept in the JSON"
    )
    ap.add_argument(
        "--workdir", default="runs/tool-math-headroom", help="the runs' folders (emptied first)"
    )
    ap.add_argument(
        "--out", default=None, help="the JSON (default: WORKDIR/tool_math_headroom_run.json)"
    )
    ap.add_argument(
        "--plot", default=None, help="the plot (default: WORKDIR/tool_math_headroom_run.png)"
    )
    return ap


def main() -> None:
    args = build_parser().parse_args()
    if not args.task_kwarg:
        args.task_kwarg = ["partial_credit=0.5"]
    if not args.train_option:
        args.train_option = ["optimizer=adamw", "joint_mode=cross"]
    work = Path(args.workdir)
    args.out = args.out or str(work / "tool_math_headroom_run.json")
    args.plot = args.plot or str(work / "tool_math_headroom_run.png")
    if args.evaluate_only:
        args.skip_before = True
    elif work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    exe = comlrl_exe()

    task = ["task.name=tool_math", f"task.kwargs.level={args.level}"]
    task += [f"task.kwargs.{kv}" for kv in args.task_kwarg]
    task += [
        f"max_new_tokens={args.max_new_tokens}",
        f"seed={args.seed}",
        f"temperature={args.temperature:g}",
    ]
    # batch_size in every evaluation too: a run's final/ is evaluated with its config.yaml,
    # which holds the training batch size, and sampled streams follow the batches
    common_eval = [f"eval_limit={args.eval_limit}", f"batch_size={args.batch_size}"]
    modes = {
        "greedy": ["eval_greedy=true"],
        "sampled": ["eval_greedy=false", f"eval_num_samples={args.eval_samples}"],
    }
    # every joint action of a step: G per prompt, G x G under joint_mode=cross
    cross = "joint_mode=cross" in args.train_option
    log_all = args.batch_size * args.group * (args.group if cross else 1)
    training = [
        f"num_steps={args.steps}",
        f"batch_size={args.batch_size}",
        f"num_generations={args.group}",
        f"log_samples={log_all}",
        "save_every=0",
        *args.train_option,
    ]
    runs = {"learning": args.lr, "control": 0.0}

    def eval_cmd(models: list[str], mode: str, out: Path) -> list[str]:
        flags = [a for m in models for a in ("--model", m)]
        return [exe, "eval", *flags, *task, *common_eval, *modes[mode], "--output-dir", str(out)]

    def train_cmd(lr: float, out: Path) -> list[str]:
        return [
            exe,
            "train",
            "--model",
            args.model,
            *task,
            *training,
            f"learning_rate={lr:g}",
            f"output_dir={out}",
        ]

    result: dict[str, Any] = {
        "what": f"MAGRPO on two-agent tool_math level={args.level} with a real instruct LLM on "
        "CPU: held-out greedy and sampled team accuracy before and after, and a learning_rate=0 control",
        "machine": machine_info(1, load_average_1m_at_start=os.getloadavg()[0]),
        "commit": git_commit(REPO),
        "model": args.model,
        "settings": vars(args),
        "commands": {},
        "time": {},
        "eval": {},
        "accuracy": {},
        "runs": {},
    }
    started = time.perf_counter()
    cpu_started = children_cpu_s()
    base = [args.model, args.model]
    if not args.skip_before:
        before = {m: eval_cmd(base, m, work / f"before_{m}") for m in modes}
        result["commands"].update({f"eval_before_{m}": shlex.join(c) for m, c in before.items()})
        result["time"]["eval_before"] = timed(
            list(before.values()), [work / f"before_{m}.log" for m in modes]
        )

    trains = {name: train_cmd(lr, work / name) for name, lr in runs.items()}
    result["commands"].update({f"train_{n}": shlex.join(c) for n, c in trains.items()})
    if not args.evaluate_only:
        result["time"]["train_side_by_side"] = timed(
            list(trains.values()), [work / f"train_{n}.log" for n in runs]
        )

    agents = {n: trained_agents(work / n) for n in runs}
    for mode in modes:
        evals = {
            n: eval_cmd(
                [str(agents[n][0] / f"agent_{i}") for i in range(2)], mode, work / f"{n}_{mode}"
            )
            for n in runs
        }
        result["commands"].update({f"eval_{n}_{mode}": shlex.join(c) for n, c in evals.items()})
        todo = [n for n in runs if not (work / f"{n}_{mode}" / "eval.jsonl").exists()]
        if todo:
            result["time"][f"eval_after_{mode}"] = timed(
                [evals[n] for n in todo], [work / f"eval_{n}_{mode}.log" for n in todo]
            )

    for mode in modes:
        before_folder = "control" if args.skip_before else "before"
        for who, folder in (
            ("before", before_folder),
            ("after", "learning"),
            ("control", "control"),
        ):
            key = f"{who}_{mode}"
            result["eval"][key] = last_eval_row(work / f"{folder}_{mode}")
            result["accuracy"][key] = accuracy(
                sample_rows(work / f"{folder}_{mode}" / "eval_samples.jsonl")
            )
    for name, lr in runs.items():
        result["runs"][name] = {
            "learning_rate": lr,
            "evaluated": str(agents[name][0]),
            "evaluated_step": agents[name][1],
            **step_curve(work / name),
        }
    result["control_equals_before"] = (
        None
        if args.skip_before
        else all(
            result["accuracy"][f"control_{m}"] == result["accuracy"][f"before_{m}"] for m in modes
        )
    )
    result["turned_right_greedy"] = turned_right(
        work / ("control_greedy" if args.skip_before else "before_greedy"),
        work / "learning_greedy",
        args.examples,
    )
    result["time"]["total"] = {
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_s": round(children_cpu_s() - cpu_started, 1),
    }
    result["machine"]["load_average_1m_at_end"] = os.getloadavg()[0]
    acc = result["accuracy"]
    result["title"] = (
        f"tool_math {args.level}, held-out team accuracy greedy / sampled: before "
        f"{acc['before_greedy']['team']:.2f} / {acc['before_sampled']['team']:.2f}, after "
        f"{acc['after_greedy']['team']:.2f} / {acc['after_sampled']['team']:.2f}, control "
        f"{acc['control_greedy']['team']:.2f} / {acc['control_sampled']['team']:.2f}"
    )

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for key, a in acc.items():
        agents = ", ".join(f"{v:.3f}" for v in a["agents"])
        print(
            f"held-out {key:>16}: team {a['team']:.4f} (agents {agents}; {a['joint_actions']} joint actions)"
        )
    print(f"control equals before: {result['control_equals_before']}")
    for name, r in result["runs"].items():
        ys = r["team_accuracy"]
        q = max(1, len(ys) // 4)
        print(
            f"{name:>8} training team accuracy: first quarter {sum(ys[:q]) / q:.3f} -> last quarter {sum(ys[-q:]) / q:.3f}"
        )
    print(f"time: {json.dumps(result['time'])}; JSON in {out}")
    plot(result, Path(args.plot))
    print(f"plot in {args.plot}")


if __name__ == "__main__":
    main()
