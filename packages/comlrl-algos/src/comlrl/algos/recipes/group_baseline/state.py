"""Saving a group-baseline run: ``final/`` (:func:`save`), step checkpoints in the one
format (:func:`checkpoint`) and continuing from one (:func:`resume`); under data
parallelism every rank calls them and rank 0 writes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.models.ranks import barrier
from comlrl.algos.recipes.group_baseline.setup import GroupBaselineRun, agent_seed
from comlrl.algos.training import checkpoint as ckpt
from comlrl.algos.training.loop import (
    rewind_outputs,
)
from comlrl.algos.training.saving import save_agent_checkpoint

__all__ = [
    "save",
    "checkpoint",
    "resume",
]


def save(run: GroupBaselineRun, tag: str) -> list[Path]:
    """Checkpoint every agent under ``output_dir/<tag>/agent_<i>`` (atomically).

    Data parallel: every rank calls this (``fsdp2`` gathers the weights to rank 0);
    rank 0 writes, the others return ``[]``.
    """
    states = _full_model_states(run)
    if not run.is_main:
        return []
    return [
        save_agent_checkpoint(agent, run.output_dir / tag / f"agent_{i}", state_dict=states[i])
        for i, agent in enumerate(run.agents)
    ]


def _full_model_states(run: GroupBaselineRun) -> list[dict[str, torch.Tensor] | None]:
    """Per agent the gathered full state dict (``fsdp2``; a collective), else ``None``:
    the model's own ``state_dict()`` is whole."""
    if run.syncs is None:
        return [None] * len(run.agents)
    gathered: dict[int, dict[str, torch.Tensor] | None] = {}
    for sync in run.syncs:  # the same order on every rank; a shared model is gathered once
        if id(sync) not in gathered:
            gathered[id(sync)] = sync.model_state_dict()
    return [gathered[id(sync)] for sync in run.syncs]


def checkpoint(
    run: GroupBaselineRun,
    path: str | Path | None = None,
    *,
    recipe_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write the step checkpoint ``path`` (default ``output_dir/checkpoints/step-N``):
    agents + training state, atomically; returns the folder. (The loop driver prunes to
    ``keep_last``.) ``recipe_state``: a recipe's own state, saved under
    :data:`~comlrl.algos.training.checkpoint.RECIPE_STATE` (MARLHF-Iter's rounds).

    Data parallel: every rank calls this (``fsdp2`` gathers weights and optimizer state
    to rank 0); rank 0 writes and every rank gets the folder's path back.
    """
    path = Path(path) if path is not None else ckpt.step_checkpoint_path(run.output_dir, run.step)
    models = _full_model_states(run)
    optimizer_states = (
        [
            sync.optimizer_state_dict(opt)
            for sync, opt in zip(run.syncs, run.optimizers, strict=True)
        ]
        if run.syncs is not None
        else None
    )
    if not run.is_main:
        return path
    state = ckpt.capture_state(
        step=run.step,
        optimizers=run.optimizers,
        data=run.data,
        rng=run.rng,
        generators=[getattr(a, "generator", None) for a in run.agents],
        optimizer_states=optimizer_states,
    )
    if recipe_state is not None:
        state[ckpt.RECIPE_STATE] = dict(recipe_state)
    return ckpt.write_checkpoint(path, run.agents, state, state_dicts=models)


def resume(
    run: GroupBaselineRun, path: str | Path, *, state: Mapping[str, Any] | None = None
) -> int:
    """Put ``run`` back at the step checkpoint ``path`` (weights, optimizers, data stream,
    random streams), cut the logs in ``output_dir`` back to its step, and return the step:
    :func:`train` then continues as if never stopped. ``state``: the checkpoint's
    ``training_state.pt`` when the caller has read it already. Raises CheckpointError when
    the checkpoint is incomplete or does not fit the run."""
    if state is None:
        state = ckpt.load_training_state(path)
    for i, agent in enumerate(run.agents):
        sync = run.syncs[i] if run.syncs is not None else None
        ckpt.load_agent_weights(
            agent.model,
            Path(path) / f"agent_{i}",
            load_state_dict=sync.load_model_state_dict if sync is not None else None,
        )
    run.step = ckpt.restore_state(
        state,
        optimizers=run.optimizers,
        data=run.data,
        rng=run.rng,
        generators=[getattr(a, "generator", None) for a in run.agents],
        load_optimizer=(
            [sync.load_optimizer_state_dict for sync in run.syncs]
            if run.syncs is not None
            else None
        ),
    )
    if run.world_size > 1:
        # The checkpoint holds rank 0's streams; other ranks need their own. (With
        # sampling_rng="prompt" the streams are unused and the run continues exactly on
        # any number of ranks.)
        for i, agent in enumerate(run.agents):
            if run.rank > 0 and hasattr(agent, "seed"):
                agent.seed(agent_seed(run.config.seed, i, run.rank, run.step))
    if run.is_main:
        rewind_outputs(run.output_dir, run.step)
    barrier()
    return run.step
