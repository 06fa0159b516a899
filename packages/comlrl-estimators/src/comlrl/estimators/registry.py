"""The registry of group-baseline advantage estimators, by name.

An :class:`Estimator` names a per-group baseline (one of :data:`BASELINES` or a
:data:`BaselineFn` callable), the scaling its definition uses and its source paper;
:data:`ESTIMATORS` holds the built-in ones (REINFORCE, GRPO, RLOO, ReMax and their
multi-agent aliases) and :func:`register_estimator` adds more.
:func:`~comlrl.estimators.advantages.compute_advantages` computes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

__all__ = [
    "BASELINES",
    "ESTIMATORS",
    "BaselineFn",
    "Estimator",
    "register_estimator",
    "resolve_estimator",
]

#: Built-in baselines: ``none``, ``mean``, ``loo`` and ``max`` (the group max, the sample
#: itself included) run in ``comlrl.kernels.group_advantages``; ``loo_max`` (the max of the
#: *other* samples of the group, ReMax's baseline here) runs in
#: :func:`~comlrl.estimators.advantages.loo_max_baseline`.
BASELINES: tuple[str, ...] = ("none", "mean", "loo", "max", "loo_max")

#: A user baseline: ``fn(returns [M], group_ids [M], num_groups) -> baseline [M]``.
#: ``returns`` is floating point, ``group_ids`` is int64 with values in
#: ``[0, num_groups)`` (every value occurs at least once), and the result must be a
#: tensor of the same shape and dtype as ``returns`` holding each sample's baseline.
BaselineFn = Callable[[Tensor, Tensor, int], Tensor]


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator: ``A = r - baseline`` within each group.

    Attributes:
        name: canonical registry name (aliases map to the same object).
        baseline: one of :data:`BASELINES` (computed by the kernels package or its
            torch fallback) or a :data:`BaselineFn` callable.
        reference: the paper the estimator comes from, for docs and logs.
        scale: the scaling the estimator's definition uses (``"none"``, ``"group"`` or
            ``"batch"``), applied by ``compute_advantages(scale="auto")``.
    """

    name: str
    baseline: str | BaselineFn
    reference: str = ""
    scale: Literal["none", "group", "batch"] = "none"


#: Registry of estimators by name. The multi-agent names (``ma*``) are aliases of the
#: single-agent ones: in CoMLRL each agent's completions are grouped per prompt and the
#: joint return is credited to them, so the per-group maths is the same.
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(
    name: str,
    baseline: str | BaselineFn,
    *,
    reference: str = "",
    aliases: tuple[str, ...] = (),
    overwrite: bool = False,
    scale: Literal["none", "group", "batch"] = "none",
) -> Estimator:
    """Add an estimator to :data:`ESTIMATORS` and return it.

    Args:
        name: registry key, e.g. ``"my_baseline"``.
        baseline: one of ``"none"``, ``"mean"``, ``"loo"``, ``"max"``, ``"loo_max"``, or a callable
            ``fn(returns [M], group_ids [M], num_groups) -> baseline [M]`` (see
            :data:`BaselineFn`). A callable runs in pure torch, outside the kernels.
        reference: citation shown in docs and logs.
        scale: the estimator's own scaling convention (what ``scale="auto"`` applies).
        aliases: further names that map to the same estimator.
        overwrite: replace an existing entry of the same name instead of raising.

    Raises:
        ValueError: empty name, unknown baseline string, or a name already registered
            while ``overwrite`` is False.
        TypeError: ``baseline`` is neither a string nor callable.
    """
    if isinstance(baseline, str):
        if baseline not in BASELINES:
            raise ValueError(
                f"unknown baseline {baseline!r}; use one of {list(BASELINES)} "
                "or pass a callable fn(returns, group_ids, num_groups) -> baseline"
            )
    if scale not in ("none", "group", "batch"):
        raise ValueError(f"unknown scale {scale!r}; use 'none', 'group' or 'batch'")
    if not isinstance(baseline, str) and not callable(baseline):
        raise TypeError(
            f"baseline must be a string in {list(BASELINES)} or a callable, "
            f"got {type(baseline).__name__}"
        )
    estimator = Estimator(name=name, baseline=baseline, reference=reference, scale=scale)
    for key in (name, *aliases):
        if not isinstance(key, str) or not key:
            raise ValueError(f"estimator names must be non-empty strings, got {key!r}")
        if key in ESTIMATORS and not overwrite:
            raise ValueError(
                f"estimator {key!r} is already registered; pass overwrite=True to replace it"
            )
    for key in (name, *aliases):
        ESTIMATORS[key] = estimator
    return estimator


register_estimator(
    "reinforce",
    "none",
    aliases=("mareinforce",),
    reference="Williams 1992, Simple statistical gradient-following algorithms (REINFORCE), "
    "baseline b = 0",
)
register_estimator(
    "grpo",
    "mean",
    aliases=("magrpo",),
    scale="group",
    reference="Shao et al. 2024, DeepSeekMath (GRPO), eq. 3 and sec. 4.1.2: "
    "A = (r - mean(group)) / std(group); pass scale='none' for Liu et al. 2025 "
    "(Dr. GRPO), which drops the std",
)
register_estimator(
    "rloo",
    "loo",
    aliases=("marloo",),
    reference="Kool et al. 2019, Buy 4 REINFORCE samples, get a baseline for free!; "
    "Ahmadian et al. 2024, Back to Basics (RLOO), b_i = mean of the other G-1 returns",
)
register_estimator(
    "remax",
    "loo_max",
    aliases=("maremax",),
    reference="Li et al. 2023, ReMax; there b is the return of a greedy rollout, "
    "here b_i is the max return of the other G-1 samples of the group (leave-one-out, so "
    "b_i does not depend on sample i and the gradient stays unbiased; no extra generation)",
)


def resolve_estimator(estimator: str | Estimator) -> Estimator:
    """The :class:`Estimator` registered as ``estimator`` (an :class:`Estimator` is
    returned as is).

    Raises:
        ValueError: for a name not in :data:`ESTIMATORS` (the message lists them).
    """
    if isinstance(estimator, Estimator):
        return estimator
    try:
        return ESTIMATORS[estimator]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown estimator {estimator!r}; use one of {sorted(ESTIMATORS)} "
            "or add one with register_estimator(name, baseline)"
        ) from None
