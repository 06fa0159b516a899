"""A run's life around the training loop: interrupts, its output folder, resuming it.

- :class:`StopAtStepBoundary`: the first Ctrl-C (SIGINT) or SIGTERM (what Slurm and
  Kubernetes send before they kill a job) asks the loop to stop after the step in progress;
  the loop then checkpoints and raises :class:`TrainingInterrupted`. A second signal stops
  at once (no checkpoint).
- :func:`existing_run_outputs` / :func:`clear_run_outputs` /
  :func:`used_output_dir_message`: a new run (command line or library) refuses an output
  folder that holds another run's outputs unless told to overwrite them.
- :func:`run_record`: what a library run writes to ``config.yaml``: its config with the task
  (or ``custom:`` reward function) it really trained on.
- :func:`truncate_jsonl`: on resume, log rows written after the checkpoint's step go.
- :func:`resume_config`: a resumed run keeps its saved configuration; only the fields in
  :data:`RESUME_SAFE_FIELDS` (how long to run, how often to save, evaluate and log) may
  change, because the others change what the next steps compute.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

__all__ = [
    "TrainingInterrupted",
    "StopAtStepBoundary",
    "RUN_OUTPUTS",
    "existing_run_outputs",
    "failure_note",
    "add_note",
    "used_output_dir_message",
    "CUSTOM_REWARD",
    "run_record",
    "agent_model_names",
    "IN_MEMORY",
    "finished_step",
    "clear_run_outputs",
    "truncate_jsonl",
    "RESUME_SAFE_FIELDS",
    "resume_config",
]

#: Files and folders a training run writes into its ``output_dir``.
RUN_OUTPUTS = (
    "metrics.jsonl",
    "samples.jsonl",
    "eval.jsonl",
    "config.yaml",
    "checkpoints",
    "final",
    "evals",
)

#: Config fields a resumed run may change: they do not alter what a step computes.
RESUME_SAFE_FIELDS = frozenset(
    {
        "num_steps",
        "save_every",
        "keep_last",
        "progress",
        "log_samples",
        "eval_every",
        "eval_on_start",
        "eval_split",
        "eval_greedy",
        "eval_num_samples",
        "eval_limit",
    }
)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C or SIGTERM at a step boundary, after writing a checkpoint.

    A :class:`KeyboardInterrupt`, so code that handles Ctrl-C keeps working.

    Attributes:
        step: the last completed step.
        checkpoint: the step checkpoint written on the way out.
        output_dir: the run's folder (what ``comlrl train --resume`` takes).
        signum: the signal that stopped the run (``SIGINT`` or ``SIGTERM``).
    """

    def __init__(
        self, step: int, checkpoint: Path, output_dir: Path, signum: int = signal.SIGINT
    ) -> None:
        self.step = step
        self.checkpoint = Path(checkpoint)
        self.output_dir = Path(output_dir)
        self.signum = int(signum)
        super().__init__(self.message())

    @property
    def exit_code(self) -> int:
        """The shell's code for a process stopped by :attr:`signum`: 130 (SIGINT), 143
        (SIGTERM)."""
        return 128 + self.signum

    def message(self) -> str:
        """``interrupted at step N; checkpoint: ...; resume with: comlrl train --resume ...``
        (``interrupted by SIGTERM at step N; ...`` for SIGTERM)."""
        how = "" if self.signum == signal.SIGINT else f" by {signal.Signals(self.signum).name}"
        return (
            f"interrupted{how} at step {self.step}; checkpoint: {self.checkpoint}; "
            f"resume with: comlrl train --resume {self.output_dir}"
        )


class StopAtStepBoundary:
    """Context manager: while active, SIGINT and SIGTERM set :attr:`requested` instead of
    stopping the process.

    The first signal prints a note, sets :attr:`requested` and :attr:`signum`; the loop
    checks it between steps. A second one puts the previous handlers back and stops at once:
    SIGINT raises :class:`KeyboardInterrupt`, SIGTERM is delivered again to the previous
    handler (by default: the process ends). Outside the main thread (where Python cannot
    install signal handlers) it does nothing and the signals behave as usual.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(signum)
            return
        self.requested = True
        self.signum = signum
        what = "interrupt" if signum == signal.SIGINT else signal.Signals(signum).name
        again = "Ctrl-C" if signum == signal.SIGINT else what
        print(
            f"\ncomlrl: {what} received; finishing the current step, then writing a "
            f"checkpoint ({again} again to stop now without one)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> StopAtStepBoundary:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()


def failure_note(
    step: int, checkpoint: Path | None, output_dir: str | Path, *, saved: bool = True
) -> str:
    """What a run that failed in the step after ``step`` says about its checkpoint: where
    the last completed step is saved and how to resume it (command line and library), or
    that nothing can be resumed.

    Args:
        step: the last completed step (0: none).
        checkpoint: the step checkpoint to resume from (``None``: there is none).
        output_dir: the run's folder.
        saved: ``checkpoint`` was written on the way out (else it is the newest one found).
    """
    head = f"comlrl: training failed in step {step + 1}"
    if checkpoint is None:
        return (
            f"{head}; no step checkpoint to resume from (no step had completed, or none was "
            "saved); after fixing the cause, start the run again (--overwrite if the command "
            "line refuses the folder)."
        )
    what = f"step {step} (the last completed step) was saved" if saved else "newest checkpoint"
    return (
        f"{head}; {what}: {checkpoint}; after fixing the cause, resume with: "
        f"comlrl train --resume {output_dir} (library: trainer.resume({str(checkpoint)!r}) "
        "before train())"
    )


def add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to ``exc``: ``exc.add_note`` (Python 3.11+: the traceback ends with
    it); on Python 3.10 it goes to ``exc.__notes__`` (which the command line prints) and,
    since 3.10's traceback does not show notes, to stderr now."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
    print(note, file=sys.stderr, flush=True)


def existing_run_outputs(output_dir: str | Path) -> list[str]:
    """The outputs of an earlier run in ``output_dir`` that a new run would mix with.

    ``metrics.jsonl``, ``samples.jsonl``, ``eval.jsonl`` (non-empty files), ``checkpoints``
    (with a ``step-*`` folder) and ``final`` (with ``checkpoint.json`` or an ``agent_*``
    folder); a lone ``config.yaml`` does not count, nor does what a run writes before its
    loop starts (MARLHF's fitted reward model in ``checkpoints/`` and ``final/``).
    """
    out = Path(output_dir)
    found = []
    for name in ("metrics.jsonl", "samples.jsonl", "eval.jsonl"):
        if (out / name).is_file() and (out / name).stat().st_size > 0:
            found.append(name)
    ckpt = out / "checkpoints"
    if ckpt.is_dir() and any(p.name.startswith("step-") for p in ckpt.iterdir()):
        found.append("checkpoints")
    final = out / "final"
    if final.is_file() or (
        final.is_dir() and ((final / "checkpoint.json").exists() or any(final.glob("agent_*")))
    ):
        found.append("final")
    return found


def used_output_dir_message(output_dir: str | Path, earlier: list[str], *, api: bool) -> str:
    """Why a new run refuses ``output_dir`` (it holds ``earlier``, from
    :func:`existing_run_outputs`) and the ways out: resume it (only when it has a complete
    step checkpoint, which the message names), overwrite it, or choose another folder;
    ``api``: in the library's words (``overwrite=True``, ``resume()``), else the command
    line's (``--resume``, ``--overwrite``)."""
    from comlrl.algos.training.run.checkpoint import latest_checkpoint

    found = latest_checkpoint(output_dir)
    overwrite = "train(overwrite=True)" if api else "--overwrite"
    if found is None:
        resume = (
            "it has no step checkpoint to resume from (save_every=0 saves one only on Ctrl-C "
            "or when a step fails); "
        )
    elif api:
        resume = f"continue it from its newest checkpoint with: trainer.resume({str(found)!r}) before train(), or "
    else:
        resume = f"continue it from its newest checkpoint ({found}) with: comlrl train --resume {output_dir}, or "
    return (
        f"output_dir {str(output_dir)!r} already holds a run ({', '.join(earlier)}); "
        f"{resume}start over with {overwrite} (deletes that run's "
        "metrics, samples, evaluations, checkpoints and final/), or choose another output_dir."
    )


#: ``task.name`` in the ``config.yaml`` of a run trained on a reward function of its own
#: (``custom:<module>.<name>``): no registered task scores it (``comlrl eval`` refuses).
CUSTOM_REWARD = "custom:"


def run_record(
    config: Any,
    *,
    algo: str | None = None,
    task: Any = None,
    reward_func: Any = None,
    agents: Any = None,
) -> dict[str, Any]:
    """What a library run writes to ``config.yaml``: ``config.model_dump()`` with the task
    it really trained on and the models its agents really hold.

    ``task.name`` becomes the given task object's ``name`` (its ``task.kwargs`` are dropped
    when that is another task than the config names); without a task, a ``reward_func``
    is recorded as ``custom:<module>.<qualname>`` (:data:`CUSTOM_REWARD`), so no one scores
    the run with a registered task's reward by mistake. ``models`` becomes what
    ``agents`` hold (:func:`agent_model_names`) when given. ``algo`` (the recipe's name)
    goes first, as the command line writes it.
    """
    data = dict(config.model_dump())
    section = dict(data.get("task") or {})
    if task is not None:
        name = getattr(task, "name", "") or type(task).__qualname__
        if name != section.get("name"):
            section.update(name=name, kwargs={})
    elif reward_func is not None:
        where = getattr(reward_func, "__module__", None) or "?"
        what = getattr(reward_func, "__qualname__", None) or type(reward_func).__qualname__
        section.update(name=f"{CUSTOM_REWARD}{where}.{what}", kwargs={})
    if section:
        data["task"] = section
    if agents is not None and "models" in data:
        names = agent_model_names(agents, config.model_for)
        if len(set(names)) == 1:
            names = names[:1]
        data["models"] = names
    return {"algo": algo, **data} if algo is not None else data


#: The end of :func:`agent_model_names`' entry for a model built in memory (no name).
IN_MEMORY = " (in-memory model, no name_or_path)"


def agent_model_names(agents: Any, named: Callable[[int], str]) -> list[str]:
    """Per agent, the name of the model it holds, for ``config.yaml``: the config's name
    (``named(i)``) when the agent's model came from it (its ``name_or_path`` is that name,
    that folder, the folder of that ``.gguf`` file, or the built-in model's files), else the
    model's own ``name_or_path``, else ``<Class> (in-memory model, no name_or_path)``."""
    from comlrl.algos.models.loading import STORIES260K, TINY_QWEN2, builtin_model_path

    out = []
    for i, agent in enumerate(agents):
        model = getattr(agent, "model", agent)
        source = str(getattr(model, "name_or_path", "") or "")
        wanted = named(i)
        if wanted == STORIES260K:
            same = source == str(builtin_model_path())
        elif wanted == TINY_QWEN2:
            same = (
                not source and getattr(getattr(model, "config", None), "model_type", "") == "qwen2"
            )
        elif source:
            here = Path(source).expanduser().resolve()
            there = Path(wanted).expanduser().resolve()
            same = (
                source == wanted
                or here == there
                or (wanted.endswith(".gguf") and here == there.parent)
            )
        else:
            same = False
        if same:
            out.append(wanted)
        elif source == str(builtin_model_path()):
            out.append(STORIES260K)
        else:
            out.append(source or f"{type(model).__name__}{IN_MEMORY}")
    return out


def finished_step(output_dir: str | Path) -> int | None:
    """The step a run's ``final/`` was written at (``final/checkpoint.json``), or ``None``."""
    try:
        return int(json.loads((Path(output_dir) / "final" / "checkpoint.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clear_run_outputs(output_dir: str | Path) -> list[str]:
    """Delete the run outputs (:data:`RUN_OUTPUTS`) in ``output_dir``; nothing else there.

    Returns:
        the names deleted.
    """
    out = Path(output_dir)
    removed = []
    for name in RUN_OUTPUTS:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        removed.append(name)
    return removed


def truncate_jsonl(path: str | Path, step: int) -> int:
    """Keep the rows of a JSON-lines log up to ``step``; returns how many rows were dropped.

    Rows whose ``"step"`` is above ``step`` go, and so does a last line cut short by a
    kill (it does not parse). The file is rewritten atomically; a missing file is fine.

    Raises:
        ValueError: a line other than the last does not parse (the file is not a log of
            this library); the file is left as it was.
    """
    p = Path(path)
    if not p.is_file():
        return 0
    lines = p.read_text().splitlines()
    kept, dropped = [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if i == len(lines) - 1:
                dropped += 1
                continue
            raise ValueError(f"{str(p)!r} line {i + 1} is not JSON: {line[:80]!r}") from None
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] > step:
            dropped += 1
            continue
        kept.append(line)
    if dropped:
        tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(x + "\n" for x in kept))
        os.replace(tmp, p)
    return dropped


def resume_config(
    run_dir: str | Path,
    overrides: list[str],
    build: Callable[[dict[str, Any]], Any] | None = None,
) -> Any:
    """The configuration of a run to resume: its saved ``config.yaml`` plus safe overrides.

    ``output_dir`` becomes ``run_dir`` (the folder may have moved since). A saved ``algo``
    key (the recipe's name, written by the command line) is dropped before validation.

    Args:
        run_dir: the run's ``output_dir``.
        overrides: ``key=value`` strings.
        build: validates a mapping into the recipe's config (e.g.
            :meth:`comlrl.algos.recipes.registry.Recipe.build_config`); ``None``:
            :func:`comlrl.algos.training.config.rl.build_config` (a group-baseline ``TrainConfig``).

    Returns:
        the recipe's config (a :class:`~comlrl.algos.training.config.rl.TrainConfig` by default).

    Raises:
        ConfigError: no ``config.yaml`` in ``run_dir``, an invalid override, or an
            override of a field outside :data:`RESUME_SAFE_FIELDS` that changes its value.
    """
    from comlrl.algos.training.config.rl import ConfigError, apply_overrides, build_config

    run = Path(run_dir)
    saved_path = run / "config.yaml"
    if not saved_path.is_file():
        raise ConfigError(
            f"cannot resume {str(run)!r}: it has no config.yaml (is it the output_dir of a "
            "comlrl train run?)"
        )
    saved_data = yaml.safe_load(saved_path.read_text()) or {}
    if not isinstance(saved_data, dict):
        raise ConfigError(f"{str(saved_path)!r} must hold a YAML mapping")
    saved_data = {k: v for k, v in saved_data.items() if k != "algo"}
    saved_data["output_dir"] = str(run)
    validate = build if build is not None else build_config
    saved = validate(saved_data)
    new = validate(apply_overrides(saved_data, overrides))
    before, after = saved.model_dump(), new.model_dump()
    changed = sorted(k for k in after if after[k] != before[k])
    refused = [k for k in changed if k not in RESUME_SAFE_FIELDS]
    if refused:
        details = ", ".join(f"{k} (run: {before[k]!r}, asked: {after[k]!r})" for k in refused)
        raise ConfigError(
            f"cannot change {details} when resuming {str(run)!r}: it would change what the "
            f"remaining steps compute. Fields a resume may change: {', '.join(sorted(RESUME_SAFE_FIELDS))}. "
            "To train with other settings, start a new run (another output_dir, or --overwrite)."
        )
    return new
