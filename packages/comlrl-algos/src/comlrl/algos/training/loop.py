"""The one training loop driver every recipe runs under.

A recipe is a class (:class:`Recipe`: group baseline, IAC/MAAC, SFT, DPO, MADPO, MARLHF,
the iterative ones); :func:`run_loop` drives it the same way for every one::

    for step in range(recipe.global_step, schedule.num_steps):
        result = recipe.step()                 # StepResult: the metrics row (+ its rollout)
        release_freed_memory()                 # the host memory the step freed (large runs)
        metrics.jsonl  <- result.row           # and every reporter (TensorBoard, W&B, curve)
        samples.jsonl  <- result.rollout       # the first log_samples joint actions per turn
        eval           <- recipe.evaluate()    # every eval_every steps (and at step 0)
        Ctrl-C/SIGTERM -> checkpoint, TrainingInterrupted
        an exception   -> checkpoint of the last completed step, the exception (noted)
        checkpoint     <- every save_every steps and at the last step (keep_last newest)
    final/             <- recipe.save_final(output_dir / "final")

The recipe says what its config asks of the loop (:meth:`Recipe.schedule`: the steps,
evaluation, samples, ``config.yaml``); :class:`~comlrl.algos.training.run.outputs.RunOutputs`
says where the files go. Step checkpoints have one format
(:mod:`comlrl.algos.training.run.checkpoint`); a recipe's ``checkpoint(path)`` writes its run
into it, and its ``resume(path)`` reads it back before the loop starts (:func:`rewind_outputs`
then cuts the logs back to that step).

Nothing goes back through attributes: a step hands the driver its row and rollout.

Data parallel runs (:mod:`comlrl.algos.models.gradient_sync`): the recipe's
:meth:`Recipe.collective` says how the ranks agree; every rank runs the loop and the
recipe's collectives; rank 0 alone writes files.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

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
from comlrl.algos.training.run.outputs import RunOutputs
from comlrl.algos.training.run.reporting import Reporter, close_reporters

__all__ = [
    "StepResult",
    "Schedule",
    "Collective",
    "Recipe",
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
class Schedule:
    """What a recipe's config asks of the loop (its :meth:`Recipe.schedule`).

    Attributes:
        num_steps: train until this many training steps (batches) have been taken.
        evaluates: the recipe has an evaluation set (:meth:`Recipe.evaluate` works).
        eval_every: evaluate every this many steps (0: never, unless ``eval_at_end``).
        eval_on_start: evaluate once before the first step (a fresh run only).
        eval_at_end: also evaluate after the last step.
        eval_rows: ``"eval_jsonl"``: evaluation rows go to ``eval.jsonl``, stamped
            ``{"step": N, ...}`` (0: before the first step); ``"metrics"``: they are merged
            into that step's metrics row, the one before the first step as
            ``<key>_start`` on row 1.
        log_samples: joint actions per turn written to ``samples.jsonl`` per step.
        desc: the progress bar's label.
        prompts_per_step: for ``prompts_per_s`` when the recipe does not time itself.
        record: what ``config.yaml`` holds (``None``: not written).
        title: the reward curve's title.
        watches: the recipe's own reporters (warnings for runs that cannot learn), built
            once the folder exists.
    """

    num_steps: int
    evaluates: bool = False
    eval_every: int = 0
    eval_on_start: bool = False
    eval_at_end: bool = False
    eval_rows: Literal["eval_jsonl", "metrics"] = "eval_jsonl"
    log_samples: int = 0
    desc: str = "train"
    prompts_per_step: int | None = None
    record: Mapping[str, Any] | None = None
    title: str = ""
    watches: Callable[[], list[Reporter]] | None = field(default=None, repr=False)


class Recipe(Protocol):
    """What :func:`run_loop` drives: one class per recipe family
    (``recipes/<family>/recipe.py``). Its constructor is the setup; these methods are all the
    loop calls."""

    @property
    def global_step(self) -> int:
        """Training steps taken so far (a resumed run's checkpoint step)."""
        ...

    def schedule(self) -> Schedule:
        """What the recipe's config asks of the loop."""
        ...

    def step(self) -> StepResult:
        """One training step; its row's ``step`` is ``global_step`` after it."""
        ...

    def evaluate(self) -> dict[str, float]:
        """The evaluation row of the current weights."""
        ...

    def checkpoint(self, path: Path) -> Path:
        """Write a step checkpoint of the run at ``path``
        (:func:`~comlrl.algos.training.run.checkpoint.write_checkpoint`'s format); under
        data parallelism every rank calls it (it may hold collectives), rank 0 writes."""
        ...

    def save_final(self, path: Path) -> Any:
        """Write the trained weights into ``path`` (``final/``); every rank calls it,
        rank 0 writes."""
        ...

    def collective(self) -> Collective:
        """How the ranks of this run agree (one process: ``Collective()``)."""
        ...


def rewind_outputs(output_dir: str | Path, step: int) -> None:
    """After a resume at ``step``: drop half-written checkpoint folders and the log rows
    written after ``step`` (:data:`LOGS`), so the run continues as if never stopped."""
    out = Path(output_dir)
    ckpt.clean_partial_checkpoints(out)
    for name in LOGS:
        truncate_jsonl(out / name, step)


@contextlib.contextmanager
def _writers(plan: Schedule, out: Path | None, main: bool) -> Iterator[dict[str, JsonlWriter]]:
    writers: dict[str, JsonlWriter] = {}
    try:
        if main and out is not None:
            writers["metrics"] = JsonlWriter(out / "metrics.jsonl")
            if plan.log_samples:
                writers["samples"] = JsonlWriter(out / "samples.jsonl")
            when = plan.eval_every or plan.eval_at_end or plan.eval_on_start
            if plan.eval_rows == "eval_jsonl" and plan.evaluates and when:
                writers["eval"] = JsonlWriter(out / "eval.jsonl")
        yield writers
    finally:
        for w in writers.values():
            w.close()


def run_loop(recipe: Recipe, outputs: RunOutputs | None) -> list[dict[str, float]]:
    """Train ``recipe`` from its ``global_step`` to its schedule's ``num_steps``; returns
    the rows of the steps run here.

    Writes into ``outputs.output_dir`` (rank 0; ``outputs=None`` writes nothing, and
    Ctrl-C behaves as usual): ``config.yaml``, ``metrics.jsonl`` (a row per step, with
    ``time/step_s`` and ``prompts_per_s`` added when the recipe left them out),
    ``samples.jsonl``, ``eval.jsonl``, step checkpoints and ``final/`` (with
    ``checkpoint.json``). Every row also goes to the reporters.

    Raises:
        ConfigError: a fresh run into an ``output_dir`` that holds another run, without
            ``outputs.overwrite`` (before anything is written).
        TrainingInterrupted: after the first Ctrl-C or SIGTERM (with outputs): the step in
            progress was finished and checkpointed; the exception names the checkpoint.
        Exception: whatever the step raises. In one process with outputs, the last
            completed step is checkpointed first (as on Ctrl-C; unless it has a checkpoint
            already) and a note on the exception names the checkpoint and how to resume
            (:func:`~comlrl.algos.training.run.lifecycle.failure_note`). Every recipe puts
            its data and random streams back when a step fails before its first weight
            change (:func:`~comlrl.algos.training.run.checkpoint.streams_kept_on_failure`),
            so that checkpoint resumes to exactly the run that never failed; an exception
            inside an optimizer update leaves the weights of the agents updated so far in
            the checkpoint.
    """
    import yaml
    from tqdm.auto import tqdm

    plan = recipe.schedule()
    col = recipe.collective()
    out = outputs.output_dir if outputs is not None else None
    main = col.is_main
    step = recipe.global_step
    reporters: list[Reporter] = []
    if main and outputs is not None and out is not None:
        earlier = existing_run_outputs(out) if step == 0 else []
        if earlier and not outputs.overwrite:
            raise ConfigError(used_output_dir_message(out, earlier, api=True))
        if earlier:
            clear_run_outputs(out)
        out.mkdir(parents=True, exist_ok=True)
        # a missing extra fails here, before step 1
        reporters = [
            *outputs.reporters(plan.title, plan.record),
            *(plan.watches() if plan.watches is not None else []),
        ]
        if plan.record is not None:
            (out / "config.yaml").write_text(yaml.safe_dump(dict(plan.record), sort_keys=False))
    history: list[dict[str, float]] = []
    bar = tqdm(
        total=plan.num_steps,
        initial=step,
        disable=not ((outputs is None or outputs.progress) and main),
        desc=plan.desc,
        unit="step",
    )
    stop = StopAtStepBoundary() if out is not None else None
    try:
        with _writers(plan, out, main) as writers, stop or contextlib.nullcontext():

            def evaluate() -> dict[str, float]:
                with col.full_weights():  # every rank gathers; rank 0 evaluates
                    return recipe.evaluate() if main else {}

            start: dict[str, float] = {}
            if plan.evaluates and step == 0 and plan.eval_on_start:
                start = evaluate()
                if "eval" in writers:
                    writers["eval"].write({"step": 0, **start})
            last = time.perf_counter()
            for _ in range(step, plan.num_steps):
                try:
                    result = recipe.step()
                except Exception as exc:
                    if outputs is not None:
                        _save_after_failure(recipe, outputs, step, col, exc)
                    raise
                release_freed_memory()  # what the step freed, back to the system
                row, step = result.row, int(result.row["step"])
                now = time.perf_counter()
                row.setdefault("time/step_s", now - last)
                if plan.prompts_per_step is not None:
                    row.setdefault("prompts_per_s", plan.prompts_per_step / (now - last))
                last = now
                due = plan.evaluates and (
                    (plan.eval_every and step % plan.eval_every == 0)
                    or (plan.eval_at_end and step == plan.num_steps)
                )
                if plan.eval_rows == "metrics":
                    if step == 1:
                        row.update({f"{k}_start": v for k, v in start.items()})
                    if due:
                        row.update(evaluate())
                history.append(row)
                if "metrics" in writers:
                    writers["metrics"].write(row)
                for reporter in reporters:
                    reporter.log(row)
                if "samples" in writers and plan.log_samples and result.rollout is not None:
                    for sample in sample_rows(result.rollout, step, plan.log_samples):
                        writers["samples"].write(sample)
                bar.update(1)
                _postfix(bar, row)
                if due and plan.eval_rows == "eval_jsonl":
                    row_eval = evaluate()
                    if "eval" in writers:
                        writers["eval"].write({"step": step, **row_eval})
                if outputs is None:
                    continue
                # every rank stops at the same step, whichever saw the signal
                assert stop is not None
                if col.any_rank(stop.requested) and step < plan.num_steps:
                    path = _checkpoint(recipe, outputs, step, main)
                    col.barrier()
                    signum = stop.signum if stop.signum is not None else 2
                    raise TrainingInterrupted(step, path, outputs.output_dir, signum)
                if outputs.save_every and (
                    step % outputs.save_every == 0 or step == plan.num_steps
                ):
                    _checkpoint(recipe, outputs, step, main)
            if outputs is not None:
                final = outputs.output_dir / "final"
                recipe.save_final(final)
                if main:
                    final.mkdir(parents=True, exist_ok=True)
                    ckpt.write_meta(final, step)
                col.barrier()  # no rank returns before the final weights are written
    finally:
        bar.close()
        close_reporters(reporters)
    return history


def _checkpoint(recipe: Recipe, outputs: RunOutputs, step: int, main: bool) -> Path:
    """Write the step checkpoint (every rank calls it), then (rank 0) prune to ``keep_last``."""
    path = ckpt.step_checkpoint_path(outputs.output_dir, step)
    recipe.checkpoint(path)
    if main and outputs.keep_last:
        ckpt.prune_checkpoints(outputs.output_dir, outputs.keep_last, keep=path)
    return path


def _save_after_failure(
    recipe: Recipe, outputs: RunOutputs, step: int, col: Collective, exc: BaseException
) -> None:
    """After ``recipe.step()`` raised ``exc`` in the step after ``step``: checkpoint ``step``
    (one process only) and add a note to ``exc`` saying where it is and how to resume."""
    out = outputs.output_dir
    path = ckpt.step_checkpoint_path(out, step)
    if col.world_size > 1:
        found = ckpt.latest_checkpoint(out)
        add_note(exc, failure_note(step, found, out, saved=False))
        return
    if step > 0 and not path.is_dir():
        try:
            _checkpoint(recipe, outputs, step, col.is_main)
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
