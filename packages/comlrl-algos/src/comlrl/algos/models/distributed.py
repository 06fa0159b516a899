"""Data parallel training over ``torch.distributed`` ranks (``torchrun``).

Under an initialised process group of ``K`` ranks a step works like this:

- every rank draws the same global batch of ``batch_size`` prompts (the data stream is
  seeded identically everywhere) and keeps its contiguous share
  (:func:`shard_bounds`): ``batch_size / K`` prompts. All ``G`` completions of a prompt,
  and every later-turn node of its tree, live on that rank, so group statistics and
  advantages are computed locally and exactly; only ``advantage_scale="batch"`` needs the
  whole batch, and its std comes from the ranks' return moments summed
  (:func:`comlrl.algos.recipes.group_baseline.recipe.group_advantages`).
- each agent's gradient is averaged over the ranks by a :class:`GradientSync`:
  ``"ddp"`` wraps the model in :class:`~torch.nn.parallel.DistributedDataParallel`
  (every backward but the last of a pass under ``no_sync``, so one bucketed all-reduce
  overlaps the last backward; DDP accepts the two forwards per backward of the
  shared-prefix path because all parameters take part in the last one);
  ``"none"`` keeps the bare model and all-reduces the flattened gradient once after the
  local backward passes, which works for any forward structure.
- the loss normalisers (sequence or token counts of the reduction) are summed over the
  ranks before the backward passes (:func:`comlrl.algos.training.update.update_policy` with
  ``sync=``), and each rank's loss is multiplied by ``K`` to cancel the averaging, so the
  averaged gradient is the gradient of the loss over the global batch: the same update as
  one process over all ``batch_size`` prompts (tested to float32 round-off).
- metrics are gathered (:func:`gather_objects`) so that rank 0 logs numbers of the global
  batch; only rank 0 writes logs, samples and checkpoints. Checkpoints hold the full,
  unwrapped weights (Hugging Face format) and the optimizer state, identical on every
  rank, so a run resumes on any number of ranks.

``"fsdp2"`` shards each agent's parameters (and so its gradients and optimizer state)
over the ranks with :func:`torch.distributed.fsdp.fully_shard`, one unit per decoder
layer plus the root (embeddings, final norm, LM head). Its reduce-scatter averages the
gradients like DDP, so the same ``K`` factor applies. Sampling needs whole weights:
:meth:`GradientSync.full_weights` all-gathers every unit once before a rollout (and keeps
it gathered through every forward of the rollout) and reshards afterwards; the fast decode
step is off for such models (the layers carry FSDP's hooks) and decoding runs through the
model's own forward, which ``HFAgent.sampler.fast_decode_status`` states. Checkpoints are
gathered into full CPU tensors on rank 0
(:func:`torch.distributed.checkpoint.state_dict.get_model_state_dict` /
``get_optimizer_state_dict`` with ``full_state_dict=True, cpu_offload=True``) and saved in
the same format as a single process's, so any run resumes on any number of ranks.

Nothing here is imported by the estimators; ``torch.distributed`` is imported lazily.
The code: :mod:`~comlrl.algos.models.ranks` (ranks, joining the group, batch shards,
collectives of plain values) and :mod:`~comlrl.algos.models.gradient_sync`
(:class:`GradientSync`); this module re-exports both.
"""

from __future__ import annotations

from comlrl.algos.models.gradient_sync import (
    DATA_PARALLEL_MODES,
    GradientSync,
    full_weights,
    wrap_model,
)
from comlrl.algos.models.ranks import (
    all_reduce_flag,
    barrier,
    gather_objects,
    init_from_env,
    is_main,
    rank_and_world,
    shard_bounds,
)

__all__ = [
    "DATA_PARALLEL_MODES",
    "GradientSync",
    "full_weights",
    "all_reduce_flag",
    "barrier",
    "gather_objects",
    "init_from_env",
    "is_main",
    "rank_and_world",
    "shard_bounds",
    "wrap_model",
]
