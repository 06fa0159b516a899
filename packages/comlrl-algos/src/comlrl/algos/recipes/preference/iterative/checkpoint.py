"""Step checkpoints of MADPO-Iter and MARLHF-Iter (:mod:`.recipe`) in the one
format (:mod:`comlrl.algos.training.checkpoint`), and exact resume from them.

A checkpoint holds what MADPO's (:func:`~comlrl.algos.recipes.preference.madpo.recipe.madpo_checkpoint`)
or the group-baseline recipe's (:func:`comlrl.algos.recipes.group_baseline.recipe.checkpoint`)
holds (weights, optimizers, data stream, random streams) and, under
:data:`~comlrl.algos.training.checkpoint.RECIPE_STATE`, the iterative state:

- ``recipe``: ``"madpo_iter"`` or ``"marlhf_iter"`` (a checkpoint of another recipe is refused);
- ``rounds``: :meth:`~comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds.state_dict`:
  the pairing and ordering streams, the round rows, the replay of every round's pairs,
  the comparator's history snapshots and its frozen agents' sampling streams;
- ``round``: the round in progress (:class:`RoundState`: its row and, MADPO-Iter, the
  training pairs its remaining steps take);
- MARLHF-Iter also: the rounds' prompt stream, the reward model's weights as last
  fitted, whether it was fitted, its fit rows (``reward_model_metrics.jsonl``) and a
  fingerprint of its initial weights (every round refits from those; setup rebuilds them,
  and a resume whose reward model starts elsewhere is refused).

The reward model's optimizer is not saved: every round's fit builds a fresh one (and
reseeds torch) inside one step, so none outlives a step boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from comlrl.algos.recipes.group_baseline import state as group_baseline_state
from comlrl.algos.recipes.preference.madpo.recipe import madpo_checkpoint, madpo_resume
from comlrl.algos.recipes.preference.pairs import IterPair
from comlrl.algos.training import checkpoint as ckpt

if TYPE_CHECKING:
    from comlrl.algos.recipes.preference.iterative.recipe import MADPOIterRun, MARLHFIterRun

__all__ = [
    "RoundState",
    "madpo_iter_checkpoint",
    "madpo_iter_resume",
    "marlhf_iter_checkpoint",
    "marlhf_iter_resume",
]


@dataclass
class RoundState:
    """The round in progress: its row and its training pairs, one chunk per step."""

    row: dict[str, float] = field(default_factory=dict)
    chunks: list[list[IterPair]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        """Plain values (the pairs as :meth:`IterPair.to_state`)."""
        return {
            "row": dict(self.row),
            "chunks": [[p.to_state() for p in chunk] for chunk in self.chunks],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RoundState:
        """The round :meth:`state_dict` saved."""
        return cls(
            {str(k): float(v) for k, v in state["row"].items()},
            [[IterPair.from_state(p) for p in chunk] for chunk in state["chunks"]],
        )


def _fingerprint(weights: Mapping[str, torch.Tensor]) -> float:
    """The float64 sum of ``|w|`` over ``weights``: equal for the same weights, almost
    surely different for others (a cheap check, not a hash)."""
    return float(sum(t.detach().double().abs().sum() for t in weights.values()))


def _iterative_state(state: Mapping[str, Any], path: str | Path, recipe: str) -> dict[str, Any]:
    saved = state.get(ckpt.RECIPE_STATE)
    if not isinstance(saved, Mapping) or saved.get("recipe") != recipe:
        found = saved.get("recipe") if isinstance(saved, Mapping) else None
        raise ckpt.CheckpointError(
            f"{str(path)!r} holds no {recipe} rounds (its recipe state: {found!r}); resume "
            f"it with the recipe that wrote it, or start a new algo={recipe} run."
        )
    return dict(saved)


def _load_rounds(run: Any, saved: Mapping[str, Any]) -> None:
    try:
        run.rounds.load_state_dict(saved["rounds"])
    except ValueError as exc:
        raise ckpt.CheckpointError(str(exc)) from None
    run.round = RoundState.from_state(saved["round"])


def madpo_iter_checkpoint(run: MADPOIterRun, path: str | Path) -> Path:
    """Write a MADPO-Iter step checkpoint at ``path`` (the MADPO run's, plus the rounds
    and the round in progress); returns the folder."""
    recipe_state = {
        "recipe": "madpo_iter",
        "rounds": run.rounds.state_dict(),
        "round": run.round.state_dict(),
    }
    return madpo_checkpoint(run.madpo, path, recipe_state=recipe_state)


def madpo_iter_resume(
    run: MADPOIterRun, path: str | Path, output_dir: str | Path | None = None
) -> int:
    """Put a freshly built MADPO-Iter ``run`` (the initial weights, rounds not begun) back
    at the step checkpoint ``path`` and return its step; with ``output_dir`` its logs are
    cut back to the step. The run then continues as if never stopped.

    Raises:
        CheckpointError: the checkpoint is incomplete, is not MADPO-Iter's, or does not
            fit the run (agents, optimizers, reference models, comparator).
    """
    state = ckpt.load_training_state(path)
    saved = _iterative_state(state, path, "madpo_iter")
    step = madpo_resume(run.madpo, path, output_dir, state=state)
    _load_rounds(run, saved)
    return step


def marlhf_iter_checkpoint(run: MARLHFIterRun, path: str | Path) -> Path:
    """Write a MARLHF-Iter step checkpoint at ``path`` (the RL run's, plus the rounds,
    the round in progress, the prompt stream and the reward model); returns the folder."""
    recipe_state = {
        "recipe": "marlhf_iter",
        "rounds": run.rounds.state_dict(),
        "round": run.round.state_dict(),
        "data": run.data.state_dict(),
        "fitted": run.fitted,
        "reward_model": ckpt.cpu_state_dict(run.reward_model),
        "reward_init_fingerprint": _fingerprint(run.reward_init),
        "reward_model_rows": [dict(row) for row in run.reward_model_rows],
    }
    return group_baseline_state.checkpoint(run.rl, path, recipe_state=recipe_state)


def marlhf_iter_resume(run: MARLHFIterRun, path: str | Path) -> int:
    """Put a freshly built MARLHF-Iter ``run`` (the initial weights and reward model,
    rounds not begun) back at the step checkpoint ``path`` and return its step; the logs
    in the RL run's ``output_dir`` are cut back to the step.

    Raises:
        CheckpointError: the checkpoint is incomplete, is not MARLHF-Iter's, or does not
            fit the run (agents, optimizers, comparator, the reward model's initial
            weights or shape, the prompt data).
    """
    state = ckpt.load_training_state(path)
    saved = _iterative_state(state, path, "marlhf_iter")
    now = _fingerprint(run.reward_init)
    was = float(saved["reward_init_fingerprint"])
    if abs(now - was) > 1e-9 * max(1.0, abs(was)):
        raise ckpt.CheckpointError(
            f"the reward model starts from other weights than the saved run's (fingerprint "
            f"{was} when saved, {now} now); resume with the reward_model the run started with."
        )
    step = group_baseline_state.resume(run.rl, path, state=state)
    try:
        run.reward_model.load_state_dict(dict(saved["reward_model"]), strict=True)
        run.data.load_state_dict(saved["data"])
    except (RuntimeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"the saved reward model or data do not fit: {exc}") from None
    run.fitted = bool(saved["fitted"])
    run.reward_model_rows = [dict(row) for row in saved["reward_model_rows"]]
    _load_rounds(run, saved)
    return step
