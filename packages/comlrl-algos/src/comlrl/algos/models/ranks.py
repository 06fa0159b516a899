"""The ranks of a data parallel run (``torchrun``) and collectives over plain values.

Who this process is (:func:`rank_and_world`, :func:`is_main`), joining the process group
``torchrun`` describes (:func:`init_from_env`), the share of the global batch a rank rolls
out (:func:`shard_bounds`), and small collectives (:func:`barrier`,
:func:`gather_objects`, :func:`all_reduce_flag`). Every function also works without a
process group (one rank). The concept (global batch, gradient averaging,
checkpoints): :mod:`comlrl.algos.models.gradient_sync`.
``torch.distributed`` is imported lazily.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = [
    "all_reduce_flag",
    "barrier",
    "collective_device",
    "gather_objects",
    "init_from_env",
    "is_main",
    "rank_and_world",
    "shard_bounds",
]


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group; ``(0, 1)`` without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """True on rank 0 (and in a process without a process group): the rank that writes."""
    return rank_and_world()[0] == 0


def init_from_env() -> bool:
    """Initialise the default process group from ``torchrun``'s environment.

    Does nothing (returns False) when ``WORLD_SIZE`` is unset or 1, or a group already
    exists. Otherwise uses NCCL when CUDA is available (and pins this process to GPU
    ``LOCAL_RANK``), else gloo, and returns True: the caller then owns the group and
    destroys it with ``torch.distributed.destroy_process_group()``. The environment
    variable ``COMLRL_DIST_BACKEND`` (``nccl`` or ``gloo``) overrides the choice, e.g. to
    run several ranks on one GPU with gloo.

    Raises:
        RuntimeError: ``WORLD_SIZE`` > 1 but ``torch.distributed`` is not available in
            this torch build.
        ValueError: ``COMLRL_DIST_BACKEND`` is not ``nccl``/``gloo``, or ``nccl`` without GPUs.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or (dist.is_available() and dist.is_initialized()):
        return False
    if not dist.is_available():
        raise RuntimeError(
            f"WORLD_SIZE={world} but this torch build has no torch.distributed; "
            "run in one process or install a torch build with distributed support."
        )
    backend = os.environ.get("COMLRL_DIST_BACKEND", "").strip().lower()
    if backend not in ("", "nccl", "gloo"):
        raise ValueError(f"COMLRL_DIST_BACKEND={backend!r}: use 'nccl', 'gloo' or leave it unset")
    if torch.cuda.is_available():
        # Ranks beyond the GPU count share GPUs round-robin; NCCL refuses two ranks on one
        # GPU, so such a layout needs COMLRL_DIST_BACKEND=gloo (a test setup, not a fast one).
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        dist.init_process_group(backend or "nccl")
    else:
        if backend == "nccl":
            raise ValueError("COMLRL_DIST_BACKEND=nccl needs CUDA GPUs; none is visible")
        dist.init_process_group("gloo")
    return True


def shard_bounds(batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[lo, hi)``: the prompts of the global batch that rank ``rank`` rolls out.

    Contiguous shards of ``batch_size / world_size`` prompts, in rank order, so the
    concatenation of all shards is the global batch.

    Raises:
        ValueError: ``batch_size`` is not a multiple of ``world_size``.
    """
    if batch_size % world_size:
        raise ValueError(
            f"batch_size={batch_size} prompts cannot be split evenly over {world_size} ranks; "
            f"use a multiple of {world_size} (e.g. {world_size * max(1, batch_size // world_size)})."
        )
    per = batch_size // world_size
    return rank * per, (rank + 1) * per


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    import torch.distributed as dist

    if rank_and_world()[1] > 1:
        dist.barrier()


def gather_objects(obj: Any) -> list[Any]:
    """``[obj of rank 0, ..., obj of rank K-1]`` on every rank (``[obj]`` without a group).

    For small picklable values (metric sums, per-rank reward tensors); uses
    ``torch.distributed.all_gather_object``.
    """
    import torch.distributed as dist

    world = rank_and_world()[1]
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def all_reduce_flag(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any rank (e.g. a Ctrl-C seen by one)."""
    import torch.distributed as dist

    if rank_and_world()[1] == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def collective_device() -> torch.device:
    """The device collectives of plain values use: the current GPU under NCCL, else CPU."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
