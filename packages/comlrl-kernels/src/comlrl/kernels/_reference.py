"""Pure-torch reference implementations: the specification of every kernel.

Two kinds of functions live here:

- ``*_reference``: differentiable, written for clarity; tests compare every backend
  against them (outputs and gradients) and gradcheck them in float64.
- ``token_logprobs_stats`` / ``token_logprobs_grad`` / ``group_advantages_torch``: the
  torch fallback backend used by the autograd Functions. They work on row chunks so a
  float32 ``[N, V]`` tensor never exists for low-precision inputs.

Conventions (shared by all backends):

- ``z = logits.float() / temperature``; ``lse = logsumexp(z)``; ``logp = z[target] - lse``.
- entropy ``H = -sum_j p_j log p_j`` with ``p = softmax(z)`` and ``0 log 0 = 0``.
- rows whose target equals ``ignore_index`` get logp 0, entropy 0 and zero gradient.
- group advantages are computed in float64 and returned in the rewards' dtype.
"""

from __future__ import annotations

import torch

__all__ = [
    "group_advantages_reference",
    "group_advantages_torch",
    "linear_token_logprobs_reference",
    "token_logprobs_grad",
    "token_logprobs_reference",
    "token_logprobs_stats",
]

# Rows per chunk so a float32 chunk holds at most 2**24 elements (64 MiB).
_CHUNK_ELEMENTS = 1 << 24


def _rows_per_chunk(vocab: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, vocab))


def check_targets(targets: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Raise ValueError naming the first target outside [0, vocab) that is not ignored."""
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= vocab))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"targets[{i}] = {int(targets[i])} is outside [0, {vocab}) and is not "
            f"ignore_index ({ignore_index})"
        )


def token_logprobs_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    ignore_index: int = -100,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Differentiable spec of :func:`comlrl.kernels.token_logprobs` (materializes [N, V]).

    logits [N, V] (any float dtype), targets [N] int64 -> logp [N] float32 (float64 for
    float64 logits), and entropy [N] when ``return_entropy``.
    """
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    z = logits.to(out_dtype) / temperature
    keep = targets != ignore_index
    safe = torch.where(keep, targets, torch.zeros_like(targets))
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(1, safe.unsqueeze(1)).squeeze(1)
    logp = torch.where(keep, logp, torch.zeros_like(logp))
    if not return_entropy:
        return logp
    p = logp_all.exp()
    # 0 log 0 = 0; mask log p itself (not p * log p) so no 0 * -inf reaches autograd.
    safe_logp = torch.where(p > 0, logp_all, torch.zeros_like(logp_all))
    entropy = -(p * safe_logp).sum(-1)
    entropy = torch.where(keep, entropy, torch.zeros_like(entropy))
    return logp, entropy


def linear_token_logprobs_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Differentiable spec of :func:`comlrl.kernels.linear_token_logprobs`:
    ``token_logprobs(hidden @ weight.T, targets)`` with the logits fully materialized."""
    logits = hidden @ weight.t()
    out = token_logprobs_reference(
        logits, targets, temperature=temperature, ignore_index=ignore_index
    )
    assert isinstance(out, torch.Tensor)
    return out


@torch.no_grad()
def token_logprobs_stats(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    want_entropy: bool,
    ignore_index: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Torch-backend forward: (logp [N], lse [N], entropy [N] or None), all float32
    (float64 for float64 logits), computed chunk by chunk over rows."""
    n, vocab = logits.shape
    check_targets(targets, vocab, ignore_index)
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logp = torch.empty(n, dtype=acc, device=logits.device)
    lse = torch.empty(n, dtype=acc, device=logits.device)
    entropy = torch.empty(n, dtype=acc, device=logits.device) if want_entropy else None
    keep = targets != ignore_index
    safe = torch.where(keep, targets, torch.zeros_like(targets))
    step = _rows_per_chunk(vocab)
    for s in range(0, n, step):
        e = min(n, s + step)
        z = logits[s:e].to(acc) / temperature
        l_c = torch.logsumexp(z, dim=-1)
        lse[s:e] = l_c
        logp[s:e] = z.gather(1, safe[s:e].unsqueeze(1)).squeeze(1) - l_c
        if entropy is not None:
            # shift by the row max first so large |z| loses no precision in z - lse
            d = z.sub_(z.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(acc).min))
            logp_all = d.sub_(torch.logsumexp(d, dim=-1, keepdim=True))
            p = logp_all.exp()
            entropy[s:e] = -torch.where(p > 0, p * logp_all, torch.zeros_like(p)).sum(-1)
    zero = torch.zeros((), dtype=acc, device=logits.device)
    logp = torch.where(keep, logp, zero)
    lse = torch.where(keep, lse, zero)
    if entropy is not None:
        entropy = torch.where(keep, entropy, zero)
    return logp, lse, entropy


@torch.no_grad()
def token_logprobs_grad(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    ignore_index: int,
    lse: torch.Tensor,
    g_logp: torch.Tensor,
    g_entropy: torch.Tensor | None,
    entropy: torch.Tensor | None,
    out: torch.Tensor,
) -> torch.Tensor:
    """Torch-backend backward: write d(loss)/d(logits) into ``out`` (logits dtype; may be
    ``logits`` itself) chunk by chunk, recomputing softmax from the saved ``lse``.

    grad = [g_logp * (onehot - p) - g_entropy * p * (log p + H)] / T, zero for ignored rows.
    A target outside [0, V) that is not ``ignore_index`` adds no one-hot term (the row's
    target lies in another block of columns; see linear_token_logprobs' backward).
    """
    n, vocab = logits.shape
    acc = lse.dtype
    keep = targets != ignore_index
    inside = keep & (targets >= 0) & (targets < vocab)
    safe = torch.where(inside, targets, torch.zeros_like(targets))
    step = _rows_per_chunk(vocab)
    for s in range(0, n, step):
        e = min(n, s + step)
        z = logits[s:e].to(acc) / temperature
        logp_all = z.sub_(lse[s:e].unsqueeze(1))
        p = logp_all.exp()
        g = g_logp[s:e].to(acc).unsqueeze(1)
        grad = -g * p
        grad.scatter_add_(1, safe[s:e].unsqueeze(1), torch.where(inside[s:e].unsqueeze(1), g, 0.0))
        if g_entropy is not None and entropy is not None:
            gh = g_entropy[s:e].to(acc).unsqueeze(1)
            h = entropy[s:e].unsqueeze(1)
            term = torch.where(p > 0, p * (logp_all + h), torch.zeros_like(p))
            grad -= gh * term
        grad /= temperature
        # ignored rows carry lse 0, so their p may overflow: select, never multiply by 0
        grad = torch.where(
            keep[s:e].unsqueeze(1), grad, torch.zeros((), dtype=acc, device=grad.device)
        )
        out[s:e].copy_(grad)
    return out


def _group_index(
    rewards: torch.Tensor, group_size: int | None, group_ids: torch.Tensor | None
) -> tuple[torch.Tensor, int]:
    m = rewards.numel()
    if group_ids is None:
        assert group_size is not None
        idx = torch.arange(m, device=rewards.device) // group_size
        return idx, m // group_size
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniq.numel())


def check_finite(rewards: torch.Tensor) -> None:
    """Raise ValueError naming the first non-finite reward."""
    bad = ~torch.isfinite(rewards)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"rewards[{i}] = {rewards[i].item()} is not finite; group advantages need finite "
            f"rewards (replace NaN/inf rewards, e.g. with a failure reward, before this call)"
        )


def group_advantages_torch(
    rewards: torch.Tensor,
    group_size: int | None,
    group_ids: torch.Tensor | None,
    baseline: str,
    scale: str,
    eps: float,
) -> torch.Tensor:
    """Vectorized torch version of the group advantages (no per-group Python loop).

    See :func:`comlrl.kernels.group_advantages` for the definitions. Computes in float64,
    returns the rewards' dtype.
    """
    check_finite(rewards)
    r = rewards.to(torch.float64)
    m = r.numel()
    idx, num_groups = _group_index(rewards, group_size, group_ids)
    count = torch.zeros(num_groups, dtype=torch.float64, device=r.device)
    count.index_add_(0, idx, torch.ones_like(r))
    total = torch.zeros_like(count).index_add_(0, idx, r)
    mean = total / count.clamp_min(1.0)
    if baseline == "none":
        adv = r.clone()
    elif baseline == "mean":
        adv = r - mean[idx]
    elif baseline == "loo":
        n = count[idx]
        factor = torch.where(n > 1, n / (n - 1).clamp_min(1.0), torch.zeros_like(n))
        adv = (r - mean[idx]) * factor
    elif baseline == "max":
        gmax = torch.full_like(count, float("-inf")).scatter_reduce_(
            0, idx, r, reduce="amax", include_self=True
        )
        adv = r - gmax[idx]
    else:  # validated by the caller
        raise ValueError(f"unknown baseline {baseline!r}")
    if scale == "group" and m > 0:
        sq = torch.zeros_like(count).index_add_(0, idx, (r - mean[idx]) ** 2)
        std = (sq / count.clamp_min(1.0)).sqrt()  # population std (ddof=0)
        adv = adv / (std[idx] + eps)
    return adv.to(rewards.dtype)


def group_advantages_reference(
    rewards: torch.Tensor,
    *,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    baseline: str = "mean",
    scale: str = "none",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Spec of :func:`comlrl.kernels.group_advantages` (the torch backend)."""
    return group_advantages_torch(rewards, group_size, group_ids, baseline, scale, eps)
