"""The end-to-end run of the group-baseline recipes (``algo=magrpo`` / ``mareinforce`` /
``marloo`` / ``maremax``): task -> agents -> trainer -> train -> final checkpoint, the run
``comlrl train`` makes, also from Python (``run_group_baseline(TrainConfig(...))``).

:func:`run_policy_gradient` is that run for any trainer built as
``trainer_cls(agents, config, task=, dataset=)`` (the actor-critic and centralized recipes
use it too). Every run writes one row per step to ``output_dir/metrics.jsonl`` and the final
weights to ``output_dir/final/`` (Hugging Face format, loadable by ``comlrl eval`` and
``from_pretrained``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from comlrl.algos.recipes.run_steps import (
    RunOutputs,
    RunResult,
    announce,
    load_agents,
    preflight,
    quiet_transformers,
    resuming_line,
    setup_errors,
)
from comlrl.algos.training.config import RLConfig, TrainConfig

__all__ = ["run_group_baseline", "run_policy_gradient"]


def run_group_baseline(config: TrainConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=magrpo`` / ``mareinforce`` / ``marloo`` / ``maremax``:
    :class:`~comlrl.algos.MultiAgentTrainer` with ``config.estimator`` on ``config.task``
    (:func:`run_policy_gradient`)."""
    from comlrl.algos.recipes.group_baseline.trainer import MultiAgentTrainer

    return run_policy_gradient(config, outputs, MultiAgentTrainer, f"estimator {config.estimator}")


def run_policy_gradient(
    config: RLConfig,
    outputs: RunOutputs | None,
    trainer_cls: Callable[..., Any],
    label: str,
    *,
    num_models: int | None = None,
    refuse_tools: str | None = None,
) -> RunResult:
    """Task -> agents -> trainer -> train -> summary, the run ``comlrl train`` has always
    made (for the actor-critic trainers too: the same task, agents and outputs).
    ``trainer_cls(agents, config, task=, dataset=)`` builds the trainer; ``num_models``
    agents are loaded (default ``config.num_agents``; centralized MAGRPO: 1);
    ``refuse_tools`` names a recipe that cannot take tools (see
    :func:`~comlrl.algos.recipes.run_steps.preflight`). ``outputs`` (default: the
    config's) replace the config's output fields; with ``outputs.resume_from`` the run
    continues from that step checkpoint (a finished one returns no rows).

    Raises:
        ConfigError: a bad config, task, model name or checkpoint, before training (a
            model that does not load too, as its ``OSError`` / ``ValueError`` message).
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
        RewardFunctionError: the reward function failed (the last completed step is
            checkpointed).
    """
    import torch
    from comlrl.algos.models.ranks import is_main, rank_and_world
    from comlrl.algos.training import lifecycle
    from comlrl.algos.training.checkpoint import CheckpointError
    from comlrl.algos.training.run_summary import summary_line

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    main = is_main()
    if main:
        outputs.check_folder()
    task, examples = preflight(config, config.models, refuse_tools=refuse_tools)
    quiet_transformers()
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
        with setup_errors():
            agents = load_agents(config, num_models, **config.generation_options())
            trainer = trainer_cls(agents, config, task=task, dataset=examples)
    except BaseException:
        task.close()
        raise
    if outputs.overwrite and outputs.resume_from is None and main:  # now that the models loaded
        lifecycle.clear_run_outputs(config.output_dir)
    if outputs.resume_from is not None:
        try:
            step = trainer.resume(outputs.resume_from)
        except (CheckpointError, NotImplementedError) as exc:
            task.close()
            trainer.run.close()
            raise CheckpointError(f"cannot resume from {outputs.resume_from}: {exc}") from None
        if main:
            print(resuming_line(config.output_dir, step, config.num_steps, outputs.resume_from))
        if step >= config.num_steps:
            task.close()
            trainer.run.close()
            return RunResult(
                [],
                f"nothing to do: the run already has {step} steps; pass num_steps=N to train "
                "longer",
                outputs.output_dir,
            )
    history = trainer.train()
    return RunResult(history, summary_line(history, config.output_dir), outputs.output_dir)
