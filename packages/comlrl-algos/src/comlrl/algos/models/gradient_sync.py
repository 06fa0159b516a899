"""Data parallel training over ``torch.distributed`` ranks (``torchrun``): averaging one
agent's gradient over the ranks (:class:`GradientSync`: DDP, FSDP2, or one all-reduce), full
weights for sampling, and whole state dicts for checkpoints.

Under an initialised process group of ``K`` ranks a step works like this:

- every rank draws the same global batch of ``batch_size`` prompts (the data stream is
  seeded identically everywhere) and keeps its contiguous share
  (:func:`~comlrl.algos.models.ranks.shard_bounds`): ``batch_size / K`` prompts. All ``G`` completions of a prompt,
  and every later-turn node of its tree, live on that rank, so group statistics and
  advantages are computed locally and exactly; only ``advantage_scale="batch"`` needs the
  whole batch, and its std comes from the ranks' return moments summed
  (:func:`comlrl.algos.recipes.group_baseline.advantages.group_advantages`).
- each agent's gradient is averaged over the ranks by a :class:`GradientSync`:
  ``"ddp"`` wraps the model in :class:`~torch.nn.parallel.DistributedDataParallel`
  (every backward but the last of a pass under ``no_sync``, so one bucketed all-reduce
  overlaps the last backward; DDP accepts the two forwards per backward of the
  shared-prefix path because all parameters take part in the last one);
  ``"none"`` keeps the bare model and all-reduces the flattened gradient once after the
  local backward passes, which works for any forward structure.
- the loss normalisers (sequence or token counts of the reduction) are summed over the
  ranks before the backward passes (:func:`comlrl.algos.training.update.policy.update_policy` with
  ``sync=``), and each rank's loss is multiplied by ``K`` to cancel the averaging, so the
  averaged gradient is the gradient of the loss over the global batch: the same update as
  one process over all ``batch_size`` prompts (tested to float32 round-off).
- metrics are gathered (:func:`~comlrl.algos.models.ranks.gather_objects`) so that rank 0 logs numbers of the global
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

The ranks themselves (joining the group, batch shards, collectives of plain values) are in
:mod:`comlrl.algos.models.ranks`. Nothing here is imported by the estimators;
``torch.distributed`` is imported lazily.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from comlrl.algos.models.ranks import collective_device

__all__ = ["DATA_PARALLEL_MODES", "GradientSync", "full_state_dicts", "full_weights", "wrap_model"]

DATA_PARALLEL_MODES = ("ddp", "fsdp2", "none")


class GradientSync:
    """How one agent's gradient is averaged over the ranks of the default process group.

    Args:
        model: the agent's model (already on its device); never replaced, so sampling,
            saving and the reference copy see the bare module.
        mode: ``"ddp"`` (:class:`~torch.nn.parallel.DistributedDataParallel` wrapper,
            ``broadcast_buffers=False``: buffers never change in training), ``"fsdp2"``
            (``fully_shard`` in place, per decoder layer then the root; build the
            optimizer *after* this, over the sharded parameters) or ``"none"`` (one
            all-reduce of the flattened gradient after the local backward passes).

    Attributes:
        module: what the update calls for log-probs (the DDP wrapper or ``model``).
        world_size: ``K``; :func:`~comlrl.algos.training.update.policy.update_policy` multiplies the
            loss by it, cancelling the averaging, after normalising by global counts.

    Raises:
        ValueError: an unknown ``mode``, or ``"fsdp2"`` for a model without decoder
            layers to shard (``model.model.layers``).
        RuntimeError: no initialised process group.
    """

    def __init__(self, model: torch.nn.Module, mode: str) -> None:
        import torch.distributed as dist

        if mode not in DATA_PARALLEL_MODES:
            raise ValueError(
                f"data_parallel={mode!r} is not supported; use one of {list(DATA_PARALLEL_MODES)}."
            )
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "GradientSync needs an initialised torch.distributed process group "
                "(run under torchrun, or call torch.distributed.init_process_group first)."
            )
        self.model = model
        self.mode = mode
        self.world_size = dist.get_world_size()
        self.module: Any = model
        if mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            device = next(model.parameters()).device
            self.module = DistributedDataParallel(
                model,
                device_ids=[device.index] if device.type == "cuda" else None,
                broadcast_buffers=False,
            )
        elif mode == "fsdp2":
            _fully_shard(model)

    @contextlib.contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        """Context for one backward: gradients are only accumulated locally unless ``last``."""
        if self.mode == "ddp" and not last:
            with self.module.no_sync():
                yield
        elif self.mode == "fsdp2":
            # earlier backwards accumulate unsharded gradients; the last reduce-scatters
            self.module.set_requires_gradient_sync(last)
            yield
        else:
            yield

    def finish(self) -> None:
        """After the last backward of a pass: make every rank hold the averaged gradient.

        ``"ddp"`` has already averaged during the last backward; ``"none"`` all-reduces
        every parameter's gradient (as one flat float32-or-native buffer per dtype).
        """
        if self.mode in ("ddp", "fsdp2"):
            return
        import torch.distributed as dist

        grads: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for p in self.model.parameters():
            if p.requires_grad:
                if p.grad is None:  # untouched on this rank; others may have a gradient
                    p.grad = torch.zeros_like(p)
                grads.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        for group in grads.values():
            flat = torch.cat([g.reshape(-1) for g in group])
            dist.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for g in group:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """Sums of ``values`` over the ranks (float64 on the wire)."""
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64, device=collective_device())
        dist.all_reduce(t)
        return [float(v) for v in t.tolist()]

    @contextlib.contextmanager
    def full_weights(self) -> Iterator[None]:
        """Context in which the model holds its full parameters as plain tensors.

        ``"fsdp2"``: all-gathers every FSDP unit (a collective: every rank enters
        together), keeps the units gathered through any number of forwards (no
        resharding after a forward), and reshards on exit. Other modes: nothing to do.
        """
        if self.mode != "fsdp2":
            yield
            return
        units = _fsdp_units(self.model)
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(True, recurse=False)

    def model_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full model state dict as CPU tensors on rank 0 (``{}`` on the others), or
        ``None`` when the model is not sharded and its own ``state_dict()`` is whole.

        ``"fsdp2"``: a collective (every rank calls it together).
        """
        if self.mode != "fsdp2":
            return None
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state: dict[str, Any] = get_model_state_dict(self.model, options=_full_options())
        if state:
            # tied parameters (e.g. embeddings and LM head) come back as separate copies;
            # make them one tensor again, as in model.state_dict(), so save_pretrained
            # writes the tied weight once, as a single process does
            first: dict[int, str] = {}
            for name, param in self.model.named_parameters(remove_duplicate=False):
                if id(param) in first and name in state:
                    state[name] = state[first[id(param)]]
                first.setdefault(id(param), name)
        return state

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a full state dict (every rank passes the whole dict) into the model."""
        if self.mode != "fsdp2":
            self.model.load_state_dict(state, strict=True)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(
            self.model,
            dict[str, Any](state),
            options=StateDictOptions(full_state_dict=True, strict=True),
        )

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """``optimizer.state_dict()`` with whole tensors, in the single-process format
        (states keyed by parameter index): the same on every rank for ``"ddp"``/``"none"``;
        for ``"fsdp2"`` gathered to CPU on rank 0 (``{}`` on the others; a collective)."""
        if self.mode != "fsdp2":
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full: Any = get_optimizer_state_dict(self.model, optimizer, options=_full_options())
        if not full:
            return {}
        index = {fqn: i for i, fqn in enumerate(_fqns_in_order(full))}
        return {
            "state": {index[fqn]: value for fqn, value in full.get("state", {}).items()},
            "param_groups": [
                {**group, "params": [index[fqn] for fqn in group["params"]]}
                for group in full["param_groups"]
            ],
        }

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        """Load :meth:`optimizer_state_dict`'s format (or a single process's
        ``optimizer.state_dict()``); ``"fsdp2"`` shards it (every rank passes the whole dict).

        Raises:
            ValueError: the saved state has another number of parameters than ``optimizer``.
        """
        if self.mode != "fsdp2":
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        # the parameter names in the optimizer's order (a local call: no full_state_dict)
        layout: Any = get_optimizer_state_dict(self.model, optimizer, options=StateDictOptions())
        fqns = _fqns_in_order(layout)
        saved = [i for g in state["param_groups"] for i in g["params"]]
        if len(saved) != len(fqns):
            raise ValueError(
                f"the saved optimizer state covers {len(saved)} parameters but the optimizer has "
                f"{len(fqns)}; resume with the models and optimizer the run was started with."
            )
        by_index = dict(zip(saved, fqns, strict=True))
        full: Any = {
            "state": {by_index[int(i)]: value for i, value in state["state"].items()},
            "param_groups": [
                {**group, "params": [by_index[i] for i in group["params"]]}
                for group in state["param_groups"]
            ],
        }
        set_optimizer_state_dict(
            self.model, optimizer, full, options=StateDictOptions(full_state_dict=True)
        )


def _full_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _fqns_in_order(optim_state: dict[str, Any]) -> list[str]:
    return [fqn for group in optim_state["param_groups"] for fqn in group["params"]]


def _fsdp_units(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _fully_shard(model: torch.nn.Module) -> None:
    """``fully_shard`` each decoder layer (``model.model.layers``), then the root."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not len(layers):
        raise ValueError(
            f"data_parallel='fsdp2' shards a causal LM per decoder layer, but "
            f"{type(model).__name__} has no model.model.layers; use data_parallel='ddp'."
        )
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


@contextlib.contextmanager
def full_weights(syncs: Sequence[GradientSync] | None) -> Iterator[None]:
    """:meth:`GradientSync.full_weights` of every distinct sync in ``syncs`` (in order, so
    every rank gathers the same models in the same order); ``None``: nothing to do."""
    with contextlib.ExitStack() as stack:
        seen: set[int] = set()
        for sync in syncs or ():
            if id(sync) not in seen:
                seen.add(id(sync))
                stack.enter_context(sync.full_weights())
        yield


def full_state_dicts(
    syncs: Sequence[GradientSync] | None, num_agents: int
) -> list[dict[str, torch.Tensor] | None]:
    """Per agent the gathered full state dict of its model under ``fsdp2`` (a collective:
    every rank calls it; a model shared by agents is gathered once), else ``None`` (the
    model's own ``state_dict()`` is whole)."""
    if syncs is None:
        return [None] * num_agents
    gathered: dict[int, dict[str, torch.Tensor] | None] = {}
    for sync in syncs:  # the same order on every rank
        if id(sync) not in gathered:
            gathered[id(sync)] = sync.model_state_dict()
    return [gathered[id(sync)] for sync in syncs]


def wrap_model(model: torch.nn.Module, mode: str) -> GradientSync:
    """:class:`GradientSync` for ``model`` (see there)."""
    return GradientSync(model, mode)
