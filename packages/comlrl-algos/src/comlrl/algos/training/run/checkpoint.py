"""Step checkpoints that resume a run exactly, written atomically.

A step checkpoint is a folder ``output_dir/checkpoints/step-NNNNNN/``::

    agent_<i>/            each agent's model and tokenizer (Hugging Face format)
    training_state.pt     everything else the next step depends on (see capture_state;
                          a recipe's own state under RECIPE_STATE)
    checkpoint.json       {"step": N, "format": 1, "num_agents": A}: readable by people

The folder is built under a hidden temporary name beside it and renamed into place, so a
``step-*`` folder that exists is complete: a run killed while saving leaves only a
``.step-*.tmp-<pid>`` folder, which :func:`clean_partial_checkpoints` removes.

``training_state.pt`` holds only tensors, numbers, strings, lists, tuples and dicts, so
``torch.load(path, weights_only=True)`` reads it (no pickled code runs on load).

Nothing here knows a training method: the recipes hand in their optimizers, data stream,
random streams and step, and get the step back on restore.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.saving import atomic_folder, save_agent_checkpoint

__all__ = [
    "CheckpointError",
    "CHECKPOINTS_DIR",
    "STATE_FILE",
    "META_FILE",
    "step_checkpoint_path",
    "capture_state",
    "streams_kept_on_failure",
    "restore_state",
    "set_random_state",
    "cpu_state_dict",
    "RECIPE_STATE",
    "write_checkpoint",
    "write_meta",
    "read_checkpoint_meta",
    "latest_checkpoint",
    "list_checkpoints",
    "prune_checkpoints",
    "clean_partial_checkpoints",
    "load_training_state",
    "load_agent_weights",
]

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "training_state.pt"
META_FILE = "checkpoint.json"
FORMAT = 1
#: The key of ``training_state.pt`` under which a recipe keeps state of its own beyond
#: what :func:`capture_state` takes (MADPO-Iter / MARLHF-Iter: their rounds, replay,
#: comparator and reward model); plain values and tensors, like the rest.
RECIPE_STATE = "recipe_state"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, or does not fit the run it is loaded into."""


def step_checkpoint_path(output_dir: str | Path, step: int) -> Path:
    """``output_dir/checkpoints/step-NNNNNN`` (zero-padded to 6 digits so names sort)."""
    return Path(output_dir) / CHECKPOINTS_DIR / f"step-{step:06d}"


def capture_state(
    *,
    step: int,
    optimizers: Sequence[torch.optim.Optimizer],
    data: DataStream,
    rng: random.Random,
    generators: Sequence[torch.Generator | None],
    schedulers: Sequence[Any] = (),
    optimizer_states: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Everything besides the weights that the next training step depends on.

    Args:
        step: optimizer steps taken so far.
        optimizers: one per agent (``state_dict()``: moments, step counts, hyper-parameters).
        data: the run's data stream (order left in this epoch, epoch, shuffle RNG).
        rng: the run's own :class:`random.Random` (multi-turn branch selection).
        generators: each agent's sampling stream (``HFAgent.generator``), ``None`` where
            the agent draws from torch's global stream.
        schedulers: learning-rate schedulers, if the recipe has any.
        optimizer_states: the optimizers' state dicts when ``opt.state_dict()`` does not
            hold whole tensors (FSDP2: gathered by
            :meth:`comlrl.algos.models.gradient_sync.GradientSync.optimizer_state_dict`), in the
            same index-keyed format.

    Returns:
        A dict of plain values and CPU tensors for :func:`torch.save`; the RNG states
        (torch's global CPU and CUDA streams, Python's ``random`` module, the run's
        stream, each agent's generator) are taken now.
    """
    cuda = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else []
    )
    return {
        "format": FORMAT,
        "step": int(step),
        "optimizers": (
            [dict(sd) for sd in optimizer_states]
            if optimizer_states is not None
            else [opt.state_dict() for opt in optimizers]
        ),
        "schedulers": [s.state_dict() for s in schedulers],
        "data": data.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": list(cuda),
            "python": random.getstate(),
            "run": rng.getstate(),
            "agents": [g.get_state() if g is not None else None for g in generators],
        },
    }


def cpu_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of ``module.state_dict()`` on the CPU: every tensor is copied (also
    one already on the CPU), so later training of ``module`` does not change it. Shapes and
    dtypes are the module's own."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def set_random_state(target: random.Random | Any, state: Sequence[Any]) -> None:
    """``target.setstate(state)`` for a state read back by ``torch.load(weights_only=True)``
    (``target``: a :class:`random.Random` or the :mod:`random` module; ``state``: what its
    ``getstate()`` gave, its inner tuple possibly turned into a list)."""
    version, internal, gauss = state
    target.setstate((version, tuple(internal), gauss))


def restore_state(
    state: Mapping[str, Any],
    *,
    optimizers: Sequence[torch.optim.Optimizer],
    data: DataStream,
    rng: random.Random,
    generators: Sequence[torch.Generator | None],
    schedulers: Sequence[Any] = (),
    load_optimizer: Sequence[Callable[[torch.optim.Optimizer, dict[str, Any]], None]] | None = None,
) -> int:
    """Put what :func:`capture_state` saved back into the run's objects; returns the step.

    ``load_optimizer`` (one per optimizer) replaces ``opt.load_state_dict(sd)``, e.g.
    :meth:`comlrl.algos.models.gradient_sync.GradientSync.load_optimizer_state_dict`, which shards
    the saved whole tensors for an FSDP2 model.

    Raises:
        CheckpointError: the saved state has another format, another number of agents,
            optimizers, schedulers or data (the run is not the one that was saved).
    """
    if state.get("format") != FORMAT:
        raise CheckpointError(
            f"training state format {state.get('format')!r}; this version reads {FORMAT}"
        )
    saved_rng = state["rng"]
    counts = {
        "optimizers": (len(state["optimizers"]), len(optimizers)),
        "schedulers": (len(state["schedulers"]), len(schedulers)),
        "agent generators": (len(saved_rng["agents"]), len(generators)),
    }
    for what, (saved, now) in counts.items():
        if saved != now:
            raise CheckpointError(
                f"the checkpoint has {saved} {what} but this run has {now}; resume with the "
                "configuration the run was started with (num_agents, models)."
            )
    loaders = load_optimizer or [type(opt).load_state_dict for opt in optimizers]
    for opt, sd, load in zip(optimizers, state["optimizers"], loaders, strict=True):
        try:
            load(opt, sd)
        except ValueError as exc:
            raise CheckpointError(
                f"the saved optimizer state does not fit this run: {exc}"
            ) from None
    for sched, sd in zip(schedulers, state["schedulers"], strict=True):
        sched.load_state_dict(sd)
    try:
        data.load_state_dict(state["data"])
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    for i, (gen, saved) in enumerate(zip(generators, saved_rng["agents"], strict=True)):
        if (gen is None) != (saved is None):
            raise CheckpointError(
                f"agent {i} {'has' if gen is not None else 'has no'} own sampling generator now "
                f"but {'had none' if saved is None else 'had one'} when saved; use the same agents."
            )
        if gen is not None:
            gen.set_state(saved)
    torch.set_rng_state(saved_rng["torch"])
    if saved_rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved_rng["cuda"])
    set_random_state(random, saved_rng["python"])
    set_random_state(rng, saved_rng["run"])
    return int(state["step"])


@contextlib.contextmanager
def streams_kept_on_failure(
    data: DataStream, rng: random.Random, generators: Sequence[torch.Generator | None]
) -> Iterator[None]:
    """Around the part of a step before its first weight change (the batch, the rollout, a
    reward function, the values): an exception puts the data stream and every random stream
    (:func:`capture_state`'s) back as the last completed step left them, then propagates.
    The checkpoint the loop driver writes on the way out
    (:func:`~comlrl.algos.training.loop.run_loop`) then resumes to exactly the run that
    never failed: the failed step's batch is drawn again."""
    saved = capture_state(step=0, optimizers=(), data=data, rng=rng, generators=generators)
    try:
        yield
    except Exception:
        restore_state(saved, optimizers=(), data=data, rng=rng, generators=generators)
        raise


def write_checkpoint(
    path: str | Path,
    agents: Sequence[Any],
    state: Mapping[str, Any],
    *,
    state_dicts: Sequence[Mapping[str, torch.Tensor] | None] | None = None,
) -> Path:
    """Write a step checkpoint folder atomically (temporary sibling folder, then rename).

    Args:
        path: the folder to create, e.g. :func:`step_checkpoint_path`.
        agents: objects with ``model`` and ``tokenizer`` (saved as ``agent_<i>/``).
        state: :func:`capture_state`'s dict (its ``step`` goes into ``checkpoint.json``).
        state_dicts: per agent, whole weights to save instead of its model's own
            ``state_dict()`` (FSDP2's gathered ones), or ``None`` entries.

    Returns:
        ``path``. An existing folder at ``path`` is replaced only once the new one is
        complete.
    """
    path = Path(path)
    with atomic_folder(path) as tmp:
        for i, agent in enumerate(agents):
            sd = state_dicts[i] if state_dicts is not None else None
            save_agent_checkpoint(agent, tmp / f"agent_{i}", state_dict=sd)
        torch.save(dict(state), tmp / STATE_FILE)
        write_meta(tmp, int(state["step"]), num_agents=len(agents))
    return path


def write_meta(path: str | Path, step: int, *, num_agents: int | None = None) -> Path:
    """Write ``checkpoint.json`` (``{"step": N, "format": 1, ...}``) into the folder ``path``."""
    meta: dict[str, Any] = {"step": int(step), "format": FORMAT}
    if num_agents is not None:
        meta["num_agents"] = int(num_agents)
    out = Path(path) / META_FILE
    out.write_text(json.dumps(meta) + "\n")
    return out


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """``checkpoint.json`` of a checkpoint folder.

    Raises:
        CheckpointError: the folder has no readable ``checkpoint.json``.
    """
    meta = Path(path) / META_FILE
    try:
        return dict(json.loads(meta.read_text()))
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{str(meta)!r} is missing or unreadable ({exc}); not a complete checkpoint"
        ) from None


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete step checkpoints under ``output_dir/checkpoints`` as ``(step, path)``, oldest first."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if (
            m
            and child.is_dir()
            and (child / STATE_FILE).is_file()
            and (child / META_FILE).is_file()
        ):
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete step checkpoint of a run, or ``None``."""
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def prune_checkpoints(
    output_dir: str | Path, keep_last: int, *, keep: Path | None = None
) -> list[Path]:
    """Delete all but the newest ``keep_last`` step checkpoints; returns the deleted folders.

    Only complete ``checkpoints/step-*`` folders are candidates: a folder being written
    (a temporary name), ``keep`` (the one just written) and ``output_dir/final`` never are.

    Raises:
        ValueError: ``keep_last < 1``.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    found = list_checkpoints(output_dir)
    doomed = [p for _, p in found[: max(0, len(found) - keep_last)]]
    if keep is not None:
        doomed = [p for p in doomed if p.resolve() != Path(keep).resolve()]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def clean_partial_checkpoints(output_dir: str | Path) -> list[Path]:
    """Remove half-written checkpoint folders of dead runs: ``.step-*.tmp-*``,
    ``.step-*.old-*`` and MARLHF's ``.reward_model.tmp-*``."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    pattern = r"^\.(step-\d+|reward_model)\.(tmp|old)-\d+$"
    stale = [p for p in root.iterdir() if re.match(pattern, p.name)]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def load_training_state(path: str | Path) -> dict[str, Any]:
    """Read ``training_state.pt`` of a checkpoint folder (``weights_only=True``).

    Raises:
        CheckpointError: the file is missing or unreadable.
    """
    f = Path(path) / STATE_FILE
    if not f.is_file():
        raise CheckpointError(
            f"{str(f)!r} does not exist; {str(path)!r} is not a complete step checkpoint"
        )
    try:
        return dict(torch.load(f, map_location="cpu", weights_only=True))
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means the same to the user
        raise CheckpointError(f"could not read {str(f)!r}: {exc}") from None


def load_agent_weights(
    model: Any,
    path: str | Path,
    *,
    load_state_dict: Callable[[dict[str, torch.Tensor]], None] | None = None,
) -> None:
    """Copy the weights saved at ``path`` (Hugging Face format) into ``model`` in place.

    Loading through ``from_pretrained`` handles sharded files and tied embeddings; the
    copy keeps ``model``'s identity, device and dtype, so optimizers built over its
    parameters stay valid. A LoRA agent (:class:`~comlrl.algos.models.lora_policy.LoraPolicy`) loads its
    adapter (``adapter_model.safetensors``) and keeps its base. ``load_state_dict`` replaces ``model.load_state_dict(sd,
    strict=True)`` (FSDP2: :meth:`comlrl.algos.models.gradient_sync.GradientSync.load_model_state_dict`
    shards the whole tensors).

    Raises:
        CheckpointError: the folder cannot be loaded or its weights do not fit ``model``.
    """
    if getattr(type(model), "is_lora_policy", False):  # a LoRA agent: its adapter only
        try:
            model.load_adapter_weights(path)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"could not load the LoRA adapter {str(path)!r}: {exc}") from None
        return
    from transformers import AutoModelForCausalLM

    dtype = next(model.parameters()).dtype
    try:
        saved = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"could not load the agent checkpoint {str(path)!r}: {exc}") from None
    try:
        if load_state_dict is not None:
            load_state_dict(saved.state_dict())
        else:
            model.load_state_dict(saved.state_dict(), strict=True)
    except RuntimeError as exc:
        raise CheckpointError(
            f"the weights in {str(path)!r} do not fit the agent's model ({exc}); resume with "
            "the models the run was started with."
        ) from None
