"""The one training loop driver every recipe runs under.

A recipe supplies its setup and one step; :func:`run_loop` does the rest the same way for
every recipe (group baseline, IAC/MAAC, SFT, DPO, MADPO, MARLHF's RL phase)::

    for step in range(start, num_steps):
        result = recipe.step()                 # StepResult: the metrics row (+ its rollout)
        release_freed_memory()                 # the host memory the step freed (large runs)
        metrics.jsonl  <- result.row           # and every reporter (TensorBoard, W&B, curve)
        samples.jsonl  <- result.rollout       # the first log_samples joint actions per turn
        eval           <- recipe.evaluate()    # every eval_every steps (and at step 0)
        Ctrl-C         -> checkpoint, TrainingInterrupted
        an exception   -> checkpoint of the last completed step, the exception (noted)
        checkpoint     <- every save_every steps and at the last step (keep_last newest)
    final/             <- recipe.save_final(output_dir / "final")

Step checkpoints have one format (:mod:`comlrl.algos.training.run.checkpoint`); a recipe's
``checkpoint(path)`` callback writes its run into it, and its resume function reads it
back before the loop starts (:func:`rewind_outputs` then cuts the logs back to that step).

Nothing goes back through attributes: a step hands the driver its row and rollout.

Data parallel runs (:mod:`comlrl.algos.models.gradient_sync`) pass :class:`Collective`:
every rank runs the loop and the recipe's collectives; rank 0 alone writes files.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from comlrl.algos.records import Rollout
from comlrl.algos.rollout.metrics import sample_rows
from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.run.data import JsonlWriter
from comlrl.algos.training.run.host_memory import release_freed_memory
from comlrl.algos.training.run.lifecycle import (
    StopAtStepBoundary,
    TrainingInterrupted,
    add_note,
    clear_run_outputs,
    existing_run_outputs,
    failure_note,
    truncate_jsonl,
    used_output_dir_message,
)
from comlrl.algos.training.run.reporting import Reporter, close_reporters

__all__ = [
    "StepResult",
    "RecipeLoop",
    "LoopSettings",
    "Collective",
    "run_loop",
    "rewind_outputs",
    "LOGS",
]

#: The JSON-lines logs a run appends to (cut back to the step on resume).
LOGS = ("metrics.jsonl", "samples.jsonl", "eval.jsonl")


@dataclass(frozen=True)
class StepResult:
    """What one training step hands the loop driver.

    Attributes:
        row: the ``metrics.jsonl`` row; ``row["step"]`` is the step just finished
            (1-based: the number of training steps taken so far; a step is one batch of
            rollouts, one optimizer step per agent unless ``update_chunk_nodes`` splits
            its update into several).
        rollout: the step's rollout, for ``samples.jsonl`` (``None``: the recipe has no
            sampled joint actions, e.g. SFT and DPO on fixed rows).
    """

    row: dict[str, float]
    rollout: Rollout | None = None


@dataclass(frozen=True)
class RecipeLoop:
    """What a recipe hands :func:`run_loop`: its step and how to save and evaluate its run.

    Attributes:
        step: one training step (its ``row["step"]`` counts up from ``start_step + 1``).
        checkpoint: write a step checkpoint of the run at the given folder
            (:func:`comlrl.algos.training.run.checkpoint.write_checkpoint`'s format); under data
            parallelism every rank calls it (it may hold collectives), rank 0 writes.
        save_final: write the trained weights into the given folder (``final/``); every
            rank calls it, rank 0 writes.
        evaluate: the evaluation row of the current weights (``None``: no evaluation).
        start_step: the step the run is at (a resumed run's checkpoint step).
    """

    step: Callable[[], StepResult]
    checkpoint: Callable[[Path], Any]
    save_final: Callable[[Path], Any]
    evaluate: Callable[[], dict[str, float]] | None = None
    start_step: int = 0


@dataclass(frozen=True)
class Collective:
    """How ranks agree, under ``torch.distributed``; the defaults are one process.

    Attributes:
        is_main: this rank writes files (rank 0).
        any_rank: ``True`` on every rank when it is ``True`` on any (a Ctrl-C on one rank
            stops all of them at the same step).
        barrier: wait for every rank.
        full_weights: a context in which evaluation sees whole weights (FSDP2 gathers).
        world_size: the number of ranks (an exception in a step is checkpointed only in
            one process: the other ranks may be inside a collective of the failed step).
    """

    is_main: bool = True
    any_rank: Callable[[bool], bool] = bool
    barrier: Callable[[], Any] = lambda: None
    full_weights: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    world_size: int = 1


@dataclass(frozen=True)
class LoopSettings:
    """Where a run writes and how often it evaluates, saves and logs.

    Attributes:
        num_steps: train until this many training steps (batches of rollouts) have been
            taken.
        output_dir: the run's folder; ``None`` writes nothing (no logs, checkpoints,
            ``final/``; Ctrl-C behaves as usual) and only returns the rows.
        record: what ``config.yaml`` holds (the run's configuration; ``None``: not written).
        save_every: a step checkpoint every this many steps and at the last step; 0: only
            on Ctrl-C.
        keep_last: keep the newest this many step checkpoints (``None``: all).
        eval_every: evaluate every this many steps (0: never, unless ``eval_at_end``).
        eval_on_start: evaluate once before the first step (a fresh run only).
        eval_rows: ``"eval_jsonl"``: evaluation rows go to ``eval.jsonl``, stamped
            ``{"step": N, ...}`` (0: before the first step); ``"metrics"``: they are merged
            into that step's metrics row, the one before the first step as
            ``<key>_start`` on row 1.
        eval_at_end: also evaluate after the last step.
        log_samples: joint actions per turn written to ``samples.jsonl`` per step.
        progress: show a progress bar.
        desc: the progress bar's label.
        prompts_per_step: for ``prompts_per_s`` when the recipe does not time itself.
        reporters: built once the folder exists (TensorBoard, W&B, reward curve);
            ``None``: none.
        overwrite: a fresh run (step 0) into an ``output_dir`` that holds another run's
            outputs deletes them first; ``False`` refuses to start
            (:func:`~comlrl.algos.training.run.lifecycle.used_output_dir_message`).
    """

    num_steps: int
    output_dir: Path | None = None
    record: Mapping[str, Any] | None = None
    save_every: int = 0
    keep_last: int | None = None
    eval_every: int = 0
    eval_on_start: bool = False
    eval_rows: Literal["eval_jsonl", "metrics"] = "eval_jsonl"
    eval_at_end: bool = False
    log_samples: int = 0
    progress: bool = True
    desc: str = "train"
    prompts_per_step: int | None = None
    reporters: Callable[[Path], list[Reporter]] | None = field(default=None, repr=False)
    overwrite: bool = False


def rewind_outputs(output_dir: str | Path, step: int) -> None:
    """After a resume at ``step``: drop half-written checkpoint folders and the log rows
    written after ``step`` (:data:`LOGS`), so the run continues as if never stopped."""
    out = Path(output_dir)
    ckpt.clean_partial_checkpoints(out)
    for name in LOGS:
        truncate_jsonl(out / name, step)


@contextlib.contextmanager
def _writers(
    settings: LoopSettings, main: bool, evaluates: bool
) -> Iterator[dict[str, JsonlWriter]]:
    writers: dict[str, JsonlWriter] = {}
    try:
        if main and settings.output_dir is not None:
            writers["metrics"] = JsonlWriter(settings.output_dir / "metrics.jsonl")
            if settings.log_samples:
                writers["samples"] = JsonlWriter(settings.output_dir / "samples.jsonl")
            when = settings.eval_every or settings.eval_at_end or settings.eval_on_start
            if settings.eval_rows == "eval_jsonl" and evaluates and when:
                writers["eval"] = JsonlWriter(settings.output_dir / "eval.jsonl")
        yield writers
    finally:
        for w in writers.values():
            w.close()


def run_loop(
    recipe: RecipeLoop, settings: LoopSettings, collective: Collective | None = None
) -> list[dict[str, float]]:
    """Train from ``recipe.start_step`` to ``settings.num_steps``; returns the rows of the
    steps run here.

    Writes into ``settings.output_dir`` (rank 0): ``config.yaml``, ``metrics.jsonl`` (a
    row per step, with ``time/step_s`` and ``prompts_per_s`` added when the recipe left
    them out), ``samples.jsonl``, ``eval.jsonl``, step checkpoints and ``final/``
    (with ``checkpoint.json``). Every row also goes to the reporters.

    Raises:
        ConfigError: a fresh run into an ``output_dir`` that holds another run, without
            ``settings.overwrite`` (before anything is written).
        TrainingInterrupted: after the first Ctrl-C (with an ``output_dir``): the step in
            progress was finished and checkpointed; the exception names the checkpoint.
        Exception: whatever the step raises. In one process with an ``output_dir``, the
            last completed step is checkpointed first (as on Ctrl-C; unless it has a
            checkpoint already) and a note on the exception names the checkpoint and how
            to resume (:func:`~comlrl.algos.training.run.lifecycle.failure_note`). The
            group-baseline recipe puts its data and random streams back when its rollout
            fails, so that checkpoint resumes to exactly the run that never failed; an
            exception inside an optimizer update leaves the weights of the agents updated
            so far in the checkpoint.
    """
    import yaml
    from tqdm.auto import tqdm

    col = collective or Collective()
    out = settings.output_dir
    main = col.is_main
    step = recipe.start_step
    reporters: list[Reporter] = []
    if main and out is not None:
        earlier = existing_run_outputs(out) if step == 0 else []
        if earlier and not settings.overwrite:
            raise ConfigError(used_output_dir_message(out, earlier, api=True))
        if earlier:
            clear_run_outputs(out)
        out.mkdir(parents=True, exist_ok=True)
        if settings.reporters is not None:  # a missing extra fails here, before step 1
            reporters = settings.reporters(out)
        if settings.record is not None:
            (out / "config.yaml").write_text(yaml.safe_dump(dict(settings.record), sort_keys=False))
    history: list[dict[str, float]] = []
    bar = tqdm(
        total=settings.num_steps,
        initial=step,
        disable=not (settings.progress and main),
        desc=settings.desc,
        unit="step",
    )
    stop = StopAtStepBoundary() if out is not None else None
    try:
        with (
            _writers(settings, main, recipe.evaluate is not None) as writers,
            stop or contextlib.nullcontext(),
        ):

            def evaluate() -> dict[str, float]:
                assert recipe.evaluate is not None
                with col.full_weights():  # every rank gathers; rank 0 evaluates
                    return recipe.evaluate() if main else {}

            start: dict[str, float] = {}
            if recipe.evaluate is not None and step == 0 and settings.eval_on_start:
                start = evaluate()
                if "eval" in writers:
                    writers["eval"].write({"step": 0, **start})
            last = time.perf_counter()
            for _ in range(step, settings.num_steps):
                try:
                    result = recipe.step()
                except Exception as exc:
                    if out is not None:
                        _save_after_failure(recipe, settings, out, step, col, exc)
                    raise
                release_freed_memory()  # what the step freed, back to the system
                row, step = result.row, int(result.row["step"])
                now = time.perf_counter()
                row.setdefault("time/step_s", now - last)
                if settings.prompts_per_step is not None:
                    row.setdefault("prompts_per_s", settings.prompts_per_step / (now - last))
                last = now
                due = recipe.evaluate is not None and (
                    (settings.eval_every and step % settings.eval_every == 0)
                    or (settings.eval_at_end and step == settings.num_steps)
                )
                if settings.eval_rows == "metrics":
                    if step == 1:
                        row.update({f"{k}_start": v for k, v in start.items()})
                    if due:
                        row.update(evaluate())
                history.append(row)
                if "metrics" in writers:
                    writers["metrics"].write(row)
                for reporter in reporters:
                    reporter.log(row)
                if "samples" in writers and settings.log_samples and result.rollout is not None:
                    for sample in sample_rows(result.rollout, step, settings.log_samples):
                        writers["samples"].write(sample)
                bar.update(1)
                _postfix(bar, row)
                if due and settings.eval_rows == "eval_jsonl":
                    row_eval = evaluate()
                    if "eval" in writers:
                        writers["eval"].write({"step": step, **row_eval})
                if out is None:
                    continue
                # every rank stops at the same step, whichever saw the signal
                assert stop is not None
                if col.any_rank(stop.requested) and step < settings.num_steps:
                    path = _checkpoint(recipe, settings, out, step, main)
                    col.barrier()
                    raise TrainingInterrupted(step, path, out)
                if settings.save_every and (
                    step % settings.save_every == 0 or step == settings.num_steps
                ):
                    _checkpoint(recipe, settings, out, step, main)
            if out is not None:
                recipe.save_final(out / "final")
                if main:
                    (out / "final").mkdir(parents=True, exist_ok=True)
                    ckpt.write_meta(out / "final", step)
                col.barrier()  # no rank returns before the final weights are written
    finally:
        bar.close()
        close_reporters(reporters)
    return history


def _checkpoint(
    recipe: RecipeLoop, settings: LoopSettings, out: Path, step: int, main: bool
) -> Path:
    """Write the step checkpoint (every rank calls it), then (rank 0) prune to ``keep_last``."""
    path = ckpt.step_checkpoint_path(out, step)
    recipe.checkpoint(path)
    if main and settings.keep_last:
        ckpt.prune_checkpoints(out, settings.keep_last, keep=path)
    return path


def _save_after_failure(
    recipe: RecipeLoop,
    settings: LoopSettings,
    out: Path,
    step: int,
    col: Collective,
    exc: BaseException,
) -> None:
    """After ``recipe.step()`` raised ``exc`` in the step after ``step``: checkpoint ``step``
    (one process only) and add a note to ``exc`` saying where it is and how to resume."""
    path = ckpt.step_checkpoint_path(out, step)
    if col.world_size > 1:
        found = ckpt.latest_checkpoint(out)
        add_note(exc, failure_note(step, found, out, saved=False))
        return
    if step > 0 and not path.is_dir():
        try:
            _checkpoint(recipe, settings, out, step, col.is_main)
        except Exception as save_exc:  # the original exception is the one to see
            add_note(
                exc,
                f"comlrl: the checkpoint of step {step} could not be written either: {save_exc!r}",
            )
            path = ckpt.latest_checkpoint(out) or path
            add_note(exc, failure_note(step, path if path.is_dir() else None, out, saved=False))
            return
    add_note(exc, failure_note(step, path if path.is_dir() else None, out))


def _postfix(bar: Any, row: Mapping[str, Any]) -> None:
    shown = {}
    for key, label in (("reward_mean", "reward"), ("loss", "loss"), ("tokens_per_s", "tok_s")):
        if key in row:
            shown[label] = f"{row[key]:.3f}" if label != "tok_s" else f"{row[key]:.0f}"
    if shown:
        bar.set_postfix(shown)
