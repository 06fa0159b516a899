"""The reference KL as a penalty on each completion's return (KL in the reward).

Two standard ways keep an RL-tuned policy ``pi`` near a reference ``pi_ref``:

- a loss term: ``kl_coef * k(t)`` per token added to the policy loss
  (:func:`comlrl.estimators.losses.policy_loss` with ``kl_coef``; GRPO's, Shao et al. 2024
  (DeepSeekMath) eq. 3-4);
- a reward penalty: each sampled completion ``y`` of prompt ``x`` is scored
  ``R(x, y) - beta * KL_hat(y)``, with ``KL_hat(y) = sum_t k(t)`` summed over its tokens
  and held fixed (no gradient flows through it); the policy gradient then carries the
  penalty through the advantage. This is the PPO-RLHF objective of Ziegler et al. 2019
  ("Fine-Tuning Language Models from Human Preferences", the reward
  ``r(x, y) - beta * log(pi(y|x) / rho(y|x))``) and Ouyang et al. 2022 (InstructGPT) eq. 2,
  and CoMLRL 1.4.3's ``reference_kl_coef`` (``k3`` summed per completion, subtracted from
  each completion's return before its advantage).

:func:`sequence_kl` computes ``KL_hat(y)``; the caller subtracts ``beta * KL_hat`` from the
returns. Named axes: ``B`` completions, ``L`` completion tokens.
"""

from __future__ import annotations

import torch
from comlrl.estimators.kl import KL_ESTIMATORS, KLEstimator, kl_penalty
from torch import Tensor

__all__ = ["sequence_kl"]


def sequence_kl(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: KLEstimator = "k3"
) -> Tensor:
    """Each completion's summed per-token KL estimate ``sum_t k(t)``, detached: the
    ``KL_hat(y)`` of the reward penalty ``R - beta * KL_hat(y)`` (module docstring).

    ``k(t)`` is :func:`comlrl.estimators.kl.kl_penalty`'s estimator at token ``t``
    (Schulman 2020, "Approximating KL Divergence"); every estimator is valid here, ``k1``
    included (``log pi - log pi_ref``, the classic penalty; as a reward its expectation is
    the sequence KL). ``k3`` (``exp(d) - d - 1``, ``d = log pi_ref - log pi``; never
    negative) is CoMLRL 1.4.3's.

    Args:
        logprobs: ``[B, L]`` float log-probs of the sampled tokens under ``pi``.
        ref_logprobs: ``[B, L]`` float, the same tokens under ``pi_ref``.
        mask: ``[B, L]`` bool or 0/1, True on the completion's own tokens (padding and
            observation tokens excluded).
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[B]`` float32 (float64 for float64 input), no gradient: 0 for a completion without
        valid tokens.

    Raises:
        ValueError: an unknown estimator, or shapes that are not one ``[B, L]``.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; use one of {list(KL_ESTIMATORS)}")
    if logprobs.dim() != 2 or ref_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            f"logprobs {list(logprobs.shape)}, ref_logprobs {list(ref_logprobs.shape)} and "
            f"mask {list(mask.shape)} must all be one [B, L] shape"
        )
    dtype = torch.float64 if logprobs.dtype == torch.float64 else torch.float32
    with torch.no_grad():
        per_token = kl_penalty(
            logprobs.detach().to(dtype), ref_logprobs.detach().to(dtype), estimator
        )
        # where, not a product: a masked position's log-probs may be anything (-inf)
        return torch.where(mask.to(torch.bool), per_token, per_token.new_zeros(())).sum(dim=-1)
