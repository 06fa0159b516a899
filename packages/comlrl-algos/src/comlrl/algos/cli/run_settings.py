"""The settings ``comlrl eval`` and ``comlrl collect`` sample trained agents with.

Agents saved in a run folder (``runs/x/final/agent_0``, ``runs/x/checkpoints/step-N/agent_0``)
are sampled with their run's own ``config.yaml`` (:func:`find_run_config`), so the task and
the sampling settings match training; ``--config FILE`` names another file.
:func:`sampling_config` turns that file and the command's ``key=value`` overrides into the
:class:`~comlrl.algos.training.config.rl.TrainConfig` that both commands sample with:

- the keys of the run's recipe that sampling has no use for (an IAC/MAAC run's critic
  settings, a MADPO or MARLHF run's preference settings) are left out, after checking that
  they are keys of that recipe (a misspelt key still fails, naming it); a recipe whose
  evaluation always samples (MADPO: ``eval_num_samples`` joint actions per prompt, no
  ``eval_greedy`` key) is evaluated sampled, as its run was, and a setting the recipe may
  leave unset that sampling needs (MADPO's ``eval_split``) takes its default;
- a LoRA run's agents (adapter folders) on one shared base are sampled as they trained: the
  base loaded once with the run's ``lora`` section, each agent's adapter loaded into it
  (:func:`load_adapters`), so memory is one base plus the adapters; otherwise (adapters on
  their own bases, or ``--model`` naming other models) the ``lora`` section is left out and
  each folder loads as its base with the adapter merged in
  (:func:`~comlrl.algos.models.loading.load_adapter_folder`);
- when the overrides name another task than the run's (``task.name=mbpp``), the run's
  task settings (``task.kwargs``, ``task.split``, ``task.remote``) are left out, and a line
  on stderr names them: given to another task they would load the run's data file, or fail
  on an option that task lacks. Sampling settings (``max_new_tokens``, ``eval_*``, ...)
  are kept: they belong to the agents.
"""

from __future__ import annotations

import copy
import json
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ONE_MODEL_RECIPES", "find_run_config", "load_adapters", "sampling_config"]

#: Recipes that train one model on a data file: their runs' configs name no task or team.
ONE_MODEL_RECIPES = ("sft", "dpo")


def find_run_config(model: str | Path) -> Path | None:
    """The ``config.yaml`` of the run a checkpoint folder belongs to, looking up to 3 levels up;
    ``None`` for a run of a one-model recipe (``algo: sft`` / ``dpo``: a model fine-tuned on
    rows, e.g. the SFT step of SFT-then-RL), whose settings are not a team's."""
    import yaml

    here = Path(model).resolve()
    for parent in list(here.parents)[:3]:
        if (parent / "config.yaml").is_file():
            try:
                data = yaml.safe_load((parent / "config.yaml").read_text())
            except (OSError, yaml.YAMLError):
                data = None
            if isinstance(data, dict) and data.get("algo") in ONE_MODEL_RECIPES:
                return None
            return parent / "config.yaml"
    return None


def sampling_config(
    models: Sequence[str], config_file: str | None, overrides: Sequence[str]
) -> tuple[Path | None, Any, list[str] | None]:
    """The config file used (``None``: the defaults), the validated
    :class:`~comlrl.algos.training.config.rl.TrainConfig` to sample ``models`` with, and the
    adapter folders to load into its agents (:func:`load_adapters`; ``None``: the agents
    are ``models`` as they load).

    Args:
        models: one model per agent (checkpoint folders, Hub ids, ``.gguf`` files); the
            first one's run folder gives the config when ``config_file`` is ``None``.
        config_file: ``--config``, or ``None``.
        overrides: the command's ``key=value`` overrides.

    Raises:
        ConfigError: an unreadable file, a malformed override, an unknown ``algo`` or key,
            or an invalid value (the message names it).
    """
    from comlrl.algos.recipes.registry import resolve_recipe
    from comlrl.algos.training.config.rl import (
        ConfigError,
        TrainConfig,
        apply_overrides,
        build_config,
        load_config_data,
    )

    config_path = Path(config_file) if config_file else find_run_config(models[0])
    data = load_config_data(config_path)
    if "algo" in data:  # a run's config: settings of its recipe that sampling does not read
        recipe, data = resolve_recipe(data)
        sampled = set(TrainConfig.model_fields)
        moved = getattr(recipe.config, "moved_keys", {})  # a former name of a top-level key
        for old, new in moved.items():
            if old in data and "." not in new and new not in data:
                data[new] = data.pop(old)
        known = set(recipe.valid_keys()) | set(moved)
        unknown = sorted(k for k in data if k not in sampled and k not in known)
        if unknown:
            raise ConfigError(
                f"{config_path}: {', '.join(unknown)} is not a setting of algo={recipe.name}; "
                "fix or drop it"
            )
        fields = TrainConfig.model_fields
        # a None of the recipe's where sampling needs a value (MADPO's eval_split=None: no
        # evaluation while training) takes the default
        data = {
            k: v
            for k, v in data.items()
            if k in sampled and (v is not None or _takes_none(fields[k].annotation))
        }
        if "eval_greedy" not in known and int(data.get("eval_num_samples", 1)) > 1:
            data["eval_greedy"] = False  # its evaluation samples (MADPO): as the run did
    base = _shared_base(models, data)
    if base is None:  # whole models (an adapter folder: its base with the adapter merged)
        data.pop("lora", None)
    run_task = copy.deepcopy(data.get("task", {}))  # the overrides below edit it in place
    extra = ["models=" + json.dumps([base] if base is not None else list(models))]
    if len(models) > 1:
        extra.append(f"num_agents={len(models)}")
    data = apply_overrides(data, [*overrides, *extra])
    if config_file is None and config_path is not None:
        data = _own_task_settings(data, run_task, overrides)
    return config_path, build_config(data), list(models) if base is not None else None


def _shared_base(models: Sequence[str], data: dict[str, Any]) -> str | None:
    """The one base of ``models`` when they are LoRA adapter folders that a run with
    ``lora.shared_base`` (the settings ``data``) trained on it: each records that base with
    the run's seed (agent 0's, which the shared base was). ``None`` otherwise."""
    from comlrl.algos.models.loading import is_adapter_folder
    from comlrl.algos.models.lora_policy import BASE_RECORD
    from comlrl.algos.training.config.rl import TrainConfig

    lora = data.get("lora")
    if not isinstance(lora, dict) or not lora.get("shared_base", True):
        return None
    records = []
    for model in models:
        if not is_adapter_folder(model):
            return None
        try:
            records.append(json.loads((Path(model).expanduser() / BASE_RECORD).read_text()))
        except (OSError, ValueError):
            return None
    first = records[0]
    if not isinstance(first, dict) or any(r != first for r in records[1:]):
        return None
    seed = data.get("seed", TrainConfig.model_fields["seed"].default)
    if first.get("seed") != seed or not isinstance(first.get("model"), str):
        return None
    return str(first["model"])


def load_adapters(agents: Sequence[Any], adapters: Sequence[str] | None) -> None:
    """Load agent ``i``'s adapter from ``adapters[i]`` into its LoRA policy, in place (the
    agents of a :func:`sampling_config` with adapters, once the recipe attached theirs);
    nothing when ``adapters`` is ``None``.

    Raises:
        ValueError: an adapter that does not fit its agent (another rank or target
            modules), or an agent that is not a LoRA policy (the message names the folder).
    """
    if adapters is None:
        return
    from comlrl.algos.models.lora import is_lora_policy
    from comlrl.algos.training.run.checkpoint import load_agent_weights

    for agent, folder in zip(agents, adapters, strict=True):
        if not is_lora_policy(agent.model):
            raise ValueError(f"{folder} is a LoRA adapter but its agent has no adapter")
        load_agent_weights(agent.model, folder)


def _takes_none(annotation: Any) -> bool:
    """Whether a field of this type annotation accepts ``None``."""
    return annotation is None or type(None) in typing.get_args(annotation)


def _task_names(task: Any) -> tuple[Any, ...]:
    """The tasks a ``task`` section names: its ``mixture`` entries' labels or names, else
    its name."""
    if not isinstance(task, dict):
        return (task,)
    mixture = task.get("mixture") or []
    names = tuple(m.get("label") or m.get("name") if isinstance(m, dict) else m for m in mixture)
    return names or (task.get("name", "coop_story"),)


def _own_task_settings(
    data: dict[str, Any], run_task: Any, overrides: Sequence[str]
) -> dict[str, Any]:
    """``data`` (the run's settings with the overrides applied), with the run's task
    settings left out when the overrides name another task than ``run_task`` (the run's
    ``task`` section): the new task gets only the ``task.*`` keys the overrides set."""
    from comlrl.algos.training.config.rl import apply_overrides
    from comlrl.algos.training.config.task import TaskConfig

    task_overrides = [o for o in overrides if o.split("=", 1)[0].strip().split(".")[0] == "task"]
    own = apply_overrides({}, task_overrides).get("task", {})
    if not isinstance(own, dict) or not isinstance(run_task, dict):
        return data  # not a mapping: build_config names the bad value
    if not {"name", "mixture"} & own.keys() or _task_names(own) == _task_names(run_task):
        return data  # the run's own task, its settings with the overrides applied
    defaults = TaskConfig().model_dump()
    left_out = {
        k: v
        for k, v in run_task.items()
        if k not in ("name", "mixture") and v != own.get(k, defaults.get(k))
    }
    if left_out:
        print(
            f"comlrl: sampling on {'+'.join(map(str, _task_names(own)))!r}, not the run's "
            f"task {'+'.join(map(str, _task_names(run_task)))!r}: the run's task settings "
            f"{left_out!r} are left out (set task.<key>=... to give the new task its own)",
            file=sys.stderr,
        )
    return {**data, "task": own}
