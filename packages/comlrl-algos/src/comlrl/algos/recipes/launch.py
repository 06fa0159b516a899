"""What every end-to-end recipe run shares: the fields a run config adds to a library
config (:class:`RunFields`: ``output_dir``, dtype, prompt format, checkpoints;
:class:`OneModelRunFields`: the model and the ``data`` files of a one-model recipe;
:func:`eval_on_start_follows`), its outputs and loop settings (:class:`RunOutputs`, the one
such argument of every ``run_*`` function), what it returns (:class:`RunResult`), the checks
before any model loads (:func:`preflight`), the evaluation split (:func:`load_eval_split`),
reading JSON-lines rows, starting the output folder, loading a model or the agents
(:func:`load_agents`) and the closing summary line. Each ``*RunConfig`` lives beside its
recipe (``recipes/<family>/config.py``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from comlrl.algos.models.loading import DEFAULT_MODEL
from comlrl.algos.training.config.rl import ConfigError
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "RunFields",
    "OneModelRunFields",
    "eval_on_start_follows",
    "RunOutputs",
    "RunResult",
    "setup_errors",
    "preflight",
    "check_offline",
    "announce",
    "resuming_line",
    "load_eval_split",
    "load_agents",
    "load_model",
    "read_jsonl_rows",
    "start_outputs",
    "loss_summary",
    "quiet_transformers",
]


class RunFields(BaseModel):
    """Fields of a run that the library configs leave to the caller: where it writes and
    how it checkpoints (read by :meth:`~comlrl.algos.recipes.launch.RunOutputs.of`) and
    how its models load."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    output_dir: str = Field(
        "runs/default", description="Where metrics.jsonl, config.yaml and final/ go."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    prompt_format: Literal["auto", "chat", "raw"] = Field(
        "auto",
        description="chat: the tokenizer's chat template on the task's prompt messages; raw: "
        "the prompt text; auto: chat when the tokenizer has a chat template.",
    )
    trust_remote_code: bool = False
    progress: bool = True
    save_every: int = Field(
        0,
        ge=0,
        description="Step checkpoint every N steps and at the last; 0 = only on Ctrl-C or when a step fails.",
    )
    keep_last: int | None = Field(
        None, ge=1, description="Keep the newest N step checkpoints (None = all); final/ stays."
    )


class OneModelRunFields(RunFields):
    """:class:`RunFields` of a one-model recipe (SFT, DPO) plus its model and the
    JSON-lines ``data`` / ``eval_data`` files (checked to exist)."""

    #: the string fields every ``data`` / ``eval_data`` row must have.
    row_keys: ClassVar[tuple[str, ...]] = ()
    models: list[str] = Field(
        default_factory=lambda: [DEFAULT_MODEL],
        description=f"The one model to train (HF id, local path, or {DEFAULT_MODEL!r}).",
    )
    data: str | None = Field(None, description="JSON-lines file of training rows.")
    eval_data: str | None = Field(None, description="JSON-lines file of held-out rows.")

    @model_validator(mode="after")
    def _one_model_and_data(self) -> OneModelRunFields:
        if len(self.models) != 1:
            raise ValueError(
                f"this recipe trains one model but models lists {len(self.models)}: "
                f"{self.models!r}; give one (--model NAME once, or models=[NAME])"
            )
        keys = self.row_keys
        example = json.dumps({k: "..." for k in keys})
        if self.data is None:
            raise ValueError(
                f"needs data=PATH.jsonl, a JSON-lines file with one {example} row per line "
                "(there is no built-in data set for it: the built-in coop_story task has "
                "seeds and a reward, not reference texts)"
            )
        for key, path in (("data", self.data), ("eval_data", self.eval_data)):
            if path is not None and not Path(path).expanduser().is_file():
                raise ValueError(
                    f"{key}={path!r}: no such file; give a JSON-lines file of {example} rows"
                )
        return self


def eval_on_start_follows(data: Any) -> Any:
    """For configs whose evaluation is on by default (``eval_every=40``,
    ``eval_on_start=true``): ``eval_every=0`` without ``eval_on_start`` turns the start
    evaluation off too, so the saved ``config.yaml`` (which ``--resume`` validates again)
    holds a consistent ``eval_on_start: false``."""
    if isinstance(data, dict) and "eval_on_start" not in data:
        try:
            off = int(data.get("eval_every", 1)) == 0
        except (TypeError, ValueError):
            return data  # the field's own check reports it
        if off:
            return {**data, "eval_on_start": False}
    return data


@dataclass(frozen=True)
class RunOutputs:
    """Where a recipe's run writes, how its loop checkpoints and reports, and what it
    continues: the one outputs/loop-settings argument every ``run_*`` function takes
    (``run_marlhf(config, outputs)``). :meth:`of` reads it from a run config's fields of
    the same names; a ``run_*`` function given none uses ``RunOutputs.of(config)``.

    Attributes:
        output_dir: the run's folder: ``config.yaml``, ``metrics.jsonl`` (a row per step),
            ``eval.jsonl``, ``checkpoints/step-*``, ``final/`` (Hugging Face format).
        save_every: a step checkpoint every this many steps and at the last; 0: only on
            Ctrl-C or when a step fails.
        keep_last: keep the newest this many step checkpoints (``None``: all).
        progress: show a progress bar.
        report_to: where metrics go besides ``metrics.jsonl`` (``tensorboard``, ``wandb``).
        wandb_project: the W&B project (``report_to`` wandb).
        reward_curve: write ``output_dir/reward_curve.png`` at the end.
        resume_from: a step checkpoint of this run to continue from (``None``: a fresh
            run); :meth:`of` with ``resume=True`` picks the newest in ``output_dir``.
        overwrite: a fresh run into an ``output_dir`` that holds another run deletes that
            run's outputs (once the models have loaded, so a failed load deletes nothing);
            ``False``: the run refuses to start (:class:`ConfigError`).
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
        """The outputs of ``config`` (a run config: its ``output_dir``, ``save_every``,
        ``keep_last``, ``progress`` and, where it has them, ``report_to``,
        ``wandb_project``, ``reward_curve``); ``resume=True`` continues from the newest
        step checkpoint in ``output_dir``.

        Raises:
            ConfigError: ``resume=True`` and ``output_dir`` has no complete step checkpoint.
        """
        if resume and resume_from is None:
            from comlrl.algos.training.run.checkpoint import latest_checkpoint

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

    def config_fields(self) -> dict[str, Any]:
        """These outputs as run-config fields (``output_dir`` a string)."""
        return {
            "output_dir": str(self.output_dir),
            "save_every": self.save_every,
            "keep_last": self.keep_last,
            "progress": self.progress,
            "report_to": list(self.report_to),
            "wandb_project": self.wandb_project,
            "reward_curve": self.reward_curve,
        }

    def apply(self, config: Any) -> Any:
        """``config`` with these outputs in its fields of the same names (a copy; the
        same object when nothing differs), for trainers that read them from their config."""
        update = {
            k: v
            for k, v in self.config_fields().items()
            if k in type(config).model_fields and getattr(config, k) != v
        }
        return config.model_copy(update=update) if update else config

    def check_folder(self) -> None:
        """Refuse a fresh run into an ``output_dir`` that holds another run, unless
        :attr:`overwrite`.

        Raises:
            ConfigError: naming what the folder holds and the ways out (resume it, start
                over, or another folder).
        """
        from comlrl.algos.training.run.checkpoint import latest_checkpoint
        from comlrl.algos.training.run.lifecycle import existing_run_outputs

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

    def loop_arguments(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The loop arguments of the preference recipes' ``train_*`` functions and
        trainers (``output_dir``, ``save_every``, ``keep_last``, ``record``,
        ``progress``); the resume is the caller's."""
        return {
            "output_dir": self.output_dir,
            "save_every": self.save_every,
            "keep_last": self.keep_last,
            "record": dict(record),
            "progress": self.progress,
        }


@dataclass(frozen=True)
class RunResult:
    """What a recipe's run returns.

    Attributes:
        history: the metrics rows of the steps run here (as in ``metrics.jsonl``).
        summary: one closing line (steps, the reward or loss first -> last quarter, where
            the outputs are).
        output_dir: the run's folder.
    """

    history: list[dict[str, float]]
    summary: str
    output_dir: Path


@contextlib.contextmanager
def setup_errors() -> Iterator[None]:
    """Around a run's set-up (models load, trainer builds, checkpoint read): an
    ``OSError`` or ``ValueError`` there is bad input, raised again as
    :class:`ConfigError` with the same message (so ``comlrl train`` reports it and exits
    2); errors in training keep their type and traceback."""
    try:
        yield
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


def preflight(
    config: Any, model_names: Sequence[str], *, refuse_tools: str | None = None
) -> tuple[Any, list[Mapping[str, Any]]]:
    """What a task run checks before any model loads: the extras ``config.report_to``
    needs, the ``model_names`` it will load (agents, reward model, comparators), and the
    task (:func:`~comlrl.algos.training.config.task_setup.prepare_task` on ``config``, or, for a
    config that is not a :class:`~comlrl.algos.training.config.rl.TrainConfig` (MADPO's), on
    its ``models``, ``num_agents`` and ``task``). Returns ``(task, training examples)``.

    ``refuse_tools`` names a recipe that cannot run tool calls inside a turn (its
    rollouts do not go through :func:`comlrl.algos.rollout.tree.rollout`'s tool loop, or
    its loss has no mask for observations): a task whose agents have tools is refused.

    Raises:
        ConfigError: a missing extra, an unusable model name, a task that does not fit,
            or a task with tools for a recipe that refuses them.
    """
    from comlrl.algos.training.config.rl import TrainConfig
    from comlrl.algos.training.config.task_setup import check_model_names, prepare_task
    from comlrl.algos.training.run.reporting import check_report_to

    check_report_to(config.report_to)
    check_model_names(list(model_names))
    if not isinstance(config, TrainConfig):
        config = TrainConfig(models=config.models, num_agents=config.num_agents, task=config.task)
    task, examples = prepare_task(config)
    if refuse_tools is not None:
        with_tools = [a for a in range(int(task.num_agents)) if task.tools(a)]
        if with_tools:
            task.close()
            raise ConfigError(
                f"algo={refuse_tools} cannot train agents that call tools inside a turn, and task "
                f"{config.task.name!r} gives tools to agent(s) {with_tools}. Use a policy-"
                "gradient recipe (magrpo, mareinforce, marloo, maremax, iac, maac), or a task "
                "without tools."
            )
    return task, examples


def check_offline(config: Any) -> None:
    """The checks a run makes of ``config`` before it loads a model, without loading
    anything (``comlrl train --print-config``): reporting extras, model names, the task and
    its options against the config (:func:`comlrl.algos.training.config.task_setup.build_task`);
    nothing is downloaded, no example is loaded and no reward worker is contacted.

    Raises:
        ConfigError: what ``comlrl train`` would refuse.
    """
    from comlrl.algos.training.config.rl import TrainConfig
    from comlrl.algos.training.config.task import TaskConfig
    from comlrl.algos.training.config.task_setup import build_checked_task, check_model_names
    from comlrl.algos.training.run.reporting import check_report_to

    if hasattr(config, "report_to"):
        check_report_to(config.report_to)
    models = getattr(config, "models", None)
    if isinstance(models, list):
        check_model_names([str(m) for m in models])
    task = getattr(config, "task", None)
    if isinstance(task, TaskConfig) and hasattr(config, "num_agents"):
        as_train = (
            config
            if isinstance(config, TrainConfig)
            else TrainConfig(models=config.models, num_agents=config.num_agents, task=task)
        )
        build_checked_task(as_train).close()


def announce(config: Any, num_examples: int, what: str, who: str | None = None) -> None:
    """The run's header on stderr: ``comlrl: <who> (<models>) on <task> (<n> examples),
    <what>; outputs in <output_dir>/`` (``who`` defaults to ``<num_agents> agents``), then,
    for a :class:`~comlrl.algos.training.config.rl.TrainConfig`, which defaults applied and
    why (:meth:`~comlrl.algos.training.config.rl.TrainConfig.model_defaults`)."""
    who = who if who is not None else f"{config.num_agents} agents"
    print(
        f"comlrl: {who} ({', '.join(config.models)}) on {config.task.name} "
        f"({num_examples} examples), {what}; outputs in {config.output_dir}/",
        file=sys.stderr,
    )
    defaults = getattr(config, "model_defaults", None)
    if callable(defaults):  # TrainConfig: which defaults applied and why
        print(f"comlrl: {defaults().header()}", file=sys.stderr)


def load_eval_split(task: Any, split: str, limit: int | None = None) -> list[Mapping[str, Any]]:
    """The first ``limit`` (``None``: all) examples of ``task``'s ``split``.

    Raises:
        ConfigError: the task cannot load ``split`` (naming ``eval_split`` and why).
    """
    try:
        return list(task.load(split))[:limit]
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(f"eval_split={split!r}: {exc}") from None


def load_agents(config: Any, count: int | None = None, **options: Any) -> list[Any]:
    """``count`` (default ``config.num_agents``) :class:`~comlrl.algos.rollout.agent.HFAgent` s
    named ``agent_<i>``: agent ``i`` loads ``config.model_for(i)`` with seed
    ``config.seed + i``; ``options`` go to every agent (``prompt_format``, generation
    options). Agents given the same ``.gguf`` file share one read of it: the file is
    dequantized once and the other agents get deep copies of that model and tokenizer
    (reading SmolLM2-135M's GGUF takes ~19 s on one core, a copy 0.25 s); every agent still
    has its own weights.

    Raises:
        OSError, ValueError: a model does not load.
    """
    import copy

    from comlrl.algos.models.loading import is_gguf_file
    from comlrl.algos.rollout.agent import HFAgent

    first: dict[str, tuple[Any, Any]] = {}  # a GGUF path's first load, still untouched
    loaded = []
    for i in range(config.num_agents if count is None else count):
        name = config.model_for(i)
        if name in first:
            loaded.append(copy.deepcopy(first[name]))
            continue
        pair = load_model(name, config, config.seed + i)
        if is_gguf_file(name):
            first[name] = pair
        loaded.append(pair)
    # agents are built only once every model is loaded, so no copy sees an agent's changes
    return [HFAgent(*pair, name=f"agent_{i}", **options) for i, pair in enumerate(loaded)]


def resuming_line(out: Any, step: int, num_steps: int, source: Any) -> str:
    """``resuming <out> at step <step> of <num_steps> (from <checkpoint>)``: what a run
    continued with ``--resume`` prints first."""
    return f"resuming {out} at step {step} of {num_steps} (from {source})"


def read_jsonl_rows(path: str | Path, keys: Sequence[str], what: str) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file, each checked to hold string ``keys``.

    Blank lines are skipped; every other line must be a JSON object.

    Raises:
        ConfigError: the file cannot be read, a line is not a JSON object (with its line
            number), a row lacks one of ``keys`` or it is not a string, or no rows.
    """
    p = Path(path).expanduser()
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} data {str(p)!r}: {exc}") from None
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{p}:{number}: not valid JSON ({exc.msg}); write one JSON object per line"
            ) from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"{p}:{number}: a JSON {type(row).__name__}, expected an object with keys {list(keys)}"
            )
        missing = [k for k in keys if not isinstance(row.get(k), str)]
        if missing:
            raise ConfigError(
                f"{p}:{number}: lacks string field(s) {missing} (has {sorted(row)}); every "
                f"{what} row needs {list(keys)}"
            )
        rows.append(row)
    if not rows:
        raise ConfigError(
            f"{what} data {str(p)!r} has no rows; give one JSON object per line with {list(keys)}"
        )
    return rows


def start_outputs(config: Any, algo: str, outputs: RunOutputs) -> Path:
    """Clear an earlier run's outputs (``outputs.overwrite``) and write ``config.yaml``
    (``config`` with ``algo``), before the recipe's loop starts. Returns the folder."""
    import yaml
    from comlrl.algos.training.run.lifecycle import clear_run_outputs

    out = outputs.output_dir
    if outputs.overwrite and outputs.resume_from is None:
        clear_run_outputs(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(
        yaml.safe_dump({"algo": algo, **config.model_dump()}, sort_keys=False)
    )
    return out


def loss_summary(history: Sequence[Mapping[str, Any]], out: Path, key: str = "loss") -> str:
    """``done: N steps, <key> first quarter a -> last quarter b (+d); outputs in ...``."""
    from comlrl.algos.training.run.summary import quarter_means

    where = f"outputs in {out}/ (metrics.jsonl, final/agent_*)"
    if not history:
        return f"done: 0 steps; {where}"
    first, last = quarter_means([float(r[key]) for r in history])
    n = len(history)
    return (
        f"done: {n} step{'s' if n != 1 else ''}, {key} first quarter {first:.3f} -> last "
        f"quarter {last:.3f} ({last - first:+.3f}); {where}"
    )


def quiet_transformers() -> None:
    """One progress bar (ours), not one per model load and save."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_model(name: str, config: Any, seed: int) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``name`` with ``config.dtype`` and
    ``config.trust_remote_code``, initialised (a built-in model) with ``seed``.

    Raises:
        OSError, ValueError: the model does not load.
    """
    from comlrl.algos.models.loading import load_model_and_tokenizer

    return load_model_and_tokenizer(
        name, seed=seed, dtype=config.dtype, trust_remote_code=config.trust_remote_code
    )
