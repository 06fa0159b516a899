"""``comlrl plot RUN_DIR``: remake a run's ``reward_curve.png`` from its ``metrics.jsonl``.

For a run made without matplotlib (the run said ``reward_curve.png skipped``), a run still
in progress, or a finished one: the curves are the per-turn mean joint rewards as the
metrics name them (``turn_0/reward_mean``, ...; ``reward/<task>`` for a task mixture),
each with its rolling mean, over integer steps
(:func:`comlrl.algos.training.run.summary.reward_figure`). The title comes from the
run's ``config.yaml`` as training would have written it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_plot_parser", "run_plot", "run_title"]


def add_plot_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``plot`` sub-command to ``comlrl``'s sub-parsers."""
    parser = sub.add_parser(
        "plot",
        help="remake a run's reward_curve.png from its metrics.jsonl",
        description="Remake RUN_DIR/reward_curve.png from RUN_DIR/metrics.jsonl (a run made "
        "without matplotlib, one in progress, or a finished one).",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's output_dir")
    parser.add_argument(
        "--output", "-o", help="the PNG to write (default RUN_DIR/reward_curve.png)"
    )
    parser.add_argument(
        "--window",
        type=int,
        help="rolling-mean window in steps (default: a tenth of the steps, 1 to 25)",
    )
    return parser


def run_title(run_dir: str | Path) -> str | None:
    """``task - models - estimator`` from ``RUN_DIR/config.yaml`` (the parts it has), or
    ``None`` without a readable config."""
    import yaml

    try:
        data = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    task = data.get("task")
    parts = []
    if isinstance(task, dict):
        mixture = task.get("mixture")
        if mixture:
            parts.append(
                " + ".join(
                    str(m.get("label") or m.get("name")) for m in mixture if isinstance(m, dict)
                )
            )
        elif task.get("name"):
            parts.append(str(task["name"]))
    models = data.get("models")
    if isinstance(models, list) and models:
        parts.append(", ".join(map(str, models)))
    for key in ("estimator", "algo"):
        if data.get(key):
            parts.append(str(data[key]))
            break
    return " - ".join(parts) or None


def run_plot(args: argparse.Namespace) -> int:
    """Write the reward curve of ``args.run_dir``. Returns an exit code (2: no metrics,
    no reward in them, or matplotlib missing)."""
    from comlrl.algos.training.run.reporting import missing_extra
    from comlrl.algos.training.run.summary import plot_reward_curve, read_metrics

    run_dir = Path(args.run_dir)
    metrics = run_dir / "metrics.jsonl"
    rows = read_metrics(metrics)
    if not rows:
        print(
            f"comlrl: {metrics} has no metrics rows; is {run_dir} a run's output_dir?",
            file=sys.stderr,
        )
        return 2
    problem = missing_extra("plot")
    if problem is not None:
        print(f"comlrl: {problem}", file=sys.stderr)
        return 2
    if args.window is not None and args.window < 1:
        print(f"comlrl: --window must be >= 1, got {args.window}", file=sys.stderr)
        return 2
    out = Path(args.output) if args.output else run_dir / "reward_curve.png"
    try:
        plot_reward_curve(rows, out, window=args.window, title=run_title(run_dir))
    except ValueError as exc:
        print(f"comlrl: {metrics}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(rows)} step{'' if len(rows) == 1 else 's'})")
    return 0
