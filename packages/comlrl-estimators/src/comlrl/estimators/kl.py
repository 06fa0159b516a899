"""Per-token estimators of the KL divergence to a reference model (k1, k2, k3 of Schulman
2020), and what each is good for: :func:`kl_penalty`. The policy loss takes k2 or k3 as a
loss term (:func:`comlrl.estimators.losses.policy_loss`); a penalty in the reward takes any
of them summed over a completion (:func:`comlrl.estimators.kl_reward.sequence_kl`)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["KL_ESTIMATORS", "LOSS_KL_ESTIMATORS", "k1_loss_message", "kl_penalty"]

#: Accepted values of ``kl_penalty(estimator=...)``.
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")

#: The estimators whose gradient as a loss term regularises: k2 follows
#: ``KL(pi || pi_ref)``, k3 ``KL(pi_ref || pi)``; k1's expected gradient is 0.
LOSS_KL_ESTIMATORS: tuple[str, ...] = ("k2", "k3")

KLEstimator = Literal["k1", "k2", "k3"]


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator = "k3") -> Tensor:
    """Per-token estimators of a KL divergence between ``pi`` and ``pi_ref``, from tokens
    sampled from ``pi``.

    With ``d = ref_logprobs - logprobs`` (``log(pi_ref / pi)`` at the sampled token),
    following Schulman 2020, "Approximating KL Divergence"
    (http://joschu.net/blog/kl-approx.html). The *value* of each, averaged over samples
    from ``pi``, estimates ``KL(pi || pi_ref)`` (k1 and k3 without bias, k2 with a small
    bias). Their *gradients* as a loss term (the samples held fixed, only ``logprobs``
    differentiated, ``E_{x~pi}[grad k(x)]``) follow different divergences:

    =====  ============================  ============================================
    name   per-token value               expected gradient as a loss term
    =====  ============================  ============================================
    k1     ``-d = logp - ref_logp``      ``E[grad log pi] = 0``: no regularisation at
                                         all, only variance. k1 belongs in the
                                         *reward* (``r - beta * sum_t k1``, the
                                         PPO-RLHF penalty of Ziegler et al. 2019),
                                         where the policy gradient carries it;
                                         :func:`policy_loss` refuses it as a loss.
    k2     ``0.5 * d**2``                ``E[-d * grad log pi] = grad KL(pi || pi_ref)``
    k3     ``exp(d) - d - 1``            ``E[(1 - pi_ref / pi) grad log pi]
                                         = grad KL(pi_ref || pi)`` (the reverse
                                         direction; the GRPO objective, Shao et al.
                                         2024 (DeepSeekMath) eq. 4)
    =====  ============================  ============================================

    In a sequence these are the KLs of each token's next-token distributions at the
    sampled prefixes. k3 is computed as ``expm1(d) - d``, which is accurate for small
    ``d`` and never negative in floating point. Tested by exact enumeration over a small
    categorical (``tests/test_losses.py``).

    Args:
        logprobs: ``[B, L]`` (any shape) log-probs under the policy ``pi``.
        ref_logprobs: same shape, log-probs under the reference model ``pi_ref``.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        Tensor of the common shape and promoted dtype; differentiable in both inputs.
        No masking: apply the completion mask to the result.

    Raises:
        ValueError: unknown estimator or mismatched shapes.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; use one of {list(KL_ESTIMATORS)}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {list(logprobs.shape)} and ref_logprobs "
            f"{list(ref_logprobs.shape)} must have the same shape"
        )
    d = ref_logprobs - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    return torch.expm1(d) - d


def k1_loss_message(kl_coef: float) -> str:
    """Why ``kl_estimator="k1"`` cannot be a loss term, and what to use instead."""
    return (
        f"kl_estimator='k1' with kl_coef={kl_coef}: as a loss term k1's expected gradient "
        "is 0 (E_pi[grad log pi] = 0), so it regularises nothing. k1 belongs in the reward "
        "as a penalty (reward - beta * sum_t (logp - ref_logp)); as a loss use "
        "kl_estimator='k3' (gradient of KL(pi_ref || pi), the GRPO default) or 'k2' "
        "(gradient of KL(pi || pi_ref))"
    )
