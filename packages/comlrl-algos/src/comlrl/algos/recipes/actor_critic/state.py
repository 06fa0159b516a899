"""What an actor-critic run holds (:class:`ActorCriticRun`) and how it is saved: ``final/``
(:func:`save`), resumable step checkpoints in the one format (:func:`checkpoint`) and
continuing from one (:func:`resume`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.models.value import Critic, save_value_head
from comlrl.algos.recipes.actor_critic.config import ActorCriticConfig, Method
from comlrl.algos.recipes.group_baseline.recipe import GroupBaselineRun
from comlrl.algos.training import checkpoint as ckpt
from comlrl.algos.training.config import ConfigError
from comlrl.algos.training.loop import rewind_outputs
from comlrl.algos.training.saving import save_agent_checkpoint

__all__ = [
    "ActorCriticRun",
    "save",
    "checkpoint",
    "resume",
]


@dataclass
class ActorCriticRun:
    """What an actor-critic run holds between steps (built by :func:`setup`).

    ``base`` holds agents, environment, data, actor optimizers, sampling and pools;
    ``critics`` is one per agent (IAC) or one (MAAC); ``critic_optimizers[i]`` is None
    for a shared-trunk critic, whose head is a parameter group of its actor's optimizer.
    """

    base: GroupBaselineRun
    config: ActorCriticConfig
    method: Method
    critics: list[Critic]
    critic_optimizers: list[torch.optim.Optimizer | None]

    @property
    def step(self) -> int:
        return self.base.step

    def close(self) -> None:
        """Stop worker threads (safe to call twice)."""
        self.base.close()


def save(run: ActorCriticRun, tag: str) -> list[Path]:
    """Write every agent to ``output_dir/<tag>/agent_<i>`` (Hugging Face format, atomically)
    with, for a shared-trunk critic, its value head beside the weights; separate critics go
    to ``critic_<i>`` (IAC) or ``critic`` (MAAC), trunk and head. Returns the folders."""
    root = run.base.output_dir / tag
    out = []
    for i, agent in enumerate(run.base.agents):
        path = save_agent_checkpoint(agent, root / f"agent_{i}")
        out.append(path)
    for i, critic in enumerate(run.critics):
        if critic.shared:
            save_value_head(critic.head, root / f"agent_{i}", kind=critic.kind)
        else:
            out.append(critic.save(root / (f"critic_{i}" if run.method == "iac" else "critic")))
    return out


def _critic_state(run: ActorCriticRun) -> dict[str, Any]:
    """The critics' part of ``training_state.pt``: weights and optimizer state (CPU tensors)."""
    return {
        "method": run.method,
        "kind": run.config.critic_type,
        "heads": [
            {k: v.detach().cpu() for k, v in c.head.state_dict().items()} for c in run.critics
        ],
        "trunks": [
            None if c.shared else {k: v.detach().cpu() for k, v in c.trunk.state_dict().items()}
            for c in run.critics
        ],
        "optimizers": [None if o is None else o.state_dict() for o in run.critic_optimizers],
    }


def checkpoint(
    run: ActorCriticRun,
    path: str | Path | None = None,
    *,
    recipe_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write the step checkpoint ``path`` (default ``output_dir/checkpoints/step-N``)
    atomically and return it. ``recipe_state``: a caller's own plain-value state, saved
    under :data:`~comlrl.algos.training.checkpoint.RECIPE_STATE` (``comlrl.trainers``' IAC/MAAC
    keep their epoch cursor there).

    The folder is :func:`comlrl.algos.training.checkpoint.write_checkpoint`'s (built under a
    temporary name, then renamed): ``agent_<i>/`` (Hugging Face weights) and
    ``training_state.pt`` holding the actors' optimizers (a shared-trunk head's moments
    are a parameter group there), the data stream, every random stream, the step and,
    under ``"critics"``, each critic's head and (separate critics) trunk weights and
    optimizer state. ``torch.load(..., weights_only=True)`` reads it. (The loop driver
    prunes to ``keep_last``.)

    Raises:
        ConfigError: the run is data parallel (actor-critic checkpoints are single-process).
    """
    base = run.base
    if base.world_size > 1 or base.syncs is not None:
        raise ConfigError(
            "actor-critic checkpoints are written by a single process; run without "
            "data_parallel to checkpoint an IAC/MAAC run."
        )
    state = ckpt.capture_state(
        step=base.step,
        optimizers=base.optimizers,
        data=base.data,
        rng=base.rng,
        generators=[getattr(a, "generator", None) for a in base.agents],
    )
    state["critics"] = _critic_state(run)
    if recipe_state is not None:
        state[ckpt.RECIPE_STATE] = dict(recipe_state)
    if path is None:
        path = ckpt.step_checkpoint_path(base.output_dir, base.step)
    return ckpt.write_checkpoint(path, base.agents, state)


def resume(run: ActorCriticRun, path: str | Path, *, state: Mapping[str, Any] | None = None) -> int:
    """Put ``run`` back at the step checkpoint ``path`` written by :func:`checkpoint`:
    actor weights and optimizers, critics (heads, separate trunks, their optimizers),
    data stream and random streams; cut ``metrics.jsonl``/``samples.jsonl``/``eval.jsonl``
    back to its step and return the step. :func:`train` then continues as if never stopped.
    ``state``: the checkpoint's ``training_state.pt`` when the caller has read it already.

    Raises:
        CheckpointError: the checkpoint is incomplete, was written by another recipe (no
            critic state), or does not fit the run (method, critic kind, number of critics,
            a shared/separate mismatch, other shapes).
    """
    base = run.base
    if state is None:
        state = ckpt.load_training_state(path)
    saved = state.get("critics")
    if saved is None:
        raise ckpt.CheckpointError(
            f"{str(path)!r} holds no critic state (a group-baseline checkpoint?); resume it "
            "with the recipe that wrote it."
        )
    if (saved["method"], saved["kind"]) != (run.method, run.config.critic_type):
        raise ckpt.CheckpointError(
            f"{str(path)!r} was written by {saved['method'].upper()} with critic_type="
            f"{saved['kind']!r}; this run is {run.method.upper()} with critic_type="
            f"{run.config.critic_type!r}."
        )
    if len(saved["heads"]) != len(run.critics):
        raise ckpt.CheckpointError(
            f"{str(path)!r} has {len(saved['heads'])} critics but this run has {len(run.critics)}."
        )
    for i, agent in enumerate(base.agents):
        ckpt.load_agent_weights(agent.model, Path(path) / f"agent_{i}")
    base.step = ckpt.restore_state(
        state,
        optimizers=base.optimizers,
        data=base.data,
        rng=base.rng,
        generators=[getattr(a, "generator", None) for a in base.agents],
    )
    for i, critic in enumerate(run.critics):
        trunk, opt_state = saved["trunks"][i], saved["optimizers"][i]
        if (trunk is None) != critic.shared or (opt_state is None) != (
            run.critic_optimizers[i] is None
        ):
            raise ckpt.CheckpointError(
                f"critic {i} is {'shared' if critic.shared else 'separate'} in this run but "
                f"was {'shared' if trunk is None else 'separate'} when saved; use the same "
                "critic_mode."
            )
        try:
            critic.head.load_state_dict(saved["heads"][i])
            if trunk is not None:
                critic.trunk.load_state_dict(trunk)
            optimizer = run.critic_optimizers[i]
            if optimizer is not None:
                optimizer.load_state_dict(opt_state)
        except (RuntimeError, ValueError) as exc:
            raise ckpt.CheckpointError(
                f"critic {i}'s saved state does not fit this run: {exc}"
            ) from None
    rewind_outputs(base.output_dir, base.step)
    return base.step
