"""Shared step helpers for the recipes, gathered from one module per job: :mod:`.agents`
(optimizers, devices, :class:`AgentPool`), :mod:`.data` (:class:`DataStream`,
:class:`JsonlWriter`), :mod:`.metrics` (rollout metrics, samples) and :mod:`.saving`
(atomic folders, agent checkpoints). Nothing here knows a training method."""

from __future__ import annotations

from comlrl.algos.training.agents import AgentPool, build_optimizer, resolve_device
from comlrl.algos.training.data import DataStream, JsonlWriter
from comlrl.algos.training.metrics import (
    merge_summaries,
    rollout_metrics,
    rollout_summary,
    sample_rows,
    summary_metrics,
)
from comlrl.algos.training.saving import atomic_folder, save_agent_checkpoint

__all__ = [
    "build_optimizer",
    "AgentPool",
    "DataStream",
    "JsonlWriter",
    "rollout_metrics",
    "rollout_summary",
    "merge_summaries",
    "summary_metrics",
    "sample_rows",
    "save_agent_checkpoint",
    "resolve_device",
    "atomic_folder",
]
