"""A run's task, built and checked before any model is loaded, and what is known about
the registered tasks.

:func:`prepare_task` builds the configured task, checks that it fits the config (number
of agents, turns) and loads its examples, so a wrong ``num_agents``, a rejected task
option or an empty dataset fails in a second with a message instead of after the models
load (or as a traceback). :func:`task_options` reads a registered task's constructor
options and their defaults (``comlrl tasks``, ``comlrl train --print-config``).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from comlrl.algos.training.config.rl import ConfigError, RLConfig
from comlrl.algos.training.config.task import TaskConfig
from comlrl.core.task import ENVS_INSTALL, REGISTER_TASK

__all__ = [
    "TaskInfo",
    "build_checked_task",
    "build_task",
    "check_model_names",
    "check_task_fits",
    "describe_tasks",
    "prepare_task",
    "task_info",
    "task_options",
]

_GROUP = "comlrl.tasks"


class TaskInfo:
    """A registered task suite: its name, entry point, one-line summary and options.

    Attributes:
        name: registered name.
        target: ``"module:attr"`` of its entry point.
        summary: first line of its docstring.
        options: constructor options in order, ``{name: default}`` (``inspect.Parameter.empty``
            for a required one).
        num_agents: agents the task is written for (``None`` when unknown).
        data: where its examples come from (the class's ``data_source`` string, e.g. a
            local file it needs); ``""`` when the suite does not say.
    """

    def __init__(
        self,
        name: str,
        target: str,
        summary: str,
        options: dict[str, Any],
        num_agents: int | None,
        data: str = "",
    ) -> None:
        self.name = name
        self.target = target
        self.summary = summary
        self.options = options
        self.num_agents = num_agents
        self.data = data

    def signature(self) -> str:
        """``"limit=None, min_words=10"``; a required option shows as its bare name."""
        return ", ".join(
            k if v is inspect.Parameter.empty else f"{k}={v!r}" for k, v in self.options.items()
        )


def task_options(factory: Any) -> dict[str, Any]:
    """``{option: default}`` of a task class's (or factory's) keyword options, in order."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    return {
        p.name: p.default
        for p in params.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }


def task_info(name: str) -> TaskInfo:
    """Describe the task registered as ``name`` (loads its module, builds nothing).

    Raises:
        ConfigError: no task is registered under ``name`` (with close names).
    """
    for ep in metadata.entry_points(group=_GROUP):
        if ep.name == name:
            factory = ep.load()
            doc = inspect.getdoc(factory) or ""
            agents = getattr(factory, "num_agents", None)
            data = getattr(factory, "data_source", "")
            return TaskInfo(
                name=name,
                target=ep.value,
                summary=doc.splitlines()[0] if doc else "",
                options=task_options(factory),
                num_agents=agents if isinstance(agents, int) else None,
                data=data if isinstance(data, str) else "",
            )
    raise ConfigError(_unknown_task(name))


def _unknown_task(name: str) -> str:
    known = sorted(ep.name for ep in metadata.entry_points(group=_GROUP))
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
    return (
        f"no task named {name!r} is registered (registered: {known or 'none'}){hint} "
        f"Install the suite that provides it ({ENVS_INSTALL}); {REGISTER_TASK}."
    )


def describe_tasks() -> list[TaskInfo]:
    """Every registered task, by name (one that fails to import shows the error as summary)."""
    out = []
    for ep in sorted(metadata.entry_points(group=_GROUP), key=lambda e: e.name):
        try:
            out.append(task_info(ep.name))
        except Exception as exc:  # a broken suite must not hide the others
            out.append(TaskInfo(ep.name, ep.value, f"(cannot import: {exc})", {}, None))
    return out


def check_model_names(models: list[str]) -> None:
    """Check the names that can be checked without loading: built-in names and local paths.

    Raises:
        ConfigError: an unknown ``builtin:`` name; a path-like name (``/``, ``./``,
            ``../``, ``~``, more than one ``/``) that is neither a directory nor a ``.gguf``
            file; a ``.gguf`` file without the ``gguf`` package installed.
    """
    import importlib.util
    import os

    from comlrl.algos.models.loading import BUILTIN_MODELS, is_gguf_file, looks_like_path

    for name in dict.fromkeys(models):
        if name.startswith("builtin:") and name not in BUILTIN_MODELS:
            raise ConfigError(
                f"unknown built-in model {name!r}; choose one of {sorted(BUILTIN_MODELS)}"
            )
        if is_gguf_file(name):
            missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
            if missing:
                # transformers' GGUF reader imports gguf, and its loader refuses GGUF files
                # without accelerate
                raise ConfigError(
                    f"model {name!r} is a GGUF file, which needs the `gguf` package and "
                    f"`accelerate` (missing: {', '.join(missing)}): "
                    f"`pip install 'comlrl-algos[gguf]'` (or `pip install {' '.join(missing)}`)."
                )
            continue
        if looks_like_path(name) and not os.path.isdir(os.path.expanduser(name)):
            raise ConfigError(
                f"could not load model {name!r}: no such directory or .gguf file. Pass the "
                "folder that holds config.json and the weights (save_pretrained format), a "
                ".gguf file, or a Hugging Face Hub id such as 'Qwen/Qwen2.5-0.5B'."
            )


def check_task_fits(config: RLConfig, task: Any) -> None:
    """Check the task's agent and turn counts against the config.

    Raises:
        ConfigError: ``task.num_agents != config.num_agents``, or ``config.num_turns`` above
            the task's ``max_turns``.
    """
    n = getattr(task, "num_agents", None)
    if isinstance(n, int) and n != config.num_agents:
        raise ConfigError(
            f"task {config.task.name!r} is written for {n} agents but num_agents="
            f"{config.num_agents}; set num_agents={n} (and one model, or {n} models)."
        )
    max_turns = getattr(task, "max_turns", None)
    if isinstance(max_turns, int) and config.num_turns > max_turns:
        try:
            options = task_info(config.task.name).options
        except ConfigError:
            options = {}
        if "max_turns" in options:  # the task's own limit is an option: raise it there
            raise ConfigError(
                f"num_turns={config.num_turns} but task {config.task.name!r} stops after "
                f"task.kwargs.max_turns={max_turns} turn(s); set task.kwargs.max_turns="
                f"{config.num_turns} (or lower num_turns to {max_turns})."
            )
        raise ConfigError(
            f"num_turns={config.num_turns} but task {config.task.name!r} supports at most "
            f"{max_turns} turn(s); lower num_turns or pick a multi-turn task."
        )


def prepare_task(config: RLConfig) -> tuple[Any, list[Mapping[str, Any]]]:
    """Build ``config.task``, check it against the config, and load its examples.

    Returns:
        ``(task, examples)``; the caller closes the task.

    Raises:
        ConfigError: an unknown task, options the task rejects (with its options and
            defaults), a task that does not fit the config (:func:`check_task_fits`), an
            unknown split, no examples, or task servers (``task.remote``) that do not
            answer or serve another task.
    """
    task = build_checked_task(config)
    name, kwargs = config.task.name, config.task.kwargs
    try:
        try:
            examples = list(task.load(config.task.split))
        except (ValueError, KeyError, OSError) as exc:
            raise ConfigError(
                f"task {name!r} could not load split {config.task.split!r} "
                f"(task.kwargs={kwargs!r}): {exc}"
            ) from None
        if not examples:
            raise ConfigError(
                f"task {name!r} has no examples in split {config.task.split!r} with "
                f"task.kwargs={kwargs!r}; nothing to train on. Check task.split, "
                "task.kwargs.limit and the data path."
            )
    except BaseException:
        task.close()
        raise
    return task, examples


def build_checked_task(config: RLConfig) -> Any:
    """Build ``config.task`` (:func:`build_task`) and check it against the config
    (:func:`check_task_fits`), loading no examples (what ``--print-config`` checks).

    Returns:
        the task; the caller closes it.

    Raises:
        ConfigError: as :func:`build_task`, or a task that does not fit the config.
    """
    task = build_task(config.task)
    try:
        check_task_fits(config, task)
    except BaseException:
        task.close()
        raise
    return task


def build_task(task_config: TaskConfig) -> Any:
    """The task ``task_config`` names: one registered task built with its ``kwargs``; with
    ``mixture``, a :class:`~comlrl.algos.rollout.mixture.MixtureTask` of its entries; with
    ``remote``, a :class:`comlrl.envs.remote.RemoteTask` on those task servers.

    Raises:
        ConfigError: an unknown task, options a task rejects (with its options and
            defaults), mixture tasks for different numbers of agents or whose agents have
            other tools, or task servers that do not answer or serve another task or
            version (or comlrl-envs, which holds their client, is not installed).
    """
    if task_config.remote:
        try:
            from comlrl.envs.remote import RemoteTask
        except ImportError as exc:
            raise ConfigError(f"task.remote needs comlrl-envs ({ENVS_INSTALL}): {exc}") from None
        try:
            return RemoteTask(
                task_config.name,
                task_config.remote,
                kwargs=task_config.kwargs,
                timeout_s=task_config.remote_timeout_s,
            )
        except (ValueError, OSError) as exc:
            raise ConfigError(f"task.remote: {exc}") from None
    if not task_config.mixture:
        return _one_task(task_config.name, task_config.kwargs)
    from comlrl.algos.rollout.mixture import MixtureTask

    tasks: dict[str, Any] = {}
    try:
        for entry in task_config.mixture:
            where = f"task.mixture entry {entry.key!r} rejected kwargs"
            tasks[entry.key] = _one_task(entry.name, entry.kwargs, where, "kwargs.")
        return MixtureTask(tasks)
    except (ConfigError, ValueError) as exc:
        for task in tasks.values():
            task.close()
        raise ConfigError(str(exc)) from None


def _one_task(
    name: str, kwargs: dict[str, Any], where: str = "", key_prefix: str = "task.kwargs."
) -> Any:
    from comlrl.core import TaskNotFoundError, get_task

    try:
        return get_task(name, **kwargs)
    except TaskNotFoundError:
        raise ConfigError(_unknown_task(name)) from None
    except (TypeError, ValueError, OSError) as exc:
        try:
            info = task_info(name)
            options, known = info.signature(), list(info.options)
        except ConfigError:
            options, known = "?", []
        hints = []
        for key in kwargs:
            if known and key not in known:
                close = difflib.get_close_matches(str(key), known, n=2, cutoff=0.6)
                if close:
                    hints.append(
                        f"{key_prefix}{key}: did you mean "
                        + " or ".join(f"{key_prefix}{c}" for c in close)
                        + "?"
                    )
                else:
                    hints.append(f"{key_prefix}{key}: not an option of {name!r}")
        hint = "".join(f"\n  {h}" for h in hints)
        raise ConfigError(
            f"{where or f'task {name!r} rejected task.kwargs'}={kwargs!r}: {exc}{hint}\n"
            f"  its options: {options}"
        ) from None
