"""A run's metrics read back: the reward per turn and step, the reward-curve plot, and the
run's closing summary line.

:func:`read_metrics` reads ``metrics.jsonl`` (a resumed run counted once),
:func:`reward_series` takes each turn's mean joint reward out of the rows,
:func:`plot_reward_curve` draws the curves of :func:`curve_series` (each labelled with its
metric name, integer step ticks) with a rolling mean (extra ``comlrl-algos[plot]``),
and :func:`summary_line` is the closing line (first- and last-quarter mean reward). The
reporter that writes ``reward_curve.png``: :mod:`comlrl.algos.training.run.reporting`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "curve_series",
    "plot_reward_curve",
    "reward_figure",
    "quarter_means",
    "read_metrics",
    "reward_series",
    "rolling_mean",
    "summary_line",
    "loss_summary",
]


def reward_series(rows: Iterable[Mapping[str, Any]]) -> dict[int, tuple[list[int], list[float]]]:
    """Per turn ``t``: the steps and values of ``turn_<t>/reward_mean`` (steps that reached
    turn ``t``; rows without per-turn keys fall back to ``reward_mean`` as turn 0)."""
    out: dict[int, tuple[list[int], list[float]]] = {}
    for row in rows:
        step = int(row["step"])
        turns = {
            int(k[len("turn_") : -len("/reward_mean")]): v
            for k, v in row.items()
            if k.startswith("turn_") and k.endswith("/reward_mean")
        }
        if not turns and "reward_mean" in row:
            turns = {0: row["reward_mean"]}
        for t, value in turns.items():
            if value is not None and math.isfinite(float(value)):
                steps, values = out.setdefault(t, ([], []))
                steps.append(step)
                values.append(float(value))
    return dict(sorted(out.items()))


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start).

    Raises:
        ValueError: ``window < 1``.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _default_window(n: int) -> int:
    return max(1, min(25, round(n / 10)))


def curve_series(rows: Iterable[Mapping[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """The curves of a reward plot, keyed by their metric name: every ``turn_<t>/reward_mean``
    (in turn order; ``reward_mean`` when no row has per-turn keys), then every
    ``reward/<task>`` of a task mixture (in name order). Non-finite values are left out."""
    rows = list(rows)
    names: set[str] = set()
    for row in rows:
        names.update(k for k in row if k.startswith("turn_") and k.endswith("/reward_mean"))
    turns = sorted(names, key=lambda k: int(k[len("turn_") : -len("/reward_mean")]))
    if not turns and any("reward_mean" in row for row in rows):
        turns = ["reward_mean"]
    tasks = sorted({k for row in rows for k in row if k.startswith("reward/")})
    out: dict[str, tuple[list[int], list[float]]] = {}
    for name in [*turns, *tasks]:
        steps, values = out.setdefault(name, ([], []))
        for row in rows:
            value = row.get(name)
            if isinstance(value, (int, float)) and math.isfinite(float(value)):
                steps.append(int(row["step"]))
                values.append(float(value))
    return {k: v for k, v in out.items() if v[0]}


def reward_figure(
    rows: Sequence[Mapping[str, Any]],
    *,
    window: int | None = None,
    title: str | None = None,
) -> Any:
    """A matplotlib ``Figure`` of the per-step mean joint reward and its rolling mean, one
    colour per curve of :func:`curve_series`, each labelled with its metric name
    (``turn_0/reward_mean``, ``reward/mbpp``); the step axis has integer ticks only.

    Args:
        rows: metrics rows (``step``, ``turn_<t>/reward_mean``), e.g. ``metrics.jsonl``.
        window: rolling-mean window in steps (default: a tenth of the steps, 1 to 25).
        title: figure title.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'comlrl-algos[plot]'``).
        ValueError: no row has a reward.
    """
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed
    from matplotlib.ticker import MaxNLocator

    series = curve_series(rows)
    if not series:
        raise ValueError("no metrics row has a reward (turn_<t>/reward_mean); nothing to plot")
    n = max(len(steps) for steps, _ in series.values())
    window = window or _default_window(n)
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.add_subplot()
    for i, (name, (steps, values)) in enumerate(series.items()):
        color = f"C{i % 10}"
        ax.plot(steps, values, color=color, alpha=0.3, linewidth=1, marker=".", label=name)
        ax.plot(
            steps,
            rolling_mean(values, window),
            color=color,
            linewidth=2.2,
            label=f"{name}, rolling mean ({window} steps)",
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("mean joint reward")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_reward_curve(
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    window: int | None = None,
    title: str | None = None,
) -> Path:
    """Write :func:`reward_figure` of ``rows`` to the PNG ``path``; returns ``path``.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'comlrl-algos[plot]'``).
        ValueError: no row has a reward.
    """
    fig = reward_figure(rows, window=window, title=title)
    path = Path(path)
    fig.savefig(path)
    return path


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``, one per step (the last row of a step wins, so a
    resumed run that redid steps counts them once), in step order; ``[]`` when the file is
    missing. Lines that are not JSON objects with a ``step`` are skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
            by_step[int(row["step"])] = row
    return [by_step[k] for k in sorted(by_step)]


def quarter_means(values: Sequence[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter of ``values`` (at least one value each).

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("no values")
    q = max(1, len(values) // 4)
    return sum(values[:q]) / q, sum(values[-q:]) / q


def summary_line(history: Sequence[Mapping[str, Any]], output_dir: str | Path) -> str:
    """The closing line of a run, e.g. ``done: 160 steps, reward first quarter 0.51 -> last
    quarter 0.71 (+0.20), ...; outputs in runs/default/ (...)``.

    Turns are counted from 0, as the metric keys count them (``turn_0`` is the first
    turn). A multi-turn run names each turn: ``turn_0`` is ``reward_mean`` (the first
    turn's joint actions), and each later turn's quarters are over the steps that reached
    it (``turn_<t>/reward_mean``).

    The quarters are over the whole run as ``output_dir/metrics.jsonl`` records it (a
    resumed run included), or over ``history`` when that file has no rows.
    """
    out = Path(output_dir)
    rows: Sequence[Mapping[str, Any]] = read_metrics(out / "metrics.jsonl") or history
    files = ["metrics.jsonl", "samples.jsonl"]
    if (out / "reward_curve.png").is_file():
        files.append("reward_curve.png")
    files.append("final/agent_*")
    where = f"outputs in {out}/ ({', '.join(files)})"
    if not rows:
        return f"done: 0 steps; {where}"
    first, last = quarter_means([float(r["reward_mean"]) for r in rows])
    speed = float(rows[-1].get("prompts_per_s", float("nan")))
    steps = f"{len(rows)} step{'s' if len(rows) != 1 else ''}"
    series = reward_series(r for r in rows if "step" in r)
    if len(series) < 2:
        return (
            f"done: {steps}, reward first quarter {first:.2f} -> last quarter {last:.2f} "
            f"({last - first:+.2f}), {speed:.2f} prompts/s; {where}"
        )
    # multi-turn: reward_mean is turn_0's; every later turn over the steps that reached it
    later = []
    for t, (_, values) in series.items():
        if t == 0:
            continue
        a, b = quarter_means(values)
        later.append(f"turn_{t} {a:.2f} -> {b:.2f} ({b - a:+.2f})")
    return (
        f"done: {steps}, reward first quarter -> last quarter: turn_0 {first:.2f} -> "
        f"{last:.2f} ({last - first:+.2f}), {', '.join(later)}, {speed:.2f} prompts/s; {where}"
    )


def loss_summary(history: Sequence[Mapping[str, Any]], out: Path, key: str = "loss") -> str:
    """``done: N steps, <key> first quarter a -> last quarter b (+d); outputs in ...``."""
    where = f"outputs in {out}/ (metrics.jsonl, final/agent_*)"
    if not history:
        return f"done: 0 steps; {where}"
    first, last = quarter_means([float(r[key]) for r in history])
    n = len(history)
    return (
        f"done: {n} step{'s' if n != 1 else ''}, {key} first quarter {first:.3f} -> last "
        f"quarter {last:.3f} ({last - first:+.3f}); {where}"
    )
