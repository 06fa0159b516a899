"""group_advantages: per-group baselines and optional std scaling, in one pass."""

from __future__ import annotations

import torch

from . import _dispatch as dispatch
from . import _reference as ref

__all__ = ["BASELINES", "SCALES", "group_advantages"]

BASELINES = {"none": 0, "mean": 1, "loo": 2, "max": 3}
SCALES = {"none": 0, "group": 1}


def _compact_ids(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map labels to indices in [0, num_groups). Labels spanning a small range (the usual
    0..G-1 prompt indices) are shifted, with no sort; empty slots are harmless groups of
    size 0. Otherwise torch.unique compacts them."""
    m = group_ids.numel()
    lo, hi = torch.aminmax(group_ids)
    span = int(hi) - int(lo) + 1
    if span <= 2 * m + 1024:
        return (group_ids - lo).contiguous(), span
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse.contiguous(), int(uniq.numel())


def _raise_bad(rewards: torch.Tensor, index: int) -> None:
    raise ValueError(
        f"rewards[{index}] = {rewards[index].item()} is not finite; group advantages need "
        f"finite rewards (replace NaN/inf rewards, e.g. with a failure reward, before this call)"
    )


def group_advantages(
    rewards: torch.Tensor,
    *,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    baseline: str = "mean",
    scale: str = "none",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages ``A_i = (r_i - b_g) / s_g`` of rewards grouped by prompt.

    Args:
        rewards: [M] float32 or float64 (float16/bfloat16 are computed in float32); the
            rewards (returns) of M completions.
        group_size: G for fixed contiguous groups ``[0, G), [G, 2G), ...``; M % G == 0.
        group_ids: [M] integer labels instead of group_size; groups may have any size and
            their members need not be adjacent or sorted. Exactly one of the two is given.
        baseline: ``b_g`` of the group g of element i (G_g members):

            - ``"none"``: 0 (REINFORCE, Williams 1992).
            - ``"mean"``: group mean (GRPO, Shao et al. 2024; Dr. GRPO, Liu et al. 2025).
            - ``"loo"``: mean of the other G_g - 1 members (RLOO, Kool et al. 2019;
              Ahmadian et al. 2024), computed as ``A = G_g / (G_g - 1) * (r_i - mean_g)``.
            - ``"max"``: group max, so A <= 0 (ReMax-style, Li et al. 2023).
        scale: ``"none"`` (s_g = 1) or ``"group"``: ``s_g = std_g + eps`` with std_g the
            population standard deviation (ddof=0) of the group's rewards. The rewards'
            std is used, not the advantages', and advantages are not re-centred, so the
            four baselines stay distinct under scaling.
        eps: added to the std under ``scale="group"``.

    Returns:
        Advantages [M] in the rewards' dtype (computed in float64).

    Defined edge cases:
        - singleton groups: A = 0 under ``mean``, ``loo`` (the leave-one-out baseline of a
          group of one is defined as the reward itself) and ``max``; A = r under ``none``.
        - all-equal groups: A = 0 under ``mean``/``loo``/``max`` with either scale
          (std 0 gives 0 / eps = 0). Note ``baseline="none", scale="group"`` divides the raw
          rewards by ``0 + eps`` for such groups.

    Raises:
        ValueError: a NaN/inf reward (naming the first bad index), bad shapes, both or
            neither of group_size/group_ids, M % group_size != 0, unknown baseline/scale.
        BackendUnavailableError: a forced backend cannot serve the call.

    Backends: torch (vectorized, no per-group Python loop), C++ (one pass over group ids
    shifted to start at 0, or compacted by ``torch.unique`` when sparse), CUDA (one kernel launch, one block per group; with
    group_ids the members are first ordered by ``torch.sort``).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [M], got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a floating tensor, got {rewards.dtype}")
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; expected one of {tuple(BASELINES)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; expected one of {tuple(SCALES)}")
    eps = float(eps)
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    m = rewards.numel()
    if (group_size is None) == (group_ids is None):
        raise ValueError("pass exactly one of group_size (fixed groups) or group_ids (labels)")
    if group_size is not None:
        group_size = int(group_size)
        if group_size < 1 or m % group_size != 0:
            raise ValueError(
                f"group_size must be >= 1 and divide M = {m}; got group_size={group_size}"
            )
    else:
        assert group_ids is not None
        if group_ids.shape != rewards.shape:
            raise ValueError(f"group_ids must be [M] = [{m}], got shape {tuple(group_ids.shape)}")
        if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
            raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
        if group_ids.device != rewards.device:
            raise ValueError(f"group_ids are on {group_ids.device} but rewards on {rewards.device}")
        group_ids = group_ids.to(torch.int64)

    work = rewards if rewards.dtype in (torch.float32, torch.float64) else rewards.float()
    work = work.contiguous()
    backend = dispatch.select("group_advantages", rewards.device)
    if m == 0:
        return torch.empty_like(rewards)

    def native() -> torch.Tensor:
        out = torch.empty_like(work)
        code = dispatch.DTYPE_CODES[work.dtype]
        b, s = BASELINES[baseline], SCALES[scale]
        if backend == "cpu":
            if group_ids is None:
                idx_ptr, num_groups, gs = 0, m // int(group_size or 1), int(group_size or 1)
                bad = dispatch.cpu_module().group_advantages(
                    work.data_ptr(), code, m, idx_ptr, num_groups, gs, b, s, eps, out.data_ptr()
                )
            else:
                inverse, num_groups = _compact_ids(group_ids)
                bad = dispatch.cpu_module().group_advantages(
                    work.data_ptr(),
                    code,
                    m,
                    inverse.data_ptr(),
                    num_groups,
                    0,
                    b,
                    s,
                    eps,
                    out.data_ptr(),
                )
        else:
            dev = work.device
            device_index = dev.index if dev.index is not None else torch.cuda.current_device()
            bad_buf = torch.empty(1, dtype=torch.int64, device=dev)
            if group_ids is None:
                perm_ptr = off_ptr = 0
                num_groups, gs = m // int(group_size or 1), int(group_size or 1)
                keep: tuple[torch.Tensor, ...] = ()
            else:
                sorted_ids, perm = torch.sort(group_ids, stable=True)
                _, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
                offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=dev)
                torch.cumsum(counts, 0, out=offsets[1:])
                keep = (perm, offsets)
                perm_ptr, off_ptr = perm.data_ptr(), offsets.data_ptr()
                num_groups, gs = counts.numel(), 0
            dispatch.cuda_module().group_advantages(
                work.data_ptr(),
                code,
                m,
                perm_ptr,
                off_ptr,
                num_groups,
                gs,
                b,
                s,
                eps,
                out.data_ptr(),
                bad_buf.data_ptr(),
                device_index,
                dispatch.cuda_stream(dev),
            )
            bad = int(bad_buf.item())  # synchronizes; needed to raise on NaN/inf
            del keep
        if bad >= 0:
            _raise_bad(rewards, bad)
        return out

    def reference() -> torch.Tensor:
        return ref.group_advantages_torch(work, group_size, group_ids, baseline, scale, eps)

    out, _ = dispatch.run("group_advantages", backend, native, reference)
    return out.to(rewards.dtype)
