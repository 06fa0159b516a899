"""CoMLRL 1.4.3's module path ``comlrl.trainers.preference.checkpointing``: the
iterative trainers' checkpointed round loop, :func:`train_iterations_checkpointed`.

Only that entry point is provided. 1.4.3's preference asset pool (hard-linked replay and
snapshot blobs, digests, pruning) and its output-path resolution are not: our
checkpoints are ``comlrl.algos``' folders (:mod:`comlrl.trainers.preference._checkpoints`,
:mod:`comlrl.trainers.preference._iter_checkpoints`; docs/compat.md, "Checkpoints").
"""

from __future__ import annotations

from typing import Any

__all__ = ["train_iterations_checkpointed"]


def train_iterations_checkpointed(
    trainer: Any, *, reward_model: bool, **kwargs: Any
) -> list[dict[str, float]]:
    """Run an iterative trainer's rounds from its cursor (``trainer._checkpoint_progress``;
    none: from round 0), committing after every round, as 1.4.3's function of this name.

    Args:
        trainer: a ``MADPOIterTrainer`` (``reward_model=False``) or ``MARLHFIterTrainer``
            (``reward_model=True``).
        reward_model: whether the rounds fit a reward model (which trainer this is).

    Returns:
        The trainer's per-step rows (as its ``train()``).

    Raises:
        ValueError: the cursor is not this trainer's or is malformed (checked before any
            round runs), or ``trainer`` is not the iterative trainer ``reward_model`` names.
        UnsupportedFieldError: other keyword arguments (1.4.3 passes them to its own
            pair-building hook, which ours does not have).
    """
    from comlrl.trainers._fields import UnsupportedFieldError

    kind = "marlhf_iter" if reward_model else "madpo_iter"
    if getattr(trainer, "_checkpoint_kind", None) != kind:
        raise ValueError(
            f"train_iterations_checkpointed(reward_model={reward_model!r}) runs a {kind} "
            f"trainer; got {type(trainer).__name__}."
        )
    trainer._checkpoint_start_epoch(trainer.__dict__.get("_checkpoint_progress") or {})
    if kwargs:
        raise UnsupportedFieldError(
            f"train_iterations_checkpointed({', '.join(kwargs)}=...) is not supported; "
            "call it with the trainer and reward_model only."
        )
    rows: list[dict[str, float]] = trainer._run_rounds()
    return rows
