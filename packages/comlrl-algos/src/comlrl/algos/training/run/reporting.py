"""Where a run's numbers go besides ``metrics.jsonl``: TensorBoard, W&B, the reward curve.

A recipe's loop talks to a list of *reporters*, each with ``log(row)`` (one metrics row per
step, the same dict that goes to ``metrics.jsonl``) and ``close()`` (end of the run, also
after an error or Ctrl-C). :func:`build_reporters` makes the list from the config:

- ``report_to: [tensorboard]``: :class:`TensorBoardReporter`, event files under
  ``output_dir/tensorboard`` (extra ``comlrl-algos[tensorboard]``);
- ``report_to: [wandb]``: :class:`WandbReporter`, one W&B run in project
  ``wandb_project`` with the config attached (extra ``comlrl-algos[wandb]``);
  ``WANDB_MODE=offline`` writes the run under ``output_dir/wandb`` without network
  (``wandb sync`` uploads it later);
- ``reward_curve: true`` (default): :class:`RewardCurveReporter`, ``reward_curve.png`` at
  the end: per step, the mean joint reward of every turn and its rolling mean (extra
  ``comlrl-algos[plot]``; without matplotlib, a one-line notice and no file);
- always: :class:`~comlrl.algos.training.run.diagnostics.LearningSignalWatch`, which warns once when
  every joint action has earned the same reward for many steps in a row, and
  :class:`~comlrl.algos.training.run.diagnostics.EarlyEndWatch`, which warns once when
  ``early_termination_threshold`` ends every episode after its first turn.

A missing extra is found by :func:`check_report_to` before any model is loaded.
:func:`summary_line` is the run's closing line (first- and last-quarter mean reward).
Reading the metrics back, the plot and the summary line live in
:mod:`comlrl.algos.training.run.summary` (re-exported here).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from comlrl.algos.training.config.rl import ConfigError, RLConfig
from comlrl.algos.training.run.summary import (
    plot_reward_curve,
    read_metrics,
)

__all__ = [
    "EXTRAS",
    "Reporter",
    "TensorBoardReporter",
    "WandbReporter",
    "RewardCurveReporter",
    "build_reporters",
    "reporters_for",
    "check_report_to",
    "close_reporters",
    "missing_extra",
]

#: extra name -> (module it provides, what needs it).
EXTRAS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "report_to: tensorboard"),
    "wandb": ("wandb", "report_to: wandb"),
    "plot": ("matplotlib", "reward_curve.png"),
}


class Reporter(Protocol):
    """Receives every step's metrics row; closed once at the end of the run."""

    def log(self, row: Mapping[str, Any]) -> None:
        """Record one step's metrics (``row["step"]`` is the 1-based step)."""
        ...

    def close(self) -> None:
        """Flush and release; called once, also when training stopped early."""
        ...


def missing_extra(extra: str) -> str | None:
    """``None`` when the extra's package is importable, else the message that says so.

    Raises:
        KeyError: an extra not in :data:`EXTRAS`.
    """
    module, needed_by = EXTRAS[extra]
    if importlib.util.find_spec(module) is not None:
        return None
    return (
        f"{needed_by} needs the {module!r} package, which is not installed: "
        f"pip install 'comlrl-algos[{extra}]'"
    )


def check_report_to(report_to: Iterable[str]) -> None:
    """Check that every reporting target's package is installed (``jsonl`` needs none).

    Raises:
        ConfigError: names the target, the missing package and the install command.
    """
    problems = [
        msg for name in report_to if name != "jsonl" and (msg := missing_extra(name)) is not None
    ]
    if problems:
        raise ConfigError("; ".join(problems) + " (or drop it from report_to)")


def _scalars(row: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class TensorBoardReporter:
    """Every numeric metric as a TensorBoard scalar (tag = metrics key, x = step).

    Args:
        log_dir: folder of the event files (``output_dir/tensorboard``).
    """

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, row: Mapping[str, Any]) -> None:
        step = int(row["step"])
        for key, value in _scalars(row).items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


class WandbReporter:
    """Every numeric metric to one Weights & Biases run (x = step).

    ``WANDB_MODE=offline`` (the wandb client's own setting) keeps the run on disk under
    ``output_dir/wandb``; nothing is sent until ``wandb sync``.

    Args:
        project: W&B project.
        output_dir: the run's output folder (W&B writes under ``output_dir/wandb``).
        config: the run's configuration, attached to the W&B run.
        name: the W&B run name (default: W&B's own).
    """

    def __init__(
        self,
        project: str,
        output_dir: str | Path,
        config: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        import wandb

        self._run = wandb.init(
            project=project, dir=str(output_dir), config=dict(config or {}), name=name
        )

    def log(self, row: Mapping[str, Any]) -> None:
        self._run.log(_scalars(row), step=int(row["step"]))

    def close(self) -> None:
        self._run.finish()


class RewardCurveReporter:
    """Writes ``reward_curve.png`` when closed, over the whole run.

    The rows come from ``metrics_path`` when it exists (so a resumed run's curve starts at
    step 1), else from the rows this reporter was given. Without matplotlib it prints one
    notice line to stderr and writes nothing.

    Args:
        path: the PNG to write.
        title: figure title.
        metrics_path: the run's ``metrics.jsonl``.
    """

    def __init__(
        self, path: str | Path, title: str | None = None, metrics_path: str | Path | None = None
    ) -> None:
        self.path = Path(path)
        self.title = title
        self.metrics_path = Path(metrics_path) if metrics_path is not None else None
        self.rows: list[dict[str, Any]] = []
        self.written: Path | None = None

    def log(self, row: Mapping[str, Any]) -> None:
        self.rows.append(
            {
                k: v
                for k, v in row.items()
                if k == "step" or k.endswith("reward_mean") or k.startswith("reward/")
            }
        )

    def close(self) -> None:
        if not any(len(r) > 1 for r in self.rows):  # no step had a reward (SFT, DPO)
            return
        if missing_extra("plot") is not None:
            print(
                f"comlrl: {self.path.name} skipped: matplotlib is not installed "
                "(pip install 'comlrl-algos[plot]', then `comlrl plot RUN_DIR` draws it)",
                file=sys.stderr,
            )
            return
        rows = read_metrics(self.metrics_path) if self.metrics_path is not None else []
        self.written = plot_reward_curve(rows or self.rows, self.path, title=self.title)


def build_reporters(
    config: RLConfig, output_dir: str | Path, *, record: Mapping[str, Any] | None = None
) -> list[Reporter]:
    """The reporters ``config`` asks for (see the module docstring), in that order.

    ``record``: what the run writes to ``config.yaml`` (the task or ``custom:`` reward
    function and the models it really trained:
    :func:`~comlrl.algos.training.run.lifecycle.run_record`); the reward curve's title and
    W&B's config come from it (default: the config).

    Raises:
        ConfigError: a reporting target whose package is not installed.
    """
    from comlrl.algos.training.run.diagnostics import EarlyEndWatch, LearningSignalWatch

    data = dict(record) if record is not None else config.model_dump()
    task = (data.get("task") or {}).get("name", config.task.name)
    models = data.get("models") or config.models
    title = f"{task} - {', '.join(str(m) for m in models)} - {config.baseline_label}"
    reporters = reporters_for(
        output_dir,
        report_to=config.report_to,
        reward_curve=config.reward_curve,
        title=title,
        wandb_project=config.wandb_project,
        record=data,
    )
    reporters.append(LearningSignalWatch())
    reporters.append(
        EarlyEndWatch(config.num_turns, config.early_termination_threshold, config.gamma)
    )
    return reporters


def reporters_for(
    output_dir: str | Path,
    *,
    report_to: Iterable[str],
    reward_curve: bool,
    title: str,
    wandb_project: str = "comlrl",
    record: Mapping[str, Any] | None = None,
) -> list[Reporter]:
    """TensorBoard (``output_dir/tensorboard``) and W&B as ``report_to`` names them, then
    ``reward_curve.png`` (titled ``title``) when ``reward_curve``: for any recipe whose
    rows carry ``reward_mean``.

    Raises:
        ConfigError: a reporting target whose package is not installed.
    """
    report_to = list(report_to)
    check_report_to(report_to)
    output_dir = Path(output_dir)
    reporters: list[Reporter] = []
    if "tensorboard" in report_to:
        reporters.append(TensorBoardReporter(output_dir / "tensorboard"))
    if "wandb" in report_to:
        reporters.append(WandbReporter(wandb_project, output_dir, record, output_dir.name))
    if reward_curve:
        reporters.append(
            RewardCurveReporter(
                output_dir / "reward_curve.png",
                title=title,
                metrics_path=output_dir / "metrics.jsonl",
            )
        )
    return reporters


def close_reporters(reporters: Iterable[Reporter]) -> None:
    """Close every reporter, even when one fails; then re-raise the first failure."""
    first: BaseException | None = None
    for reporter in reporters:
        try:
            reporter.close()
        except Exception as exc:  # close the rest first
            first = first or exc
    if first is not None:
        raise first
