"""The one launcher of every recipe (:func:`launch`): what a run from a config to its final
checkpoint does the same way for every recipe (folder check, the inputs checked before any
model loads, the header, loading the agents, building the recipe: :func:`build_recipe`,
resuming, training with the task closed on every exit, the summary), what it returns
(:class:`RunResult`), and its parts: :func:`preflight` (the task checked before any model
loads), :func:`check_offline` (``--print-config``'s checks), :func:`load_eval_split`,
:func:`load_agents`, :func:`load_model`, :func:`read_jsonl_rows`, :func:`announce`."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from comlrl.algos.training.config.rl import ConfigError
from comlrl.algos.training.run.outputs import RunOutputs

__all__ = [
    "RunResult",
    "Launchable",
    "launch",
    "build_recipe",
    "one_policy_config",
    "setup_errors",
    "preflight",
    "check_offline",
    "announce",
    "resuming_line",
    "load_eval_split",
    "load_agents",
    "load_model",
    "read_jsonl_rows",
    "quiet_transformers",
]


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


def announce(config: Any, outputs: RunOutputs, num_examples: int, what: str, who: str) -> None:
    """The run's header on stderr: ``comlrl: <who> (<models>) on <task or data> (<n>
    examples), <what>; outputs in <output_dir>/``, then, for a
    :class:`~comlrl.algos.training.config.rl.TrainConfig`, which defaults applied and why
    (:meth:`~comlrl.algos.training.config.rl.TrainConfig.model_defaults`)."""
    task = getattr(config, "task", None)
    where = task.name if task is not None else getattr(config, "data", "rows")
    print(
        f"comlrl: {who} ({', '.join(config.models)}) on {where} ({num_examples} examples), "
        f"{what}; outputs in {outputs.output_dir}/",
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


class Launchable(Protocol):
    """What :func:`launch` needs of a recipe class besides its constructor
    (``cls(agents, config, *, task=, environment=, dataset=, eval_dataset=, outputs=,
    record=)``) and the loop's :class:`~comlrl.algos.training.loop.Recipe` methods."""

    @classmethod
    def inputs(cls, config: Any) -> tuple[Any, list[Any], list[Any] | None]:
        """``(task or None, training examples, evaluation examples or None)``, checked
        before any model loads."""
        ...

    @classmethod
    def describe(cls, config: Any) -> str:
        """What the run's header says it does (recipe, steps, batch)."""
        ...

    @classmethod
    def agent_options(cls, config: Any) -> dict[str, Any]:
        """``HFAgent`` keyword arguments of every agent."""
        ...


def build_recipe(
    recipe_cls: Any,
    agents: Sequence[Any],
    config: Any,
    *,
    task: Any = None,
    environment: Any = None,
    examples: Sequence[Mapping[str, Any]] | None = None,
    eval_examples: Sequence[Mapping[str, Any]] | None = None,
    outputs: RunOutputs | None = None,
    record: Mapping[str, Any] | None = None,
) -> Any:
    """The one place a run builds its recipe object: ``recipe_cls`` on ``agents`` and
    ``config`` with the task (or a ready environment), the examples, where it writes and
    what ``config.yaml`` records. ``comlrl train``, ``comlrl eval`` and ``comlrl collect``
    come here.

    Raises:
        ConfigError: as the recipe's constructor.
    """
    where = {"environment": environment} if environment is not None else {"task": task}
    return recipe_cls(
        agents,
        config,
        dataset=examples,
        eval_dataset=eval_examples,
        outputs=outputs,
        record=record,
        **where,
    )


def one_policy_config(config: Any) -> Any:
    """``config`` for the one joint policy of a run with a ``role_format`` (one model plays
    every role): the same settings for one agent, per-role device lists cut to the
    policy's, without ``role_format``."""
    data = config.model_dump(exclude={"role_format"})
    data["num_agents"] = 1
    for key in ("agent_devices", "reference_devices"):
        if isinstance(data.get(key), list):
            data[key] = data[key][:1]
    return type(config).model_validate(data)


def launch(
    recipe_cls: Any, config: Any, outputs: RunOutputs | None = None, *, algo: str | None = None
) -> RunResult:
    """A recipe's run from its config to its final checkpoint, what ``comlrl train
    algo=NAME`` runs and what a Python user calls the same way: check the folder, check the
    inputs before any model loads (:meth:`Launchable.inputs`), announce the run, load the
    agents, build the recipe (:func:`build_recipe`), resume it (``outputs.resume_from``),
    train it with the task closed on every exit, and return its rows and summary line.

    With ``config.role_format`` set one model plays every role: one agent loads, the
    recipe trains it on the task's joint prompt and reward
    (:func:`~comlrl.algos.rollout.joint_policy.joint_environment`) with
    :func:`one_policy_config`, and ``config.yaml`` records the config as given. ``algo``
    (the registry's name) goes into ``config.yaml``.

    Raises:
        ConfigError: a bad config, task, model name, a model that does not load, a folder
            that holds another run (without ``outputs.overwrite``), before training.
        CheckpointError: ``outputs.resume_from`` does not fit the run.
        TrainingInterrupted: Ctrl-C or SIGTERM, after the step checkpoint.
        RewardFunctionError: the reward function failed (the last completed step is
            checkpointed).
    """
    import torch
    from comlrl.algos.models.ranks import is_main, rank_and_world
    from comlrl.algos.rollout.joint_policy import joint_environment
    from comlrl.algos.training.run.checkpoint import CheckpointError
    from comlrl.algos.training.run.lifecycle import run_record

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    main = is_main()
    if main:
        outputs.check_folder()
    roles = getattr(config, "role_format", None)
    task, examples, eval_examples = recipe_cls.inputs(config)
    recipe = None
    try:
        quiet_transformers()
        roles_count = getattr(config, "num_agents", len(config.models))
        n_models = 1 if roles is not None else roles_count
        if main:
            who = f"{roles_count} agent{'s' if roles_count != 1 else ''}"
            if n_models != roles_count:
                who = f"1 policy for {roles_count} roles"
            announce(config, outputs, len(examples), recipe_cls.describe(config), who)
            world = rank_and_world()[1]
            if world > 1:
                print(
                    f"comlrl: data parallel over {world} processes ({config.data_parallel}), "
                    f"{config.batch_size // world} prompts each",
                    file=sys.stderr,
                )
        torch.manual_seed(config.seed)
        with setup_errors():
            agents = load_agents(config, n_models, **recipe_cls.agent_options(config))
            record = run_record(config, algo=algo, task=task)
            recipe = build_recipe(
                recipe_cls,
                agents,
                one_policy_config(config) if roles is not None else config,
                task=task if roles is None else None,
                environment=(
                    joint_environment(task, config.num_agents, roles) if roles is not None else None
                ),
                examples=examples,
                eval_examples=eval_examples,
                outputs=outputs,
                record=record,
            )
        if outputs.resume_from is not None:
            try:
                step = recipe.resume(outputs.resume_from)
            except (CheckpointError, NotImplementedError) as exc:
                raise CheckpointError(f"cannot resume from {outputs.resume_from}: {exc}") from None
            num_steps = recipe.schedule().num_steps
            if main:
                print(resuming_line(outputs.output_dir, step, num_steps, outputs.resume_from))
            if step >= num_steps:
                return RunResult(
                    [],
                    f"nothing to do: the run already has {step} steps; pass num_steps=N to train "
                    "longer",
                    outputs.output_dir,
                )
        elif main:
            outputs.clear_earlier_run()  # now that the models loaded
        history = recipe.train()
    finally:
        if recipe is not None:
            recipe.close()
        if task is not None:
            task.close()
    return RunResult(history, recipe.summary(history), outputs.output_dir)
