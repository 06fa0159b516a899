"""Where a run writes, how it checkpoints and reports, and what it continues
(:class:`RunOutputs`): the one carrier of a run's output settings, from the command line or
Python to the loop driver (:func:`comlrl.algos.training.loop.run_loop`), unchanged on the
way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.run.checkpoint import latest_checkpoint
from comlrl.algos.training.run.lifecycle import clear_run_outputs, existing_run_outputs
from comlrl.algos.training.run.reporting import Reporter, reporters_for

__all__ = ["RunOutputs"]


@dataclass(frozen=True)
class RunOutputs:
    """Where a run writes, how its loop checkpoints and reports, and what it continues.

    :meth:`of` reads it from a config's fields of the same names (every recipe config has
    them); a recipe built without one uses ``RunOutputs.of(config)``. The recipe's config
    says what a step computes; this says where the run's files go, so a resumed or moved
    run changes these and nothing else.

    Attributes:
        output_dir: the run's folder: ``config.yaml``, ``metrics.jsonl`` (a row per step),
            ``eval.jsonl``, ``checkpoints/step-*``, ``final/`` (Hugging Face format).
        save_every: a step checkpoint every this many steps and at the last; 0: only on
            Ctrl-C, SIGTERM or when a step fails.
        keep_last: keep the newest this many step checkpoints (``None``: all).
        progress: show a progress bar.
        report_to: where metrics go besides ``metrics.jsonl`` (``tensorboard``, ``wandb``).
        wandb_project: the W&B project (``report_to`` wandb).
        reward_curve: write ``output_dir/reward_curve.png`` at the end.
        resume_from: a step checkpoint of this run to continue from (``None``: a fresh
            run); :meth:`of` with ``resume=True`` picks the newest in ``output_dir``.
        overwrite: a fresh run into an ``output_dir`` that holds another run deletes that
            run's outputs when it starts (after its models loaded, so a failed load deletes
            nothing); ``False``: the run refuses to start (:class:`ConfigError`).

    Raises:
        ConfigError: ``save_every < 0`` or ``keep_last < 1``.
    """

    output_dir: Path
    save_every: int = 0
    keep_last: int | None = None
    progress: bool = True
    report_to: tuple[str, ...] = ("jsonl",)
    wandb_project: str = "comlrl"
    reward_curve: bool = True
    resume_from: Path | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_dir", Path(self.output_dir))  # a str is taken too
        object.__setattr__(self, "report_to", tuple(self.report_to))
        if self.resume_from is not None:
            object.__setattr__(self, "resume_from", Path(self.resume_from))
        if self.save_every < 0:
            raise ConfigError(f"save_every must be >= 0, got {self.save_every}")
        if self.keep_last is not None and self.keep_last < 1:
            raise ConfigError(f"keep_last must be >= 1 or None, got {self.keep_last}")

    @classmethod
    def of(
        cls,
        config: Any,
        *,
        resume_from: str | Path | None = None,
        resume: bool = False,
        overwrite: bool = False,
    ) -> RunOutputs:
        """The outputs of ``config`` (its ``output_dir``, ``save_every``, ``keep_last``,
        ``progress``, ``report_to``, ``wandb_project``, ``reward_curve``); ``resume=True``
        continues from the newest step checkpoint in ``output_dir``.

        Raises:
            ConfigError: ``resume=True`` and ``output_dir`` has no complete step checkpoint.
        """
        if resume and resume_from is None:
            resume_from = latest_checkpoint(config.output_dir)
            if resume_from is None:
                raise ConfigError(
                    f"nothing to resume in {config.output_dir!r}: no complete step checkpoint "
                    "under its checkpoints/ (a run writes one every save_every steps and on "
                    "Ctrl-C); start a fresh run instead."
                )
        return cls(
            output_dir=Path(config.output_dir),
            save_every=config.save_every,
            keep_last=config.keep_last,
            progress=config.progress,
            report_to=tuple(getattr(config, "report_to", ("jsonl",))),
            wandb_project=getattr(config, "wandb_project", "comlrl"),
            reward_curve=getattr(config, "reward_curve", True),
            resume_from=Path(resume_from) if resume_from is not None else None,
            overwrite=overwrite,
        )

    def record(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """``data`` (what ``config.yaml`` holds: a config's fields) with these outputs in the
        fields of the same names, so the file says where the run really writes and
        ``--resume`` finds it there."""
        out = dict(data)
        for key in ("output_dir", "save_every", "keep_last", "progress"):
            if key in out:
                out[key] = str(self.output_dir) if key == "output_dir" else getattr(self, key)
        return out

    def check_folder(self) -> None:
        """Refuse a fresh run into an ``output_dir`` that holds another run, unless
        :attr:`overwrite`.

        Raises:
            ConfigError: naming what the folder holds and the ways out (resume it, start
                over, or another folder).
        """
        if self.resume_from is not None or self.overwrite:
            return
        earlier = existing_run_outputs(self.output_dir)
        if not earlier:
            return
        found = latest_checkpoint(self.output_dir)
        resume = (
            f"continue it from its newest checkpoint ({found}) with "
            "RunOutputs.of(config, resume=True), or "
            if found is not None
            else "it has no step checkpoint to resume from; "
        )
        raise ConfigError(
            f"output_dir {str(self.output_dir)!r} already holds a run ({', '.join(earlier)}); "
            f"{resume}start over with RunOutputs.of(config, overwrite=True) (deletes that "
            "run's metrics, samples, evaluations, checkpoints and final/), or choose another "
            "output_dir."
        )

    def clear_earlier_run(self) -> None:
        """With :attr:`overwrite`, delete another run's outputs in ``output_dir`` (a fresh
        run only: nothing is deleted when resuming)."""
        if self.overwrite and self.resume_from is None:
            clear_run_outputs(self.output_dir)

    def reporters(self, title: str, record: Mapping[str, Any] | None) -> list[Reporter]:
        """TensorBoard, W&B and the reward curve as these outputs ask
        (:func:`~comlrl.algos.training.run.reporting.reporters_for`; ``title`` on the curve,
        ``record`` as W&B's config).

        Raises:
            ConfigError: a reporting target whose package is not installed.
        """
        return reporters_for(
            self.output_dir,
            report_to=self.report_to,
            reward_curve=self.reward_curve,
            title=title,
            wandb_project=self.wandb_project,
            record=record,
        )
