"""Preference and supervised losses over sequence log-probs: DPO, multi-agent DPO, SFT,
Bradley-Terry, and the reward-gap rule that turns scored joint actions into pairs.

Pure functions over tensors (torch only; no ``transformers``). The recipes in
:mod:`comlrl.algos.recipes.preference` compute the log-probs and call these.

Named axes: ``P`` preference pairs, ``A`` agents, ``N`` prompts, ``K`` joint actions per
prompt, ``B`` sequences, ``L`` completion tokens. A *sequence log-prob* is the sum over a
completion's tokens of the natural-log probability of each token (nats). A *log-ratio* is
``log pi(y | x) - log pi_ref(y | x)`` of one completion.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "DPO_LOSS_TYPES",
    "dpo_loss",
    "multi_agent_dpo_loss",
    "bradley_terry_loss",
    "sft_nll",
    "select_preference_pairs",
]

#: Accepted values of ``dpo_loss(loss_type=...)``.
DPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "ipo")

DPOLossType = Literal["sigmoid", "ipo"]


def _check_pair_shapes(names: tuple[str, ...], tensors: tuple[Tensor, ...]) -> None:
    shape = tensors[0].shape
    for name, tensor in zip(names, tensors, strict=True):
        if tensor.shape != shape:
            raise ValueError(
                f"{name} has shape {list(tensor.shape)} but {names[0]} has {list(shape)}; "
                "all log-prob tensors of one call must have the same shape"
            )
        if not tensor.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point tensor, got {tensor.dtype}")


def dpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    loss_type: DPOLossType = "sigmoid",
) -> tuple[Tensor, dict[str, float]]:
    """Direct Preference Optimization loss, mean over ``P`` pairs.

    With the margin ``h = (log pi(y_w|x) - log pi_ref(y_w|x)) - (log pi(y_l|x) -
    log pi_ref(y_l|x))`` of each pair (chosen ``y_w``, rejected ``y_l``):

    - ``"sigmoid"``: ``-log sigmoid(beta * h)`` (Rafailov et al. 2023, "Direct Preference
      Optimization", eq. 7). With ``label_smoothing = eps > 0`` the labels are taken as
      flipped with probability ``eps``: ``-(1 - eps) log sigmoid(beta h) - eps log
      sigmoid(-beta h)`` (conservative DPO, Mitchell 2023, "A note on DPO with noisy
      preferences").
    - ``"ipo"``: ``(h - 1 / (2 beta))**2`` (Azar et al. 2024, "A General Theoretical
      Paradigm to Understand Learning from Human Preferences", eq. 17), where ``beta``
      plays the role of the paper's ``tau``.

    Args:
        chosen_logps: ``[P]`` float sequence log-probs (nats) of the chosen completions
            under the policy (with the autograd graph).
        rejected_logps: ``[P]`` same, rejected completions.
        ref_chosen_logps: ``[P]`` same under the frozen reference model (no graph needed;
            detached here).
        ref_rejected_logps: ``[P]`` same, rejected completions.
        beta: inverse temperature of the implicit reward ``beta * log-ratio``; > 0.
        label_smoothing: ``eps`` in ``[0, 0.5)``; only with ``loss_type="sigmoid"``.
        loss_type: ``"sigmoid"`` (DPO) or ``"ipo"``.

    Returns:
        ``(loss, metrics)``: the scalar loss (float32, or float64 for float64 input), and
        ``margin`` (mean ``h``, nats), ``accuracy`` (fraction of pairs with ``h > 0``),
        ``chosen_reward`` / ``rejected_reward`` (mean ``beta *`` log-ratio).

    Raises:
        ValueError: shapes differ, non-float input, no pairs, ``beta <= 0``, an unknown
            ``loss_type``, or ``label_smoothing`` out of range or used with IPO.
    """
    names = ("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps")
    tensors = (chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    _check_pair_shapes(names, tensors)
    if chosen_logps.dim() != 1 or chosen_logps.numel() == 0:
        raise ValueError(
            f"expected [P] log-probs with P >= 1 pairs, got shape {list(chosen_logps.shape)}"
        )
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; use one of {DPO_LOSS_TYPES}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError(f"label_smoothing={label_smoothing} applies to loss_type='sigmoid' only")
    dtype = torch.float64 if chosen_logps.dtype == torch.float64 else torch.float32
    chosen_ratio = chosen_logps.to(dtype) - ref_chosen_logps.detach().to(dtype)
    rejected_ratio = rejected_logps.to(dtype) - ref_rejected_logps.detach().to(dtype)
    h = chosen_ratio - rejected_ratio
    if loss_type == "ipo":
        loss = ((h - 1.0 / (2.0 * beta)) ** 2).mean()
    else:
        loss = (
            -(1.0 - label_smoothing) * F.logsigmoid(beta * h)
            - label_smoothing * F.logsigmoid(-beta * h)
        ).mean()
    with torch.no_grad():
        metrics = {
            "margin": float(h.mean()),
            "accuracy": float((h > 0).to(dtype).mean()),
            "chosen_reward": float(beta * chosen_ratio.mean()),
            "rejected_reward": float(beta * rejected_ratio.mean()),
        }
    return loss, metrics


def multi_agent_dpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
) -> tuple[Tensor, dict[str, float]]:
    """Multi-agent DPO (MADPO): one DPO loss per agent on the joint preference.

    A pair is two joint actions of one prompt, chosen ``w`` and rejected ``l``. The joint
    policy factorises over the agents, so the joint log-ratio margin is the sum of the
    agents' margins ``h_j = (log pi_j(y_j^w|x_j) - log pi_ref_j(y_j^w|x_j)) - (log
    pi_j(y_j^l|x_j) - log pi_ref_j(y_j^l|x_j))``. Agent ``i`` minimises the DPO loss of
    the joint margin in which every other agent's term is held fixed (stop-gradient
    ``sg``)::

        L_i = -E_pairs[ log sigmoid( beta * ( h_i + sg( sum_{j != i} h_j ) ) ) ]

    so agent ``i``'s parameters get gradient only through its own log-ratios, while its
    step size depends on how well the team already separates the pair. The value of every
    ``L_i`` equals the joint DPO loss (Rafailov et al. 2023, eq. 7, applied to the
    factorised joint policy); only the gradient routing differs. The joint-margin form
    follows CoMLRL 1.4.3's MADPO, with a reference model per agent added here.

    Args:
        chosen_logps: ``[A, P]`` float sequence log-probs (nats) of each agent's part of
            the chosen joint actions under the agent's policy (with graph).
        rejected_logps: ``[A, P]`` same, rejected joint actions.
        ref_chosen_logps: ``[A, P]`` same under each agent's frozen reference model.
        ref_rejected_logps: ``[A, P]`` same, rejected.
        beta: inverse temperature; > 0.

    Returns:
        ``(losses, metrics)``: ``losses`` is ``[A]`` float32 (``L_i`` per agent; backward
        of ``losses.sum()`` gives every agent its own gradient), metrics ``margin`` (mean
        joint margin ``sum_j h_j``, nats), ``accuracy`` (fraction of pairs with a positive
        joint margin) and ``margin/agent_<i>`` (mean ``h_i``).

    Raises:
        ValueError: shapes differ or are not ``[A, P]`` with ``A, P >= 1``, non-float
            input, or ``beta <= 0``.
    """
    names = ("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps")
    tensors = (chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    _check_pair_shapes(names, tensors)
    if chosen_logps.dim() != 2 or chosen_logps.numel() == 0:
        raise ValueError(
            f"expected [A, P] log-probs with A, P >= 1, got shape {list(chosen_logps.shape)}"
        )
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    dtype = torch.float64 if chosen_logps.dtype == torch.float64 else torch.float32
    h = (chosen_logps.to(dtype) - ref_chosen_logps.detach().to(dtype)) - (
        rejected_logps.to(dtype) - ref_rejected_logps.detach().to(dtype)
    )  # [A, P]
    joint = h.sum(dim=0, keepdim=True)  # [1, P]
    z = h + (joint - h).detach()  # row i: h_i + sg(sum_{j != i} h_j)
    losses = -F.logsigmoid(beta * z).mean(dim=1)  # [A]
    with torch.no_grad():
        metrics = {"margin": float(joint.mean()), "accuracy": float((joint > 0).to(dtype).mean())}
        for i in range(h.shape[0]):
            metrics[f"margin/agent_{i}"] = float(h[i].mean())
    return losses, metrics


def bradley_terry_loss(
    chosen_scores: Tensor, rejected_scores: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """Reward-model loss of the Bradley-Terry preference model, mean over ``P`` pairs.

    ``-log sigmoid(r(x, y_w) - r(x, y_l))``: the negative log-likelihood of the observed
    preference when ``P(y_w > y_l) = sigmoid(r_w - r_l)`` (Bradley and Terry 1952; as the
    reward-model loss in Ouyang et al. 2022, "Training language models to follow
    instructions with human feedback", eq. 1, with one comparison per prompt).

    Args:
        chosen_scores: ``[P]`` float scalar rewards of the chosen responses (with graph).
        rejected_scores: ``[P]`` float scalar rewards of the rejected responses.

    Returns:
        ``(loss, metrics)``: scalar float32 loss; ``accuracy`` (fraction with ``r_w >
        r_l``) and ``score_gap`` (mean ``r_w - r_l``).

    Raises:
        ValueError: shapes differ, are not ``[P]`` with ``P >= 1``, or non-float input.
    """
    _check_pair_shapes(("chosen_scores", "rejected_scores"), (chosen_scores, rejected_scores))
    if chosen_scores.dim() != 1 or chosen_scores.numel() == 0:
        raise ValueError(f"expected [P] scores with P >= 1, got shape {list(chosen_scores.shape)}")
    dtype = torch.float64 if chosen_scores.dtype == torch.float64 else torch.float32
    gap = chosen_scores.to(dtype) - rejected_scores.to(dtype)
    loss = -F.logsigmoid(gap).mean()
    with torch.no_grad():
        metrics = {"accuracy": float((gap > 0).to(dtype).mean()), "score_gap": float(gap.mean())}
    return loss, metrics


def sft_nll(token_logps: Tensor, mask: Tensor) -> Tensor:
    """Supervised fine-tuning loss: the token-mean negative log-likelihood of completions.

    ``-sum(logp * mask) / sum(mask)`` over every completion token of the batch (prompt
    tokens and padding are excluded by ``mask``), in nats per token; this is the maximum-
    likelihood objective on the completion given the prompt.

    Args:
        token_logps: ``[B, L]`` float log-probs (nats) of the completion tokens.
        mask: ``[B, L]`` bool, True on completion tokens that count.

    Returns:
        Scalar float32 NLL (nats per token).

    Raises:
        ValueError: shapes differ, or the mask selects no token.
    """
    if token_logps.shape != mask.shape:
        raise ValueError(
            f"token_logps {list(token_logps.shape)} and mask {list(mask.shape)} differ"
        )
    count = mask.sum()
    if int(count) == 0:
        raise ValueError("the completion mask selects no token; every completion is empty")
    dtype = torch.float64 if token_logps.dtype == torch.float64 else torch.float32
    return -(token_logps.to(dtype) * mask.to(dtype)).sum() / count.to(dtype)


def select_preference_pairs(
    rewards: Tensor, *, min_gap: float = 0.0, pairs_per_prompt: int = 1
) -> tuple[Tensor, Tensor, Tensor]:
    """Pick (chosen, rejected) joint actions of each prompt by reward gap.

    For each prompt, every ordered pair ``(w, l)`` with ``r_w - r_l >= min_gap`` and
    ``r_w > r_l`` is a candidate; the ``pairs_per_prompt`` with the largest gaps are kept
    (ties broken by the lower ``w`` then the lower ``l``). With ``pairs_per_prompt=1`` this
    is the best against the worst joint action. A prompt whose joint actions all tie, or
    whose largest gap is below ``min_gap``, gives no pair.

    Args:
        rewards: ``[N, K]`` float joint rewards (task units).
        min_gap: the smallest reward gap that makes a pair (>= 0, task units).
        pairs_per_prompt: at most this many pairs per prompt (>= 1).

    Returns:
        ``(prompt, chosen, rejected)``: three ``[P]`` int64 tensors (prompt index in
        ``[0, N)``, joint-action indices in ``[0, K)``), prompt-major, largest gap first.

    Raises:
        ValueError: ``rewards`` not ``[N, K]``, non-finite rewards, ``min_gap < 0`` or
            ``pairs_per_prompt < 1``.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, K], got shape {list(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; fix the reward function before pairing")
    if min_gap < 0:
        raise ValueError(f"min_gap must be >= 0, got {min_gap}")
    if pairs_per_prompt < 1:
        raise ValueError(f"pairs_per_prompt must be >= 1, got {pairs_per_prompt}")
    prompt, chosen, rejected = [], [], []
    values = rewards.double().cpu().tolist()
    for n, row in enumerate(values):
        candidates = [
            (row[w] - row[lo], w, lo)
            for w in range(len(row))
            for lo in range(len(row))
            if row[w] > row[lo] and row[w] - row[lo] >= min_gap
        ]
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        for _, w, lo in candidates[:pairs_per_prompt]:
            prompt.append(n)
            chosen.append(w)
            rejected.append(lo)

    def as_tensor(xs: list[int]) -> Tensor:
        return torch.tensor(xs, dtype=torch.int64)

    return as_tensor(prompt), as_tensor(chosen), as_tensor(rejected)
