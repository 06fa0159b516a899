"""Importance weights between the sampler and the trainer: the mismatch, its truncated
correction, and the sequence-level ratio of GSPO.

The completions of a step are sampled by one engine (the native sampler's KV-cached
decode step, a vLLM engine, a bf16 model) and their log-probs recomputed by the trainer's
forward. In exact arithmetic both are ``log pi_theta_old(y_t | prefix)``; in practice the
two engines' numerics differ (other kernels, other dtypes), so the completions are slightly
off-policy for the trainer even before any optimizer step.

- :func:`sampler_mismatch`: how far apart they are, per token: ``|log pi_trainer -
  log pi_behaviour|`` and an estimate of ``KL(pi_behaviour || pi_trainer)``.
- :func:`truncated_importance_weights`: the truncated importance-sampling (TIS)
  correction of Yao et al. 2025 ("Your efficient RL framework secretly brings you
  off-policy RL training"): each token's policy-gradient term is multiplied by
  ``min(pi_trainer / pi_behaviour, C)``, token by token or once per sequence.
- :func:`sequence_log_ratio`: GSPO's length-normalised sequence log-ratio (Zheng et al.
  2025, "Group Sequence Policy Optimization", arXiv 2507.18071, eq. 7), used by
  :func:`comlrl.estimators.losses.policy_loss` with ``importance_level="sequence"``.

Named axes: ``B`` completions, ``L`` completion tokens (padded). Log-probs are natural-log
probabilities of the sampled tokens; ``mask [B, L]`` marks the valid tokens. Masked
entries may hold anything (``-inf``, NaN): they are replaced before any arithmetic.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch
from torch import Tensor

__all__ = [
    "TIS_LEVELS",
    "sampler_mismatch",
    "sequence_log_ratio",
    "truncated_importance_weights",
]

#: Accepted values of ``truncated_importance_weights(level=...)``.
TIS_LEVELS: tuple[str, ...] = ("token", "sequence")

Level = Literal["token", "sequence"]


def _check(trainer: Tensor, behaviour: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The valid mask (bool) and both log-prob tensors with masked entries set to 0, in
    float32 (float64 for float64 ``trainer``), detached."""
    if trainer.dim() != 2 or not trainer.dtype.is_floating_point:
        raise ValueError(
            f"trainer log-probs must be a floating tensor [B, L], got shape "
            f"{list(trainer.shape)} dtype {trainer.dtype}"
        )
    for name, other in (("behaviour log-probs", behaviour), ("mask", mask)):
        if other.shape != trainer.shape:
            raise ValueError(
                f"{name} must have the shape of the trainer log-probs {list(trainer.shape)}, "
                f"got {list(other.shape)}"
            )
    dtype = torch.float64 if trainer.dtype == torch.float64 else torch.float32
    valid = mask.to(device=trainer.device, dtype=torch.bool)
    zero = torch.zeros((), dtype=dtype, device=trainer.device)
    lt = torch.where(valid, trainer.detach().to(dtype), zero)
    lb = torch.where(valid, behaviour.detach().to(device=trainer.device, dtype=dtype), zero)
    return valid, lt, lb


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO's length-normalised sequence log-ratio, ``log s_i = (1 / |y_i|) sum_t
    (log pi(y_it) - log pi_old(y_it))`` (Zheng et al. 2025, arXiv 2507.18071, eq. 7:
    ``s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|)``).

    Differentiable in ``logprobs`` (``old_logprobs`` are constants); a sequence with no
    valid token gets 0 (ratio 1).

    Args:
        logprobs: ``[B, L]`` floating log-probs under the current policy.
        old_logprobs: ``[B, L]`` log-probs under the policy that sampled (or the trainer's
            own at sampling time).
        mask: ``[B, L]`` bool (or 0/1) valid tokens.

    Returns:
        ``[B]`` in float32 (float64 for float64 ``logprobs``).

    Raises:
        ValueError: shapes differ or ``logprobs`` is not a floating ``[B, L]`` tensor.
    """
    valid, _, old = _check(logprobs, old_logprobs, mask)
    dtype = old.dtype
    logp = torch.where(valid, logprobs.to(dtype), torch.zeros((), dtype=dtype, device=old.device))
    counts = valid.sum(dim=1).clamp(min=1).to(dtype)
    return (logp - old).sum(dim=1) / counts


def truncated_importance_weights(
    trainer_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    mask: Tensor,
    *,
    cap: float = 2.0,
    level: Level = "token",
) -> Tensor:
    """Truncated importance-sampling weights from the sampler to the trainer.

    Yao et al. 2025 ("Your efficient RL framework secretly brings you off-policy RL
    training", the TIS correction): the gradient of a completion sampled by the engine
    ``pi_behaviour`` but differentiated through the trainer ``pi_trainer`` is re-weighted
    by their ratio, truncated at ``C`` to bound its variance:

    - ``level="token"``: ``w_it = min(exp(l_it - b_it), C)`` with ``l`` the trainer's and
      ``b`` the behaviour log-prob of token ``t`` of completion ``i``;
    - ``level="sequence"``: ``w_i = min(exp(sum_t (l_it - b_it)), C)``, the ratio of the
      whole completion's probabilities, the same for each of its tokens.

    Weights are constants (no gradient): the loss multiplies each token's
    policy-gradient term by them (:func:`~comlrl.estimators.losses.policy_loss`'s
    ``importance_weights``). Masked tokens get weight 1. Computed in log space
    (``exp(min(log w, log C))``), so a long sequence's sum cannot overflow.

    Args:
        trainer_logprobs: ``[B, L]`` the trainer's log-probs of the sampled tokens at the
            sampling weights (detached here).
        behaviour_logprobs: ``[B, L]`` the sampler's log-probs of the same tokens.
        mask: ``[B, L]`` bool (or 0/1) valid tokens.
        cap: ``C >= 1``.
        level: ``"token"`` or ``"sequence"``.

    Returns:
        ``[B, L]`` weights in ``(0, C]``, float32 (float64 for float64 trainer log-probs).

    Raises:
        ValueError: shapes differ; unknown ``level``; ``cap < 1`` or not finite.
    """
    if level not in TIS_LEVELS:
        raise ValueError(f"unknown TIS level {level!r}; use one of {list(TIS_LEVELS)}")
    if not (math.isfinite(cap) and cap >= 1.0):
        raise ValueError(f"the TIS cap C must be a finite number >= 1, got {cap!r}; e.g. 2.0")
    valid, lt, lb = _check(trainer_logprobs, behaviour_logprobs, mask)
    log_ratio = lt - lb  # 0 on masked tokens
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(lt)
    weights = torch.exp(torch.clamp(log_ratio, max=math.log(cap))).clamp(max=cap)
    return torch.where(valid, weights, torch.ones_like(weights))


@overload
def sampler_mismatch(
    trainer_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, *, sync: Literal[True] = ...
) -> dict[str, float]: ...


@overload
def sampler_mismatch(
    trainer_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, *, sync: Literal[False]
) -> dict[str, Tensor]: ...


def sampler_mismatch(
    trainer_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, *, sync: bool = True
) -> dict[str, float] | dict[str, Tensor]:
    """How far the sampler's log-probs are from the trainer's, over the valid tokens.

    With ``d_t = l_t - b_t`` (trainer minus behaviour log-prob of a sampled token):

    - ``mismatch_abs_logp_diff``: the token mean of ``|d_t|`` (nats);
    - ``mismatch_kl``: the token mean of ``exp(d_t) - d_t - 1`` (Schulman 2020's k3),
      an unbiased, nonnegative estimate of ``KL(pi_behaviour || pi_trainer)`` per token,
      since the tokens were drawn from ``pi_behaviour``;
    - ``num_tokens``: the valid tokens they average over (to weigh several calls).

    0 for both on exact log-probs; the token means over zero tokens are 0.

    Args:
        trainer_logprobs, behaviour_logprobs, mask: as in
            :func:`truncated_importance_weights`.
        sync: Python floats (one device-to-host copy); ``False``: 0-dim float64 tensors
            on the device (no host synchronisation).

    Returns:
        The three values by name.

    Raises:
        ValueError: shapes differ.
    """
    valid, lt, lb = _check(trainer_logprobs, behaviour_logprobs, mask)
    d = lt - lb
    count = valid.sum()
    denom = count.clamp(min=1).to(d.dtype)
    values = torch.stack(
        [d.abs().sum() / denom, (torch.expm1(d) - d).sum() / denom, count.to(d.dtype)]
    )
    names = ("mismatch_abs_logp_diff", "mismatch_kl", "num_tokens")
    if not sync:
        return dict(zip(names, values.to(torch.float64).unbind(), strict=True))
    return dict(zip(names, values.tolist(), strict=True))
