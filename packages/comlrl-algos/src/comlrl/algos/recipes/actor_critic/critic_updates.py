"""Critic updates: a separate critic's (:func:`update_critic`), critics that share a
trunk together (:func:`update_critics`: one step on the sum of their value losses), and
value heads on the actor's own trunk on the actors' one code path (:func:`update_shared`;
several agents on one model: :func:`value_terms` as the ``extra_loss`` of
:func:`~comlrl.algos.training.update.shared_models.update_sharers`).

Named axes: ``M`` critic inputs of one critic (all turns), ``J`` targets per input, ``C``
critics stepped together."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from comlrl.algos.models.threads import small_model_threads
from comlrl.algos.models.value import Critic
from comlrl.algos.training.update.metric_sums import split_terms
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.estimators.gae import value_loss

__all__ = ["update_critic", "update_critics", "value_terms", "update_shared"]


def _value_chunks(
    critic: Critic,
    texts: Sequence[str],
    old_values: torch.Tensor,
    targets: torch.Tensor,
    clip_range: float | None,
    micro_batch_size: int | None,
    scale: float,
) -> dict[str, float]:
    """Backward ``scale * value_loss`` over ``texts`` in micro-batches; returns metrics."""
    m = len(texts)
    per = micro_batch_size or m
    sums: dict[str, float] = {}
    for i in range(0, m, per):
        j = min(i + per, m)
        v = critic.values(texts[i:j])
        tgt = targets[i:j].to(v.device)
        loss, metrics = value_loss(
            v.unsqueeze(1).expand_as(tgt),
            tgt,
            old_values=old_values[i:j].to(v.device).unsqueeze(1).expand_as(tgt),
            clip_range=clip_range,
        )
        (loss * (scale * (j - i) / m)).backward()
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value * (j - i) / m
    return sums


def update_critic(
    critic: Critic,
    optimizer: torch.optim.Optimizer,
    texts: Sequence[str],
    old_values: torch.Tensor,
    targets: torch.Tensor,
    *,
    coef: float = 1.0,
    clip_range: float | None = None,
    num_iterations: int = 1,
    max_grad_norm: float | None = 1.0,
    micro_batch_size: int | None = None,
) -> dict[str, float]:
    """Take ``num_iterations`` optimizer steps on ``coef *``
    :func:`~comlrl.estimators.gae.value_loss` of a separate critic.

    Args:
        critic: the critic (trunk and head are trained).
        optimizer: its optimizer.
        texts: ``M`` critic inputs (:func:`critic_inputs`, all turns concatenated).
        old_values: ``[M]`` sampling-time values.
        targets: ``[M, J]`` targets; value ``m`` is compared with each of its ``J``.
        coef: value-loss weight; clip_range: value clip (reward units) or None.
        num_iterations: optimizer steps on this batch.
        max_grad_norm: clip the critic's gradient norm; None = no clipping.
        micro_batch_size: texts per forward/backward; None = all at once.

    Returns:
        metrics averaged over the steps: ``value_loss``, ``value_mean``, ``target_mean``,
        ``value_clip_fraction``, ``explained_variance`` and ``critic_grad_norm``.

    Raises:
        ValueError: ``old_values`` or ``targets`` do not have ``M`` rows.
    """
    return update_critics(
        [critic], optimizer, [texts], [old_values], [targets], coef=coef,
        clip_range=clip_range, num_iterations=num_iterations, max_grad_norm=max_grad_norm,
        micro_batch_size=micro_batch_size,
    )[0]  # fmt: skip


def update_critics(
    critics: Sequence[Critic],
    optimizer: torch.optim.Optimizer,
    texts: Sequence[Sequence[str]],
    old_values: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    *,
    coef: float = 1.0,
    clip_range: float | None = None,
    num_iterations: int = 1,
    max_grad_norm: float | None = 1.0,
    micro_batch_size: int | None = None,
) -> list[dict[str, float]]:
    """:func:`update_critic` for ``C`` critics that share parameters (one trunk; e.g. IAC
    critics given one critic model): each step follows the gradient of the *sum* of their
    value losses, each reduced over its own ``M_c`` inputs as if alone, with one optimizer
    (one set of Adam moments) over all their parameters. Two separate steps would move the
    trunk twice, the second time from weights the first already changed.

    Args:
        critics: the ``C`` critics.
        optimizer: one optimizer over the parameters of all of them.
        texts, old_values, targets: per critic, as for :func:`update_critic`.
        coef, clip_range, num_iterations, max_grad_norm, micro_batch_size: as there;
            the gradient norm is that of all the critics' parameters together.

    Returns:
        Per critic its own value metrics, each with the step's ``critic_grad_norm``.

    Raises:
        ValueError: per-critic lists of another length than ``critics``, or a critic
            whose ``old_values`` or ``targets`` do not have its ``M_c`` rows.
    """
    if not len(critics) == len(texts) == len(old_values) == len(targets):
        raise ValueError(
            f"{len(critics)} critics but {len(texts)} text lists, {len(old_values)} old "
            f"values and {len(targets)} targets; give one of each per critic"
        )
    for c, (x, old, tgt) in enumerate(zip(texts, old_values, targets, strict=True)):
        m = len(x)
        if old.shape != (m,) or tgt.dim() != 2 or tgt.shape[0] != m:
            raise ValueError(
                f"critic {c}: {m} texts but old_values {list(old.shape)} and targets "
                f"{list(tgt.shape)}; need [M] and [M, J]"
            )
    params = list({id(p): p for c in critics for p in c.parameters()}.values())
    totals: list[dict[str, float]] = [{} for _ in critics]
    with small_model_threads(critics[0]):  # a small critic's CPU work on one intra-op thread
        for _ in range(num_iterations):
            optimizer.zero_grad(set_to_none=True)
            stats = [
                _value_chunks(critic, x, old, tgt, clip_range, micro_batch_size, coef)
                for critic, x, old, tgt in zip(critics, texts, old_values, targets, strict=True)
            ]
            if max_grad_norm is not None:
                norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
                for own in stats:
                    own["critic_grad_norm"] = norm
            optimizer.step()
            for own, total in zip(stats, totals, strict=True):
                for key, value in own.items():
                    total[key] = total.get(key, 0.0) + value / num_iterations
    optimizer.zero_grad(set_to_none=True)  # no gradient outlives the step (as update_policy)
    return totals


def value_terms(
    critics: Mapping[int, Critic],
    texts: Mapping[int, Sequence[str]],
    old_values: Mapping[int, torch.Tensor],
    targets: Mapping[int, torch.Tensor],
    *,
    coef: float,
    clip_range: float | None,
    micro_batch_size: int | None,
) -> Callable[[], dict[str, float]]:
    """The value losses of value heads on a shared trunk as an ``extra_loss`` of
    :func:`~comlrl.algos.training.update.shared_models.update_sharers`: called once per pass, it
    backpropagates ``coef * value_loss`` of every member ``m`` (its head on its own texts,
    reduced over them as if alone) and returns member ``m``'s value metrics as
    ``term_<m>/<name>``."""

    def backward() -> dict[str, float]:
        out: dict[str, float] = {}
        for m, critic in critics.items():
            own = _value_chunks(
                critic, texts[m], old_values[m], targets[m], clip_range, micro_batch_size, coef
            )
            out.update({f"term_{m}/{key}": value for key, value in own.items()})
        return out

    return backward


def update_shared(
    model: Any,
    critic: Critic,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[Any],
    advantages: Sequence[torch.Tensor],
    settings: UpdateSettings,
    texts: Sequence[str],
    old_values: torch.Tensor,
    targets: torch.Tensor,
    *,
    coef: float,
    clip_range: float | None,
    ref_model: Any = None,
) -> dict[str, float]:
    """Actor and value head on one trunk: ``policy_loss + coef * value_loss``, one backward
    and one optimizer step per iteration (the optimizer holds the model's parameters and
    the head's, each group with its own learning rate).

    One code path with the actors' update: :func:`~comlrl.algos.training.update.policy.update_policy`
    (micro-batches, loss weighting, fused log-probs, clipping) with the value loss as its
    ``extra_loss`` (:func:`value_terms`) and the head as ``extra_params``; ``ref_model`` (a
    frozen copy of the trunk, or None) adds the reference KL term as for the actors.
    Returns ``update_policy``'s metrics (``loss`` is the policy's) and
    :func:`update_critic`'s value metrics. Several agents on one model object step
    together through :func:`~comlrl.algos.training.update.shared_models.update_sharers` with
    :func:`value_terms` of all their heads (the recipe does).
    """
    return split_terms(
        update_policy(
            model,
            optimizer,
            batches,
            advantages,
            settings,
            extra_loss=value_terms(
                {0: critic},
                {0: texts},
                {0: old_values},
                {0: targets},
                coef=coef,
                clip_range=clip_range,
                micro_batch_size=settings.micro_batch_size,
            ),  # fmt: skip
            extra_params=list(critic.head.parameters()),
            ref_model=ref_model,
        ),
        [0],
    )[0]
