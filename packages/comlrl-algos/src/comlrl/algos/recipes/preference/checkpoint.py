"""The step checkpoints of the preference recipes (SFT, DPO, MADPO) in the one format
(:mod:`comlrl.algos.training.run.checkpoint`), with a fingerprint of the frozen reference
models, and their final weights."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from comlrl.algos.training.loop import (
    rewind_outputs,
)
from comlrl.algos.training.run import checkpoint as ckpt
from comlrl.algos.training.run.data import DataStream
from comlrl.algos.training.run.saving import save_agent_checkpoint

__all__ = [
    "read_step_checkpoint",
    "save_models",
    "write_step_checkpoint",
]


def _fingerprint(models: Sequence[Any]) -> list[float]:
    """Per model, the float64 sum of |w| over every parameter: equal for the same
    weights, and almost surely different for others (a cheap check, not a hash); -1 for
    ``None`` (no reference model: a reference-free agent, as CoMLRL 1.4.3's MADPO)."""
    out = []
    for m in models:
        if m is None:
            out.append(-1.0)
            continue
        with torch.no_grad():
            out.append(float(sum(p.detach().double().abs().sum() for p in m.parameters())))
    return out


def write_step_checkpoint(
    path: Path,
    step: int,
    models: Sequence[tuple[Any, Any]],
    optimizers: Sequence[torch.optim.Optimizer],
    data: DataStream,
    rng: random.Random,
    generators: Sequence[torch.Generator | None],
    references: Sequence[Any] = (),
    recipe_state: Mapping[str, Any] | None = None,
) -> Path:
    """A step checkpoint in the one format
    (:func:`comlrl.algos.training.run.checkpoint.write_checkpoint`): the trained model(s) as
    ``agent_<i>/``, and ``training_state.pt`` plus a fingerprint of the frozen reference
    models (not saved: they are the weights the run started from, rebuilt by loading the
    same models; the fingerprint makes a resume with other initial weights fail);
    ``recipe_state`` under :data:`~comlrl.algos.training.run.checkpoint.RECIPE_STATE`."""
    state = ckpt.capture_state(
        step=step, optimizers=optimizers, data=data, rng=rng, generators=generators
    )
    state["reference_fingerprint"] = _fingerprint(references)
    if recipe_state is not None:
        state[ckpt.RECIPE_STATE] = dict(recipe_state)
    return ckpt.write_checkpoint(
        path, [SimpleNamespace(model=m, tokenizer=t) for m, t in models], state
    )


def read_step_checkpoint(
    path: str | Path,
    output_dir: str | Path | None,
    models: Sequence[Any],
    optimizers: Sequence[torch.optim.Optimizer],
    data: DataStream,
    rng: random.Random,
    generators: Sequence[torch.Generator | None],
    references: Sequence[Any] = (),
    state: Mapping[str, Any] | None = None,
) -> int:
    """Load what :func:`write_step_checkpoint` wrote (``state``: its ``training_state.pt``, when
    the caller has read it already); with ``output_dir``, cut its logs back to the step
    (:func:`~comlrl.algos.training.loop.rewind_outputs`). Returns the step."""
    if state is None:
        state = ckpt.load_training_state(path)
    saved = state.get("reference_fingerprint")
    if saved is None:
        raise ckpt.CheckpointError(
            f"{str(path)!r} was not written by a preference recipe (no reference fingerprint); "
            "resume it with the recipe that wrote it."
        )
    now = _fingerprint(references)
    if len(saved) != len(now) or any(
        abs(a - b) > 1e-9 * max(1.0, abs(b)) for a, b in zip(saved, now, strict=False)
    ):
        raise ckpt.CheckpointError(
            f"the reference models differ from the run's (weight fingerprints {saved} when "
            f"saved, {now} now); resume with the models the run was started with."
        )
    for i, model in enumerate(models):
        ckpt.load_agent_weights(model, Path(path) / f"agent_{i}")
    step = ckpt.restore_state(
        state, optimizers=optimizers, data=data, rng=rng, generators=generators
    )
    if output_dir is not None:
        rewind_outputs(output_dir, step)
    return step


def save_models(path: Path, models: Sequence[tuple[Any, Any]]) -> None:
    """Each ``(model, tokenizer)`` to ``path/agent_<i>`` (Hugging Face format, atomically)."""
    for i, (model, tokenizer) in enumerate(models):
        save_agent_checkpoint(
            SimpleNamespace(model=model, tokenizer=tokenizer), path / f"agent_{i}"
        )
