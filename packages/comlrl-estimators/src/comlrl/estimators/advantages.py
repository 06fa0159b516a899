"""Group-relative advantage estimators: a registry by name and one entry point.

Every completion is scored by a return ``r``. Completions that share a prompt form a
*group* (the G siblings an agent sampled for one prompt). An estimator subtracts a
per-group *baseline* ``b`` from each return, ``A = r - b``; a separate *scaling* step then
divides ``A`` by a standard deviation of the returns. Each estimator has its own scaling
convention, used unless the caller overrides it: GRPO divides by the group std by
definition (Shao et al. 2024, DeepSeekMath, eq. 3 and sec. 4.1.2); REINFORCE, RLOO and
ReMax do not.

Named axes used in the shapes below:

- ``P``: prompts (groups of fixed size), ``G``: group size,
- ``M``: flat samples (all completions of a batch, groups of any size).

Conventions (shared with ``comlrl.kernels.group_advantages``):

- Standard deviations are population standard deviations (``ddof=0``, divide by the
  number of samples ``n``, not ``n - 1``).
- Scaling is ``A / (std + eps)``; ``eps`` is added to the standard deviation, not to
  the variance.
- Scaling divides by the std of the **returns**, never re-centres, and never looks at the
  advantages. The divisor therefore does not depend on the estimator, so the four
  estimators stay distinct under every scale. (Z-scoring after the baseline, i.e.
  ``(A - mean(A)) / std(A)``, would turn REINFORCE, leave-one-out and max into the same
  update as the group mean; that is the trap this module avoids.)

The per-group work (baseline and ``scale="group"``) for the kernel baselines (``none``,
``mean``, ``loo``, ``max``) is done by ``comlrl.kernels.group_advantages`` (a dependency of
this package: C++/CUDA when compiled, its pure-torch reference otherwise). ReMax's
leave-one-out max (:func:`loo_max_baseline`) and user-defined callable baselines run in the
small torch path of this module. The estimators by name (:data:`ESTIMATORS`,
:func:`register_estimator`) live in :mod:`comlrl.estimators.registry` and are
re-exported here.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from comlrl.estimators.registry import (
    BaselineFn,
    Estimator,
    resolve_estimator,
)
from comlrl.kernels import group_advantages
from torch import Tensor

__all__ = [
    "SCALES",
    "compute_advantages",
    "loo_max_baseline",
    "return_moments",
    "std_from_moments",
]

#: Accepted values of ``compute_advantages(scale=...)``; ``"auto"`` is each estimator's own.
SCALES: tuple[str, ...] = ("auto", "none", "group", "batch")

Scale = Literal["auto", "none", "group", "batch"]


def loo_max_baseline(returns: Tensor, group_ids: Tensor, num_groups: int) -> Tensor:
    """Leave-one-out max: ``b_i = max{ r_j : j in group(i), j != i }``.

    Computed from the two largest returns of each group: ``b_i`` is the group max, except
    for the sample that alone holds it, whose baseline is the second largest return. A
    singleton group has no other sample: its baseline is the sample itself (advantage 0,
    the convention of ``loo``). Because ``b_i`` does not depend on ``r_i`` (nor on the
    completion that earned it), ``E[(r_i - b_i) grad log pi(y_i)] = E[r_i grad log pi(y_i)]``:
    the baseline adds no bias (Kool et al. 2019's argument for leave-one-out baselines). The
    group max with the sample included (baseline ``"max"``) depends on ``r_i`` and is biased.

    Args:
        returns: ``[M]`` floating returns.
        group_ids: ``[M]`` int64 dense group labels in ``[0, num_groups)``.
        num_groups: the number of groups.

    Returns:
        ``[M]`` baselines in the dtype of ``returns``.
    """
    neg_inf = torch.full((num_groups,), -torch.inf, dtype=returns.dtype, device=returns.device)
    top = neg_inf.scatter_reduce(0, group_ids, returns, reduce="amax")
    at_top = returns == top[group_ids]
    holders = torch.zeros(num_groups, dtype=torch.int64, device=returns.device)
    holders = holders.index_add(0, group_ids, at_top.to(torch.int64))
    rest = torch.where(at_top, -torch.inf, returns)
    second = neg_inf.scatter_reduce(0, group_ids, rest, reduce="amax")
    sole = at_top & (holders[group_ids] == 1)
    baseline = torch.where(sole, second[group_ids], top[group_ids])
    # a singleton group's sole holder has no other sample: -inf -> the sample itself
    return torch.where(torch.isinf(baseline), returns, baseline)


def return_moments(returns: Tensor) -> Tensor:
    """The count, sum and sum of squares of ``returns``: what ``scale="batch"`` needs from
    each shard of a batch split over data-parallel ranks.

    Moments add: the moments of a batch are the sums of its shards' moments, so summing
    them over ranks (an all-reduce) and passing :func:`std_from_moments` of the sum as
    ``compute_advantages(batch_std=...)`` gives every rank the divisor of the whole batch.

    Args:
        returns: any shape, any real dtype (treated as constants).

    Returns:
        ``[3]`` float64 on the device of ``returns``: ``(n, sum r, sum r**2)``.
    """
    values = returns.detach().to(torch.float64).reshape(-1)
    count = torch.tensor(float(values.numel()), dtype=torch.float64, device=values.device)
    return torch.stack([count, values.sum(), (values * values).sum()])


def std_from_moments(moments: Tensor) -> float:
    """Population standard deviation (``ddof=0``) from :func:`return_moments` (possibly
    summed over shards): ``sqrt(max(0, S2 / n - (S1 / n) ** 2))``, in float64.

    The float64 sums keep the cancellation error far below float32 round-off for returns of
    ordinary size (``|r| < 1e6``); the variance is clamped at 0 against it.

    Args:
        moments: ``[3]`` ``(n, sum r, sum r**2)``.

    Returns:
        The std as a Python float; 0.0 for ``n == 0``.

    Raises:
        ValueError: ``moments`` not of shape ``[3]`` or ``n < 0``.
    """
    if moments.shape != (3,):
        raise ValueError(
            f"moments must be [3] = (count, sum, sum of squares), got shape {list(moments.shape)}"
        )
    count, total, total_sq = (float(x) for x in moments.to(torch.float64).tolist())
    if count < 0:
        raise ValueError(f"moments count must be >= 0, got {count!r}")
    if count == 0:
        return 0.0
    mean = total / count
    return max(0.0, total_sq / count - mean * mean) ** 0.5


def _check_finite(returns: Tensor) -> None:
    bad = ~torch.isfinite(returns)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        shown = index[0] if len(index) == 1 else index
        raise ValueError(
            f"returns must be finite; returns[{shown}] = {returns[index].item()!r}. "
            "Fix the reward function (or map failures to a finite reward) before "
            "computing advantages"
        )


def _dense_group_ids(group_ids: Tensor, num_samples: int) -> tuple[Tensor, int]:
    """Validate ``group_ids [M]`` and relabel them to ``0..num_groups-1``."""
    if (
        group_ids.dtype.is_floating_point
        or group_ids.dtype.is_complex
        or (group_ids.dtype == torch.bool)
    ):
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    if group_ids.shape != (num_samples,):
        raise ValueError(
            f"group_ids must have shape [M] = [{num_samples}] like the flat returns, "
            f"got {list(group_ids.shape)}"
        )
    uniques, dense = torch.unique(group_ids, return_inverse=True)
    return dense.to(torch.int64), int(uniques.numel())


def _custom_baseline_advantages(
    returns: Tensor,
    group_ids: Tensor,
    num_groups: int,
    *,
    baseline: BaselineFn,
    scale: Literal["none", "group"],
    eps: float,
) -> Tensor:
    """``r - b`` for a user baseline over flat ``returns [M]`` (dense ``group_ids [M]``),
    divided by the group's population std of the returns plus ``eps`` when
    ``scale="group"``, the same convention as ``comlrl.kernels.group_advantages``."""
    b = baseline(returns, group_ids, num_groups)
    if not isinstance(b, Tensor) or b.shape != returns.shape:
        got = list(b.shape) if isinstance(b, Tensor) else type(b).__name__
        raise ValueError(
            f"a custom baseline must return a tensor of shape {list(returns.shape)}, got {got}"
        )
    adv = returns - b.to(returns.dtype)
    if scale == "group":
        zeros = returns.new_zeros(num_groups)
        counts = zeros.index_add(0, group_ids, torch.ones_like(returns))
        centred = returns - (zeros.index_add(0, group_ids, returns) / counts)[group_ids]
        std = (zeros.index_add(0, group_ids, centred * centred) / counts).sqrt()
        adv = adv / (std[group_ids] + eps)
    return adv


def compute_advantages(
    returns: Tensor,
    *,
    estimator: str | Estimator = "grpo",
    group_ids: Tensor | None = None,
    scale: Scale = "auto",
    eps: float = 1e-6,
    batch_std: float | None = None,
) -> Tensor:
    """Advantages ``A = (r - b) / s`` of each completion relative to its group.

    ``b`` is the estimator's per-group baseline and ``s`` the optional scale:

    ============  ==============================  =========================================
    estimator     baseline ``b_i``                source
    ============  ==============================  =========================================
    reinforce     0                               Williams 1992
    grpo          mean of the group               Shao et al. 2024 (DeepSeekMath, eq. 3,
                                                  4.1.2), divided by the group std by
                                                  default; ``scale="none"`` is Dr. GRPO's
                                                  advantage (Liu et al. 2025; its loss also
                                                  needs ``policy_loss(reduction="seq_sum")``)
    rloo          mean of the other ``n - 1``     Kool et al. 2019; Ahmadian et al. 2024
    remax         max of the other ``n - 1``      Li et al. 2023 (ReMax uses the return of
                                                  a greedy rollout; here the best of the
                                                  other samples, so no extra generation is
                                                  needed and the baseline is unbiased)
    ============  ==============================  =========================================

    ``mareinforce``, ``magrpo``, ``marloo`` and ``maremax`` are aliases. For a group of
    fixed size ``G`` and the same ``scale``: ``A_rloo = G / (G - 1) * A_grpo``; ``A_remax``
    is ``r - max(group) <= 0`` for every sample but the one that alone holds the group
    max, which gets ``max - second max > 0`` (the only positive advantage of its group;
    tied maxima all get 0).

    ``scale`` (applied after the baseline, never re-centring):

    - ``"auto"`` (default): the estimator's own convention, :attr:`Estimator.scale`:
      ``"group"`` for ``grpo`` (GRPO's definition, DeepSeekMath eq. 3), ``"none"`` for
      ``reinforce``, ``rloo`` and ``remax``, whose definitions have no std.
    - ``"none"``: ``s = 1``.
    - ``"group"``: ``s = std(returns of the group) + eps``.
    - ``"batch"``: ``s = std(all returns passed in) + eps`` (one scalar), or
      ``batch_std + eps`` when ``batch_std`` is given: a batch split over data-parallel
      ranks passes the std of the whole batch (:func:`return_moments` of each shard summed
      over the ranks, then :func:`std_from_moments`), so every rank divides by the same
      number as one process would.

    Standard deviations are population ones (``ddof=0``). Because ``s`` depends only on
    the returns, every estimator is divided by the same number and the estimators stay
    distinct under every scale. (Dividing by the std of the advantages instead would, for
    fixed G, make ``grpo`` and ``rloo`` identical, since ``A_rloo = G / (G - 1) * A_grpo``;
    z-scoring them would make all four identical.)

    Defined edge cases:

    - A singleton group has advantage 0 under ``grpo``, ``rloo`` and ``remax`` (no other
      sample: the leave-one-out baseline is the sample itself); ``r`` under ``reinforce``.
    - A group of equal returns has advantage 0 under ``grpo``, ``rloo`` and ``remax``,
      under every scale (``0 / (0 + eps) = 0``).
    - ``reinforce`` has no baseline: with ``scale="group"`` a zero-variance group
      (singleton or all-equal) gets ``r / eps``, which is huge unless ``r == 0``. Use
      ``scale="none"`` (or ``"batch"`` on batches whose returns vary) with ``reinforce``.
    - Empty input returns an empty tensor.

    Args:
        returns: ``[P, G]`` (P groups of G completions each, groups along the last
            axis) or flat ``[M]`` together with ``group_ids``. Any real dtype; treated as
            constants (detached).
        estimator: a name in :data:`ESTIMATORS` or an :class:`Estimator`.
        group_ids: ``[M]`` integer group label per sample when ``returns`` is flat.
            Labels may be any integers in any order; groups may have different sizes.
            Must be None for ``[P, G]`` input.
        scale: ``"none"``, ``"group"`` or ``"batch"`` (see above).
        eps: added to the standard deviation when scaling; must be > 0.
        batch_std: with ``scale="batch"`` only: the std to divide by instead of the std of
            ``returns`` (a finite number >= 0), e.g. that of the whole batch of which
            ``returns`` is one rank's shard.

    Returns:
        Advantages with the shape of ``returns``: float64 for float64 input, else
        float32.

    Raises:
        ValueError: unknown estimator or scale; ``eps <= 0``; ``returns`` not 1-D or
            2-D; flat returns without ``group_ids`` or ``[P, G]`` returns with them;
            ``group_ids`` of the wrong shape or dtype; a NaN or infinite return (the
            message names its index); ``batch_std`` with another scale, or negative or
            not finite.
    """
    est = resolve_estimator(estimator)
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {list(SCALES)}")
    if scale == "auto":
        scale = est.scale
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    if batch_std is not None:
        if scale != "batch":
            raise ValueError(
                f"batch_std={batch_std!r} is the divisor of scale='batch', but scale={scale!r}; "
                "drop batch_std or set scale='batch'"
            )
        if not (math.isfinite(batch_std) and batch_std >= 0):
            raise ValueError(f"batch_std must be a finite number >= 0, got {batch_std!r}")
    if not isinstance(returns, Tensor):
        raise TypeError(f"returns must be a torch.Tensor, got {type(returns).__name__}")
    dtype = torch.float64 if returns.dtype == torch.float64 else torch.float32
    values = returns.detach().to(dtype)

    if values.dim() == 2:
        if group_ids is not None:
            raise ValueError(
                "returns of shape [P, G] already define the groups (the last axis); "
                "pass group_ids only with flat [M] returns"
            )
        num_prompts, group_size = values.shape
        flat = values.reshape(-1)
        ids: Tensor | None = None
        num_groups = num_prompts
    elif values.dim() == 1:
        if group_ids is None:
            raise ValueError(
                "flat returns of shape [M] need group_ids [M]; or pass returns as [P, G] "
                "with the group along the last axis"
            )
        flat = values
        group_size = 0
        ids, num_groups = _dense_group_ids(group_ids.to(values.device), flat.numel())
    else:
        raise ValueError(f"returns must be [P, G] or flat [M], got shape {list(returns.shape)}")
    _check_finite(values)
    if flat.numel() == 0:
        return values.clone()

    group_scale: Literal["none", "group"] = "group" if scale == "group" else "none"
    baseline = loo_max_baseline if est.baseline == "loo_max" else est.baseline
    if isinstance(baseline, str):
        if ids is None:
            adv = group_advantages(
                flat, group_size=group_size, baseline=baseline, scale=group_scale, eps=eps
            )
        else:
            adv = group_advantages(
                flat, group_ids=ids, baseline=baseline, scale=group_scale, eps=eps
            )
        adv = adv.to(dtype)
    else:
        if ids is None:
            ids = torch.arange(num_groups, device=flat.device).repeat_interleave(group_size)
        adv = _custom_baseline_advantages(
            flat, ids, num_groups, baseline=baseline, scale=group_scale, eps=eps
        )
    if scale == "batch":
        std = flat.std(correction=0) if batch_std is None else batch_std
        adv = adv / (std + eps)
    return adv.reshape(values.shape)
