"""Token-level policy-gradient losses: completion masks, reference KL, clipped surrogate.

Named axes: ``B`` sequences (completions) in the batch, ``L`` completion tokens (the
padded completion length). All tensors of one call live on one device.

Log-probabilities are natural-log probabilities of the sampled completion tokens. The
loss is computed in float32 (float64 if ``logprobs`` is float64) whatever the input
dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, overload

import torch
from comlrl.estimators.importance import sequence_log_ratio
from comlrl.estimators.kl import (
    KL_ESTIMATORS,
    LOSS_KL_ESTIMATORS,
    KLEstimator,
    k1_loss_message,
    kl_penalty,
)
from torch import Tensor

__all__ = [
    "IMPORTANCE_LEVELS",
    "REDUCTIONS",
    "completion_mask",
    "policy_loss",
]

#: Accepted values of ``policy_loss(importance_level=...)``: PPO's token ratio, GSPO's.
IMPORTANCE_LEVELS: tuple[str, ...] = ("token", "sequence")

#: Accepted values of ``policy_loss(reduction=...)``.
REDUCTIONS: tuple[str, ...] = ("seq_mean_token_mean", "token_mean", "seq_sum")

Reduction = Literal["seq_mean_token_mean", "token_mean", "seq_sum"]
ImportanceLevel = Literal["token", "sequence"]


def completion_mask(
    completion_ids: Tensor,
    eos_token_ids: int | Sequence[int],
    pad_token_id: int | None = None,
) -> Tensor:
    """Which completion tokens count in the loss: up to and including the first EOS.

    A token is True when no EOS token comes before it in its row; the first EOS itself
    is True (the policy chose to stop and is credited for it), every token after it is
    False. A row without EOS (truncated at the length budget) is True throughout.
    Tokens equal to ``pad_token_id`` are False too, except when the pad id is also an
    EOS id and the token is the row's first EOS (models that pad with EOS).

    Args:
        completion_ids: ``[B, L]`` integer token ids of the sampled completions
            (right-padded, prompt not included).
        eos_token_ids: one EOS id or several (e.g. ``[1, 2]``).
        pad_token_id: id used for right padding, or None.

    Returns:
        bool ``[B, L]`` on the device of ``completion_ids``.

    Raises:
        ValueError: ``completion_ids`` not a 2-D integer tensor; no EOS ids given.
    """
    if (
        completion_ids.dim() != 2
        or completion_ids.dtype.is_floating_point
        or (completion_ids.dtype == torch.bool)
    ):
        raise ValueError(
            "completion_ids must be an integer tensor [B, L], got "
            f"shape {list(completion_ids.shape)} dtype {completion_ids.dtype}"
        )
    eos_list = [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids)
    if not eos_list:
        raise ValueError("eos_token_ids is empty; give at least one EOS token id")
    eos = torch.tensor(eos_list, dtype=completion_ids.dtype, device=completion_ids.device)
    is_eos = torch.isin(completion_ids, eos)
    eos_before = is_eos.cumsum(dim=1) - is_eos.to(torch.int64)
    mask = eos_before == 0
    if pad_token_id is not None:
        # A pad id that is also an EOS id is handled by the EOS rule above.
        mask = mask & ~((completion_ids == pad_token_id) & ~is_eos)
    return mask


def seq_sum_message() -> str:
    """Why ``seq_sum`` needs ``max_completion_length``, and what to pass."""
    return (
        "reduction='seq_sum' divides by the generation budget C, a constant: pass "
        "max_completion_length (e.g. the max_new_tokens the completions were sampled with). "
        "Each call's own padded length L would weigh turns and micro-batches of other "
        "lengths differently"
    )


def _clip_bounds(clip_ratio: float | tuple[float, float]) -> tuple[float, float]:
    if isinstance(clip_ratio, tuple):
        if len(clip_ratio) != 2:
            raise ValueError(
                f"clip_ratio must be a float eps or a (low, high) pair, got {clip_ratio!r}"
            )
        low, high = float(clip_ratio[0]), float(clip_ratio[1])
    elif isinstance(clip_ratio, int | float) and not isinstance(clip_ratio, bool):
        low = high = float(clip_ratio)
    else:
        raise ValueError(
            f"clip_ratio must be a float eps or a (low, high) pair, got {clip_ratio!r}"
        )
    if not (0.0 <= low < 1.0) or not (0.0 <= high < math.inf):
        raise ValueError(
            f"clip_ratio bounds must satisfy 0 <= low < 1 and 0 <= high < inf, got "
            f"low={low!r} high={high!r}; e.g. 0.2 or (0.2, 0.28)"
        )
    return low, high


def _check_same_shape(name: str, tensor: Tensor, shape: torch.Size) -> None:
    if tensor.shape != shape:
        raise ValueError(
            f"{name} must have the shape of logprobs {list(shape)}, got {list(tensor.shape)}"
        )


@overload
def policy_loss(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    old_logprobs: Tensor | None = None,
    clip_ratio: float | tuple[float, float] | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    reduction: Reduction = "seq_mean_token_mean",
    max_completion_length: int | None = None,
    importance_weights: Tensor | None = None,
    importance_level: ImportanceLevel = "token",
    sync: Literal[True] = ...,
) -> tuple[Tensor, dict[str, float]]: ...


@overload
def policy_loss(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    old_logprobs: Tensor | None = None,
    clip_ratio: float | tuple[float, float] | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    reduction: Reduction = "seq_mean_token_mean",
    max_completion_length: int | None = None,
    importance_weights: Tensor | None = None,
    importance_level: ImportanceLevel = "token",
    sync: Literal[False],
) -> tuple[Tensor, dict[str, Tensor]]: ...


def policy_loss(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    old_logprobs: Tensor | None = None,
    clip_ratio: float | tuple[float, float] | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    reduction: Reduction = "seq_mean_token_mean",
    max_completion_length: int | None = None,
    importance_weights: Tensor | None = None,
    importance_level: ImportanceLevel = "token",
    sync: bool = True,
) -> tuple[Tensor, dict[str, float]] | tuple[Tensor, dict[str, Tensor]]:
    """Policy-gradient loss of a batch of completions, and its metrics.

    Per token ``t`` of sequence ``i`` (advantage ``A_i``, or ``A_it`` if given per token):

    - on-policy (``old_logprobs`` is None): ``l = -A * logp``, the REINFORCE surrogate
      (Williams 1992) whose gradient is ``-A * grad logp``. ``clip_ratio`` has no effect
      here: the ratio to the sampling policy is identically 1.
    - off-policy (``old_logprobs`` given, ``r = exp(logp - old_logprobs)``): without
      ``clip_ratio``, ``l = -r * A``; with it, the PPO clipped surrogate of Schulman et
      al. 2017, eq. 7, ``l = -min(r * A, clip(r, 1 - low, 1 + high) * A)``. A float
      ``clip_ratio`` is ``low = high = eps``; a pair ``(low, high)`` gives the
      asymmetric "clip-higher" of DAPO (Yu et al. 2025), e.g. ``(0.2, 0.28)``.
    - ``importance_level="sequence"``: GSPO (Zheng et al. 2025, "Group Sequence Policy
      Optimization", arXiv 2507.18071, eq. 5-7): one ratio per completion, the
      length-normalised ``s_i = exp(mean_t (logp_it - old_it))``
      (:func:`~comlrl.estimators.importance.sequence_log_ratio`), and one clipped
      term per completion, ``l_i = -min(s_i A_i, clip(s_i, 1 - low, 1 + high) A_i)``, given
      to each of its valid tokens (so ``seq_mean_token_mean`` is GSPO's mean over
      completions). Needs per-sequence advantages ``[B]``. On-policy (no
      ``old_logprobs``) ``s_i = 1`` and the gradient is ``A_i mean_t grad logp_it``, the
      token-level loss's under ``seq_mean_token_mean``. GSPO's clip ranges are far
      narrower than PPO's (3e-4 and 4e-4 in the paper), as ``s_i`` is a geometric mean.
    - ``importance_weights`` ``w`` (constants, e.g. the truncated importance-sampling
      weights of :func:`~comlrl.estimators.importance.truncated_importance_weights`,
      Yao et al. 2025) multiply each token's policy-gradient term above: ``l = -w * A *
      logp`` on-policy, ``-w * min(r * A, clip(r) * A)`` with the clip; not the KL term.
    - reference KL: ``l += kl_coef * kl_penalty(logp, ref_logprobs, kl_estimator)``
      (GRPO, Shao et al. 2024 eq. 3-4). ``"k3"`` (default) pulls toward the reference
      along ``grad KL(pi_ref || pi)``, ``"k2"`` along ``grad KL(pi || pi_ref)``; ``"k1"``
      has zero expected gradient as a loss and is refused when ``kl_coef > 0`` (it is
      still reported as the ``kl`` metric, where its value is an unbiased estimate).

    Reductions over the valid (mask True) tokens, with ``n_i`` valid tokens in
    sequence i:

    - ``"seq_mean_token_mean"``: ``mean_i( sum_t l_it / n_i )`` (GRPO). Every sequence
      weighs ``1 / B``; a sequence with no valid token contributes 0 and still counts
      in ``B``.
    - ``"token_mean"``: ``sum_it l_it / sum_i n_i`` (DAPO, Yu et al. 2025): every token
      weighs the same, so long completions are not down-weighted.
    - ``"seq_sum"``: ``mean_i( sum_t l_it / C )`` with the constant
      ``C = max_completion_length`` (the generation budget, required), as in Dr. GRPO
      (Liu et al. 2025, sec. 3.1: the per-sequence mean over its own length biases long
      wrong answers; a constant does not). It must be the same constant for every call of
      an update: each call's own padded length ``L`` would weigh turns and micro-batches
      padded to other lengths differently. ``C`` bounds the valid tokens of a completion
      (``n_i <= C``), not ``L``: a completion with tool calls is padded wider than the
      budget of the model's tokens by the observations inside it, which are masked.

    Masked tokens get exactly zero gradient, even if their log-probs are -inf or NaN
    (they are replaced before any arithmetic), and an all-masked sequence or batch gives
    a finite loss (0 contribution).

    Args:
        logprobs: ``[B, L]`` floating log-probs of the completion tokens under the
            current policy (carries the gradient).
        advantages: ``[B]`` per sequence or ``[B, L]`` per token; treated as constants.
        mask: ``[B, L]`` bool (or 0/1) valid-token mask, e.g. from :func:`completion_mask`.
        old_logprobs: ``[B, L]`` behaviour log-probs from sampling time, or None.
        clip_ratio: PPO clip ``eps`` or ``(low, high)``; None for no clipping.
        ref_logprobs: ``[B, L]`` reference-model log-probs, or None.
        kl_coef: weight of the KL term (>= 0); needs ``ref_logprobs`` when > 0.
        kl_estimator: ``"k2"`` or ``"k3"`` as a loss (see :func:`kl_penalty`); ``"k1"``
            only with ``kl_coef=0`` (a metric).
        reduction: ``"seq_mean_token_mean"``, ``"token_mean"`` or ``"seq_sum"``.
        importance_weights: ``[B, L]`` (or ``[B]``) nonnegative constants multiplying
            each token's policy-gradient term; None for 1.
        importance_level: ``"token"`` (PPO's per-token ratio) or ``"sequence"`` (GSPO).
        sync: return the metrics as Python floats (one device-to-host copy). ``False``:
            as 0-dim float tensors on the device (float64, no host synchronisation), for
            callers that accumulate them over micro-batches and read them once.
        max_completion_length: the constant ``C`` of ``"seq_sum"`` (>= the valid tokens
            ``n_i`` of every completion; required there, e.g. the ``max_new_tokens`` the
            completions were sampled with); ignored by the other reductions.

    Returns:
        ``(loss, metrics)``: a scalar loss tensor (float32, float64 for float64
        ``logprobs``) and a dict of Python floats (0-dim tensors with ``sync=False``): ``loss``, ``num_tokens``,
        ``advantage_mean`` (token mean), ``ratio_mean``, ``ratio_min``, ``ratio_max``
        (1.0 on-policy), ``clip_fraction`` (share of valid tokens where the clipped
        term is active), ``clip_fraction_low``, ``clip_fraction_high``, and ``kl``
        (token mean of the chosen estimator; only when ``ref_logprobs`` is given).
        Token means over zero tokens are 0.

    Raises:
        ValueError: shape mismatches; ``logprobs`` not floating; unknown reduction or
            KL estimator; ``kl_estimator="k1"`` with ``kl_coef > 0``; invalid
            ``clip_ratio``; ``kl_coef < 0``; ``kl_coef > 0`` without ``ref_logprobs``;
            ``max_completion_length`` < 1, fewer than a completion's valid tokens, or
            missing with ``"seq_sum"``;
            unknown ``importance_level``; ``"sequence"`` with per-token advantages;
            ``importance_weights`` of the wrong shape.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; use one of {list(REDUCTIONS)}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kl_estimator!r}; use one of {list(KL_ESTIMATORS)}")
    if logprobs.dim() != 2 or not logprobs.dtype.is_floating_point:
        raise ValueError(
            "logprobs must be a floating tensor [B, L], got "
            f"shape {list(logprobs.shape)} dtype {logprobs.dtype}"
        )
    shape = logprobs.shape
    num_seqs, length = shape
    _check_same_shape("mask", mask, shape)
    for name, other in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs)):
        if other is not None:
            _check_same_shape(name, other, shape)
    if advantages.shape not in (torch.Size([num_seqs]), shape):
        raise ValueError(
            f"advantages must be [B] = [{num_seqs}] or [B, L] = {list(shape)}, "
            f"got {list(advantages.shape)}"
        )
    if not (math.isfinite(kl_coef) and kl_coef >= 0):
        raise ValueError(f"kl_coef must be a finite number >= 0, got {kl_coef!r}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprobs; pass them or set kl_coef=0")
    if kl_coef > 0 and kl_estimator not in LOSS_KL_ESTIMATORS:
        raise ValueError(k1_loss_message(kl_coef))
    if importance_level not in IMPORTANCE_LEVELS:
        raise ValueError(
            f"unknown importance_level {importance_level!r}; use one of {list(IMPORTANCE_LEVELS)}"
        )
    if importance_level == "sequence" and advantages.dim() != 1:
        raise ValueError(
            "importance_level='sequence' (GSPO) takes one advantage per completion [B], got "
            f"{list(advantages.shape)}; pass per-sequence advantages or use 'token'"
        )
    if importance_weights is not None and importance_weights.shape not in (
        torch.Size([num_seqs]),
        shape,
    ):
        raise ValueError(
            f"importance_weights must be [B] = [{num_seqs}] or [B, L] = {list(shape)}, "
            f"got {list(importance_weights.shape)}"
        )
    bounds = _clip_bounds(clip_ratio) if clip_ratio is not None else None
    if reduction == "seq_sum" and max_completion_length is None:
        raise ValueError(seq_sum_message())
    if reduction == "seq_sum":
        if (
            isinstance(max_completion_length, bool)
            or not isinstance(max_completion_length, int)
            or max_completion_length < 1
        ):
            raise ValueError(
                f"max_completion_length must be an integer >= 1 (the generation budget), got "
                f"{max_completion_length!r}"
            )
        if max_completion_length < length:  # padded wider than C: count the valid tokens
            most = int(mask.to(torch.bool).sum(dim=1).max()) if num_seqs else 0
            if max_completion_length < most:
                raise ValueError(
                    f"max_completion_length={max_completion_length} but a completion has "
                    f"{most} valid tokens; C must be at least the valid (mask True) tokens of "
                    "every completion: pass the budget the completions were sampled with"
                )

    dtype = torch.float64 if logprobs.dtype == torch.float64 else torch.float32
    valid = mask.to(device=logprobs.device, dtype=torch.bool)
    zero = logprobs.new_zeros((), dtype=dtype)
    # Replace masked entries before any arithmetic so that garbage there (-inf, NaN)
    # cannot leak into the loss or, through 0 * inf, into the gradient.
    logp = torch.where(valid, logprobs.to(dtype), zero)
    adv = advantages.detach().to(device=logprobs.device, dtype=dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1).expand(shape)
    adv = torch.where(valid, adv, zero)

    ratio: Tensor | None = None
    clipped_low = clipped_high = None
    if importance_level == "sequence":
        seq_adv = advantages.detach().to(device=logprobs.device, dtype=dtype)
        per_token, ratio, clipped_low, clipped_high = _sequence_surrogate(
            logp, old_logprobs, seq_adv, valid, bounds
        )
    elif old_logprobs is None:
        per_token = -adv * logp
    else:
        old = torch.where(valid, old_logprobs.detach().to(dtype), zero)
        ratio = torch.exp(logp - old)
        surrogate = ratio * adv
        if bounds is None:
            per_token = -surrogate
        else:
            low, high = bounds
            clipped = torch.clamp(ratio, 1.0 - low, 1.0 + high) * adv
            per_token = -torch.minimum(surrogate, clipped)
            with torch.no_grad():
                clipped_low = valid & (ratio < 1.0 - low) & (adv < 0)
                clipped_high = valid & (ratio > 1.0 + high) & (adv > 0)

    if importance_weights is not None:
        w = importance_weights.detach().to(device=logprobs.device, dtype=dtype)
        if w.dim() == 1:
            w = w.unsqueeze(1).expand(shape)
        per_token = torch.where(valid, w, zero) * per_token

    kl: Tensor | None = None
    if ref_logprobs is not None:
        ref = torch.where(valid, ref_logprobs.detach().to(dtype), zero)
        kl = torch.where(valid, kl_penalty(logp, ref, kl_estimator), zero)
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl
    per_token = torch.where(valid, per_token, zero)

    if reduction == "seq_mean_token_mean":
        per_seq = per_token.sum(dim=1) / valid.sum(dim=1).clamp(min=1).to(dtype)
        loss = per_seq.sum() / max(num_seqs, 1)
    elif reduction == "token_mean":
        loss = per_token.sum() / valid.sum().clamp(min=1).to(dtype)
    else:
        assert max_completion_length is not None  # checked above
        loss = per_token.sum() / (max_completion_length * max(num_seqs, 1))

    names, values = _metrics(loss, valid, adv, ratio, clipped_low, clipped_high, kl)
    if not sync:
        return loss, dict(zip(names, values.to(torch.float64).unbind(), strict=True))
    return loss, dict(zip(names, values.tolist(), strict=True))


def _sequence_surrogate(
    logp: Tensor,
    old_logprobs: Tensor | None,
    seq_adv: Tensor,
    valid: Tensor,
    bounds: tuple[float, float] | None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """GSPO's per-sequence clipped surrogate, given to each valid token of its sequence:
    ``-min(s_i A_i, clip(s_i, 1 - low, 1 + high) A_i)`` with ``s_i`` the length-normalised
    sequence ratio; also the ratio and the clipped masks per token (for the metrics)."""
    old = logp.detach() if old_logprobs is None else old_logprobs
    log_s = sequence_log_ratio(logp, old, valid)  # [B], differentiable in logp
    seq_ratio = torch.exp(log_s)
    surrogate = seq_ratio * seq_adv
    clipped_low = clipped_high = None
    if bounds is None:
        per_seq = -surrogate
    else:
        low, high = bounds
        clipped = torch.clamp(seq_ratio, 1.0 - low, 1.0 + high) * seq_adv
        per_seq = -torch.minimum(surrogate, clipped)
        with torch.no_grad():
            clipped_low = valid & ((seq_ratio < 1.0 - low) & (seq_adv < 0))[:, None]
            clipped_high = valid & ((seq_ratio > 1.0 + high) & (seq_adv > 0))[:, None]
    per_token = per_seq[:, None].expand(valid.shape)
    return per_token, seq_ratio.detach()[:, None].expand(valid.shape), clipped_low, clipped_high


def _metrics(
    loss: Tensor,
    valid: Tensor,
    adv: Tensor,
    ratio: Tensor | None,
    clipped_low: Tensor | None,
    clipped_high: Tensor | None,
    kl: Tensor | None,
) -> tuple[list[str], Tensor]:
    """Scalar diagnostics: their names and one stacked tensor of their values (the caller
    fetches them in one transfer, or keeps them on the device)."""
    with torch.no_grad():
        dtype = adv.dtype
        num_tokens = valid.sum().to(dtype)
        denom = num_tokens.clamp(min=1)

        def token_mean(x: Tensor) -> Tensor:
            return torch.where(valid, x, 0).to(dtype).sum() / denom

        one = torch.ones((), dtype=dtype, device=adv.device)
        names = ["loss", "num_tokens", "advantage_mean"]
        values = [loss.detach().to(dtype), num_tokens, token_mean(adv)]
        names += ["ratio_mean", "ratio_min", "ratio_max"]
        if ratio is None or ratio.numel() == 0:
            values += [one, one, one]
        else:
            has_tokens = num_tokens > 0
            values += [
                torch.where(has_tokens, token_mean(ratio), one),
                torch.where(has_tokens, torch.where(valid, ratio, math.inf).min(), one),
                torch.where(has_tokens, torch.where(valid, ratio, -math.inf).max(), one),
            ]
        low = token_mean(clipped_low) if clipped_low is not None else 0 * one
        high = token_mean(clipped_high) if clipped_high is not None else 0 * one
        names += ["clip_fraction", "clip_fraction_low", "clip_fraction_high"]
        values += [low + high, low, high]
        if kl is not None:
            names.append("kl")
            values.append(token_mean(kl))
        return names, torch.stack(values)
