"""End-to-end command-line runs of the registered recipes (:mod:`.registry`).

Each ``run_*`` function takes its recipe's validated config and a :class:`RunRequest` and
returns the exit code of ``comlrl train``: 0 done, 1 the reward function failed, 2 a bad
config or data (reported before any model loads where it can be), 130 interrupted. Each
one checks the task or data, loads the agents or model, trains through the library's own
recipe or trainer, writes one row per step to ``output_dir/metrics.jsonl`` and the final
weights to ``output_dir/final/`` (Hugging Face format, loadable by ``comlrl eval`` and
``from_pretrained``), and prints a closing summary line.

The ``*RunConfig`` classes (:mod:`.run_configs`) are the library configs plus what a
command-line run needs; :mod:`.run_steps` has what every run shares and
:mod:`.marlhf_run` MARLHF's run. Every name is importable from here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from comlrl.algos.cli.marlhf_run import run_marlhf
from comlrl.algos.cli.run_configs import DPORunConfig, MADPORunConfig, MARLHFRunConfig, SFTRunConfig
from comlrl.algos.cli.run_steps import (
    RunRequest,
    _err,
    _load,
    _loss_summary,
    _quiet_transformers,
    _start_outputs,
    announce,
    load_agents,
    load_eval_split,
    preflight,
    read_jsonl_rows,
    resuming_line,
    stopped,
)
from comlrl.algos.training.config import ConfigError, TrainConfig

__all__ = [
    "RunRequest",
    "SFTRunConfig",
    "DPORunConfig",
    "MADPORunConfig",
    "MARLHFRunConfig",
    "read_jsonl_rows",
    "run_policy_gradient",
    "run_group_baseline",
    "run_iac",
    "run_maac",
    "run_madpo",
    "run_marlhf",
    "run_sft",
    "run_dpo",
]


# --------------------------------------------------------------------------- RL recipes


def run_group_baseline(config: TrainConfig, request: RunRequest) -> int:
    """``algo=magrpo`` / ``mareinforce`` / ``marloo`` / ``maremax``:
    :class:`~comlrl.algos.MultiAgentTrainer` with ``config.estimator``."""
    from comlrl.algos.recipes.group_baseline.trainer import MultiAgentTrainer

    return run_policy_gradient(config, request, MultiAgentTrainer, f"estimator {config.estimator}")


def run_iac(config: Any, request: RunRequest) -> int:
    """``algo=iac``: :class:`~comlrl.algos.IACTrainer` (a critic per agent)."""
    from comlrl.algos.recipes.actor_critic.trainer import IACTrainer

    return run_policy_gradient(
        config, request, IACTrainer, f"IAC ({config.critic_mode} {config.critic_type}-critics)"
    )


def run_maac(config: Any, request: RunRequest) -> int:
    """``algo=maac``: :class:`~comlrl.algos.MAACTrainer` (one centralised critic)."""
    from comlrl.algos.recipes.actor_critic.trainer import MAACTrainer

    return run_policy_gradient(
        config, request, MAACTrainer, f"MAAC (centralised {config.critic_type}-critic)"
    )


def run_policy_gradient(
    config: TrainConfig,
    request: RunRequest,
    trainer_cls: Callable[..., Any],
    label: str,
    *,
    num_models: int | None = None,
    refuse_tools: str | None = None,
) -> int:
    """Task -> agents -> trainer -> train -> summary, the run ``comlrl train`` has always
    made (for the actor-critic trainers too: the same task, agents and outputs).
    ``trainer_cls(agents, config, task=, dataset=)`` builds the trainer; ``num_models``
    agents are loaded (default ``config.num_agents``; centralized MAGRPO: 1);
    ``refuse_tools`` names a recipe that cannot take tools (see
    :func:`~comlrl.algos.cli.run_steps.preflight`)."""
    import torch
    from comlrl.algos.models.ranks import is_main, rank_and_world
    from comlrl.algos.training import lifecycle
    from comlrl.algos.training.run_summary import summary_line
    from comlrl.core import RewardFunctionError

    main = is_main()
    try:  # everything that can be checked before the models load
        task, examples = preflight(config, config.models, refuse_tools=refuse_tools)
    except ConfigError as exc:
        return _err(str(exc))
    _quiet_transformers()
    world = rank_and_world()[1]
    who = f"{config.num_agents} agents"
    if num_models is not None and num_models != config.num_agents:
        who = f"{num_models} policy for {config.num_agents} roles"
    if main:
        announce(
            config,
            len(examples),
            f"{label}, {config.num_steps} step{'s' if config.num_steps != 1 else ''} of "
            f"{config.batch_size} prompts x {config.num_generations} completions",
            who,
        )
        if world > 1:
            print(
                f"comlrl: data parallel over {world} processes ({config.data_parallel}), "
                f"{config.batch_size // world} prompts each",
                file=sys.stderr,
            )
    torch.manual_seed(config.seed)
    try:
        agents = load_agents(config, num_models, **config.generation_options())
        trainer = trainer_cls(agents, config, task=task, dataset=examples)
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        task.close()
        return _err(str(exc))
    if request.clear_earlier and main:  # --overwrite, now that the task and models have loaded
        lifecycle.clear_run_outputs(config.output_dir)
    if request.resume_from is not None:
        from comlrl.algos.training.checkpoint import CheckpointError

        try:
            step = trainer.resume(request.resume_from)
        except (CheckpointError, NotImplementedError) as exc:
            task.close()
            trainer.run.close()
            return _err(f"cannot resume from {request.resume_from}: {exc}")
        if main:
            print(resuming_line(config.output_dir, step, config.num_steps, request.resume_from))
        if step >= config.num_steps:
            task.close()
            trainer.run.close()
            print(
                f"nothing to do: the run already has {step} steps; pass num_steps=N to train longer"
            )
            return 0
    try:
        history = trainer.train()
    except (RewardFunctionError, lifecycle.TrainingInterrupted) as exc:
        return stopped(exc)
    if main:
        print(summary_line(history, config.output_dir))
    return 0


def run_madpo(
    config: MADPORunConfig,
    request: RunRequest,
    *,
    algo: str = "madpo",
    label: str = "MADPO",
    num_models: int | None = None,
    build: Callable[..., Any] | None = None,
) -> int:
    """``algo=madpo``: :class:`~comlrl.algos.MADPOTrainer` on ``config.task``; each agent's
    final weights in ``final/agent_<i>``. ``num_models`` models are loaded (default
    ``config.num_agents``) and ``build(agents, config, task, examples, eval_examples)``
    makes the trainer (default: ``MADPOTrainer(agents, config, task=task, ...)``);
    ``algo=centralized_madpo`` passes one model and its joint-policy trainer."""
    from comlrl.algos.recipes.preference.trainers import MADPOTrainer
    from comlrl.algos.training import lifecycle
    from comlrl.algos.training.reporting import reporters_for

    try:
        task, examples = preflight(config, config.models, refuse_tools=algo)
    except ConfigError as exc:
        return _err(str(exc))
    n_models = config.num_agents if num_models is None else num_models
    who = f"{config.num_agents} agents"
    if n_models != config.num_agents:
        who = f"{n_models} policy for {config.num_agents} roles"
    try:
        eval_examples = None
        if config.eval_split is not None:
            eval_examples = load_eval_split(task, config.eval_split, config.eval_limit)
        _quiet_transformers()
        announce(
            config,
            len(examples),
            f"{label}, {config.num_steps} steps of {config.batch_size} prompts x "
            f"{config.num_candidates} candidates",
            who,
        )
        agents = load_agents(config, n_models, prompt_format=config.prompt_format)
        if build is None:
            trainer = MADPOTrainer(
                agents, config, task=task, dataset=examples, eval_dataset=eval_examples
            )
        else:
            trainer = build(agents, config, task, examples, eval_examples)
        out = _start_outputs(config, algo, request)
        if request.resume_from is not None:
            step = trainer.resume(request.resume_from, out)
            print(resuming_line(out, step, config.num_steps, request.resume_from))
    except (OSError, ValueError) as exc:  # before training: ConfigError, CheckpointError, loads
        task.close()
        return _err(str(exc))
    try:  # a bug from here on keeps its traceback (and the run its last checkpoint)
        history = trainer.train(
            **{**config.run_outputs(request, algo), "resume_from": None},
            reporters=lambda out: reporters_for(
                out,
                report_to=config.report_to,
                reward_curve=config.reward_curve,
                title=f"{config.task.name} - {', '.join(config.models)} - {label}",
                wandb_project=config.wandb_project,
                record=config.model_dump(),
            ),
        )
    except lifecycle.TrainingInterrupted as exc:
        return stopped(exc)
    finally:
        task.close()
    print(_loss_summary(history, out, "reward_mean"))
    return 0


# --------------------------------------------------------------------------- one-model recipes


def run_sft(config: SFTRunConfig, request: RunRequest) -> int:
    """``algo=sft``: :func:`~comlrl.algos.recipes.preference.supervised.recipe.train_sft` on ``config.data``."""
    from comlrl.algos.recipes.preference.supervised.recipe import train_sft

    def train(model: Any, tok: Any, rows: list[dict[str, Any]], held: Any) -> Any:
        return train_sft(model, tok, rows, config, held, **config.run_outputs(request, "sft"))

    return _run_one_model(config, request, "sft", ("prompt", "completion"), train)


def run_dpo(config: DPORunConfig, request: RunRequest) -> int:
    """``algo=dpo``: :func:`~comlrl.algos.recipes.preference.supervised.recipe.train_dpo` on ``config.data``
    (reference model: a frozen copy of the model as loaded)."""
    from comlrl.algos.recipes.preference.supervised.recipe import train_dpo

    def train(model: Any, tok: Any, rows: list[dict[str, Any]], held: Any) -> Any:
        return train_dpo(model, tok, rows, config, held, **config.run_outputs(request, "dpo"))

    return _run_one_model(config, request, "dpo", ("prompt", "chosen", "rejected"), train)


def _run_one_model(
    config: Any,
    request: RunRequest,
    algo: str,
    keys: tuple[str, ...],
    train: Callable[..., list[dict[str, float]]],
) -> int:
    from comlrl.algos.cli.preflight import check_model_names

    try:  # the data and the model name, before the model loads
        rows = read_jsonl_rows(config.data, keys, algo.upper())
        held = (
            read_jsonl_rows(config.eval_data, keys, f"{algo.upper()} evaluation")
            if config.eval_data
            else None
        )
        check_model_names(config.models)
    except ConfigError as exc:
        return _err(str(exc))
    _quiet_transformers()
    print(
        f"comlrl: {algo.upper()} of {config.models[0]} on {config.data} ({len(rows)} rows), "
        f"{config.num_steps} steps of {config.batch_size} rows; outputs in {config.output_dir}/",
        file=sys.stderr,
    )
    from comlrl.algos.training.checkpoint import CheckpointError, read_checkpoint_meta
    from comlrl.algos.training.lifecycle import TrainingInterrupted

    try:
        model, tok = _load(config.models[0], config, config.seed)
        out = _start_outputs(config, algo, request)
        if request.resume_from is not None:
            step = read_checkpoint_meta(request.resume_from)["step"]
            print(resuming_line(out, step, config.num_steps, request.resume_from))
    except (OSError, ValueError) as exc:  # before training: ConfigError, CheckpointError, loads
        return _err(str(exc))
    try:  # a bug from here on keeps its traceback (and the run its last checkpoint)
        history = train(model, tok, rows, held)
    except CheckpointError as exc:  # --resume's checkpoint, read before the first step
        return _err(f"cannot resume from {request.resume_from}: {exc}")
    except TrainingInterrupted as exc:
        return stopped(exc)
    print(_loss_summary(history, out))
    return 0
