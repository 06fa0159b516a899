"""One agent's policy-gradient update over the completions of every turn of a rollout.

:func:`update_policy` takes the agent's :class:`~comlrl.algos.records.PolicyBatch` of each
turn and the matching advantages, accumulates the gradient of
:func:`comlrl.estimators.losses.policy_loss` over micro-batches (whole groups, so each prompt
prefix is computed once) and takes one optimizer step per pass. Micro-batches are weighted
by their share of the loss reduction's denominator, so the accumulated gradient equals
the gradient of the loss over all turns' completions at once (tested).
:func:`update_adapters` runs the same loop for LoRA agents of one base, their micro-batches
stacked into one forward and one backward.

Nothing is read back to the host per micro-batch: the loss weights, the loss and the
metrics stay on the device (``policy_loss(..., sync=False)``) and are fetched once, at the
end of the update, in one transfer (a GPU never waits on the host between micro-batches).

Named axes: ``B_t`` sequences of the agent at turn ``t``, ``L_t`` completion tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from comlrl.algos.models.devices import model_device
from comlrl.algos.models.logprobs import prompt_chunks, sampling_mode
from comlrl.algos.models.threads import small_model_threads
from comlrl.algos.records import PolicyBatch
from comlrl.algos.training.update.logprobs import grouped_logprobs, update_logprobs
from comlrl.algos.training.update.metric_sums import (
    MetricSums,
    add_tis_metrics,
    merge_rank_metrics,
    split_terms,
)
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.estimators.importance import (
    sampler_mismatch,
    truncated_importance_weights,
)
from comlrl.estimators.losses import policy_loss

if TYPE_CHECKING:
    from comlrl.algos.models.gradient_sync import GradientSync

__all__ = [
    "update_adapters",
    "update_policy",
]


def update_policy(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[PolicyBatch],
    advantages: Sequence[torch.Tensor],
    settings: UpdateSettings,
    *,
    ref_model: Any | None = None,
    sync: GradientSync | None = None,
    terms: Sequence[int] | None = None,
    turns: Sequence[int] | None = None,
    extra_loss: Callable[[], Mapping[str, float]] | None = None,
    extra_params: Sequence[torch.nn.Parameter] = (),
    old_logprobs: Sequence[torch.Tensor] | None = None,
) -> dict[str, float]:
    """Take ``settings.num_iterations`` optimizer steps on the agent's completions.

    Args:
        model: the agent's causal LM (parameters being optimised).
        optimizer: its optimizer.
        batches: per turn ``t``, the agent's :class:`PolicyBatch` (``B_t`` rows).
        advantages: per turn, ``[B_t]`` float advantages, row-aligned with the batch.
        settings: loss and step settings.
        ref_model: the frozen reference model for the KL term (``kl_coef > 0``): a copy,
            or a LoRA agent's base with its adapter disabled
            (:class:`~comlrl.algos.models.lora_policy.LoraReference`). On another device than ``model``
            its log-probs are computed there and moved over.
        sync: data parallel over ``K`` ranks (:class:`~comlrl.algos.models.gradient_sync.GradientSync`):
            ``batches`` are this rank's share; the reduction's denominators (sequences,
            or tokens for ``token_mean``) are summed over the ranks, each micro-batch's
            loss is weighted by its share of the global denominator times ``K``, and the
            ranks' gradients are averaged, so the step equals one process's step over
            every rank's completions. Every rank must call this together.
        terms: agents that share one model object: ``terms[t]`` says which agent's loss
            term the batch ``t`` belongs to (e.g. ``[0, 0, 1, 1]`` for two agents of two
            turns each). The loss is the *sum* of the terms, each reduced over its own
            completions as if alone, so one optimizer step (one set of Adam moments)
            follows the gradient of ``L_0 + L_1 + ...`` that separate models would each
            follow their part of. ``None``: one term.
        turns: the rollout turn of each batch (``turns[i]`` names batch ``i``'s
            ``turn_<t>/...`` metrics, e.g. ``[0, 1, 0, 1]`` for two agents of two turns
            each, or the turns of a chunk of nodes); ``None``: the turn is the batch's
            position, right only when ``batches`` are one agent's turns in order.
        extra_loss: a second loss on the same optimizer step (a value head on the actor's
            trunk: :func:`comlrl.algos.recipes.actor_critic.critic_updates.update_shared`): called
            once per pass after the policy loss's backward, it runs its own backward and
            returns its metrics, which are averaged over the passes.
        extra_params: parameters outside ``model`` that the optimizer also steps (that
            value head); gradient clipping takes them into the global norm.
        old_logprobs: per batch, ``[B_t, L_t]`` float32 trainer log-probs of its
            completions taken before an earlier optimizer step on ``model``
            (:func:`~comlrl.algos.training.update.logprobs.trainer_logprobs`; :func:`~comlrl.algos.training.update.node_chunks.update_in_node_chunks`
            takes them for its later chunks before its first step). They stand for this
            call's first pass: the mismatch metrics, the TIS weights and (with TIS or a
            retempered update) the ratio's reference. None: this call's first pass.

    The log-probs are computed in eval mode (:func:`~comlrl.algos.models.logprobs.sampling_mode`:
    no dropout), the mode the completions were sampled in, so the first pass's ratio to
    the behaviour log-probs is 1 up to round-off; each module's mode is restored after.

    Returns:
        Metrics averaged over the passes: ``loss`` (the stepped loss: with ``terms``, the
        sum of the terms), ``grad_norm`` (before clipping, when clipping is on), and per
        turn ``t`` the token-weighted ``turn_<t>/kl``, ``turn_<t>/clip_fraction``,
        ``turn_<t>/ratio_mean`` of :func:`~comlrl.estimators.losses.policy_loss`,
        plus their all-turn values; the sampler/trainer mismatch before any optimizer
        step (the first pass, or ``old_logprobs``), ``mismatch_abs_logp_diff`` and
        ``mismatch_kl`` (:func:`~comlrl.estimators.importance.sampler_mismatch`: 0 on exact
        behaviour log-probs), unless the update is retempered; with ``tis_level``, ``tis_weight_mean`` and
        ``tis_truncated_fraction``; all per turn too. With ``terms`` those token-weighted values are kept
        per term ``k`` (over its own completions only) as ``term_<k>/kl``,
        ``term_<k>/turn_<t>/kl``, ...; :func:`split_terms` hands each agent its own. With
        ``sync`` they are those of the global batch, the same on every rank.

    Raises:
        ValueError: mismatched batch/advantage counts or shapes, ``terms`` or ``turns``
            not one label per batch, a negative turn, ``old_logprobs`` not one tensor of
            each batch's completion shape, or ``kl_coef > 0`` without a reference model.
    """
    if len(batches) != len(advantages):
        raise ValueError(f"{len(batches)} turns of batches but {len(advantages)} of advantages")
    for t, (batch, adv) in enumerate(zip(batches, advantages, strict=True)):
        if adv.shape != (batch.completion_mask.shape[0],):
            raise ValueError(
                f"turn {t}: advantages {list(adv.shape)} do not match the "
                f"{batch.completion_mask.shape[0]} rows of the batch"
            )
    if settings.kl_coef > 0 and ref_model is None:
        raise ValueError(f"kl_coef={settings.kl_coef} needs ref_model; pass it or set kl_coef=0")
    if terms is not None and len(terms) != len(batches):
        raise ValueError(f"terms has {len(terms)} labels for {len(batches)} batches; give one each")
    if turns is not None and len(turns) != len(batches):
        raise ValueError(f"turns has {len(turns)} labels for {len(batches)} batches; give one each")
    if turns is not None and any(t < 0 for t in turns):
        raise ValueError(f"turns must be rollout turns (>= 0), got {list(turns)}")
    if old_logprobs is not None and [tuple(o.shape) for o in old_logprobs] != [
        tuple(b.completion_mask.shape) for b in batches
    ]:
        raise ValueError(
            f"old_logprobs {[list(o.shape) for o in old_logprobs]} must be one tensor per "
            f"batch of its completion shape {[list(b.completion_mask.shape) for b in batches]}"
        )
    labels = list(terms) if terms is not None else [0] * len(batches)
    # each batch's metric names: its term's prefix (with terms) and its rollout turn
    prefixes = [f"term_{k}/" if terms is not None else "" for k in labels]
    turn_of = list(turns) if turns is not None else list(range(len(batches)))
    step = _Step(optimizer, [*model.parameters(), *extra_params], "")
    # sample and update in one mode (no dropout); a small model on one intra-op thread
    with sampling_mode(model), small_model_threads(model):
        return _update(
            model,
            [step],
            batches,
            advantages,
            settings,
            [ref_model] * len(batches),
            sync,
            labels,
            list(zip(prefixes, turn_of, strict=True)),
            [[i] for i in range(len(batches))],
            extra_loss,
            old_logprobs,
        )


def update_adapters(
    policies: Sequence[Any],
    optimizers: Sequence[torch.optim.Optimizer],
    batches: Sequence[Sequence[PolicyBatch]],
    advantages: Sequence[Sequence[torch.Tensor]],
    settings: UpdateSettings,
    *,
    ref_models: Sequence[Any | None] | None = None,
    turns: Sequence[int] | None = None,
) -> list[dict[str, float]]:
    """The updates of ``A`` agents that are LoRA adapters of one base, in one forward and
    one backward per micro-batch instead of one agent after another.

    Each micro-batch stacks the same prompts' completions of every agent
    (:func:`~comlrl.algos.records.stack_batches`) and runs them through the base once, each
    row through its own agent's adapter (:class:`~comlrl.algos.models.lora_policy.AdapterBatch`,
    peft's mixed-adapter batches); the loss is the sum of the agents' losses, each reduced
    over its own completions as :func:`update_policy` would alone, so one backward gives
    every adapter the gradient of its own loss (the others' do not depend on it). Then
    each agent clips its own gradient and steps its own optimizer: the same update as
    :func:`update_policy` per agent, to float rounding (tested).

    Args:
        policies: the agents' :class:`~comlrl.algos.models.lora_policy.LoraPolicy` views,
            adapters of one shared base.
        optimizers: one per agent, over its adapter.
        batches: per agent, its batch of each turn (the same turns and prompts per turn
            for every agent, as a rollout gives them).
        advantages: per agent, per turn, ``[B_t]`` advantages.
        settings: as for :func:`update_policy`, but ``micro_batch_size`` counts the
            sequences of one stacked forward over all agents (``None``: as many as one
            agent's largest turn), so the activations' memory stays that of one agent's
            update while every forward serves every agent; each agent gets at least one
            whole group per forward.
        ref_models: per agent its KL reference (``kl_coef > 0``), or ``None``.
        turns: the rollout turn of each batch position (default ``0, 1, ...``).

    Returns:
        Per agent its metrics, as :func:`update_policy` returns for it alone (``loss`` and
        ``grad_norm`` its own).

    Raises:
        ValueError: the policies are not adapters of one base, counts disagree, the
            agents' turns differ in prompts, ``kl_coef > 0`` without references, or as
            :func:`update_policy`.
    """
    from comlrl.algos.models.lora_policy import AdapterBatch

    n = len(policies)
    if not (len(optimizers) == len(batches) == len(advantages) == n) or n == 0:
        raise ValueError(
            f"update_adapters: {n} policies, {len(optimizers)} optimizers, {len(batches)} "
            f"batch lists and {len(advantages)} advantage lists; give one of each per agent"
        )
    view = AdapterBatch.of(policies)
    t_count = len(batches[0])
    for a in range(n):
        if len(batches[a]) != t_count or len(advantages[a]) != t_count:
            raise ValueError(
                f"agent {a} has {len(batches[a])} turns of batches; expected {t_count}"
            )
        for t in range(t_count):
            if batches[a][t].num_prompts != batches[0][t].num_prompts:
                raise ValueError(
                    f"turn {t}: agent {a} has {batches[a][t].num_prompts} prompts, agent 0 "
                    f"{batches[0][t].num_prompts}; agents updated together need the same prompts"
                )
    refs = list(ref_models) if ref_models is not None else [None] * n
    if settings.kl_coef > 0 and any(r is None for r in refs):
        raise ValueError(f"kl_coef={settings.kl_coef} needs a reference model for every agent")
    turn_of = list(turns) if turns is not None else list(range(t_count))
    flat = [b for a in range(n) for b in batches[a]]
    flat_adv = [x for a in range(n) for x in advantages[a]]
    for i, (batch, adv) in enumerate(zip(flat, flat_adv, strict=True)):
        if adv.shape != (batch.completion_mask.shape[0],):
            raise ValueError(
                f"batch {i}: advantages {list(adv.shape)} do not match its "
                f"{batch.completion_mask.shape[0]} rows"
            )
    # rows of one stacked forward: the budget split over the agents, whole groups each
    budget = settings.micro_batch_size or max(b.completion_mask.shape[0] for b in flat)
    g = max(b.group_size for b in flat)
    per_agent = max(g, budget // n // g * g)
    settings = dataclasses.replace(settings, micro_batch_size=per_agent)
    labels = [a for a in range(n) for _ in range(t_count)]
    names = [(f"term_{a}/", turn_of[t]) for a in range(n) for t in range(t_count)]
    steps = [_Step(optimizers[a], list(policies[a].parameters()), f"term_{a}/") for a in range(n)]
    together = [[a * t_count + t for a in range(n)] for t in range(t_count)]
    with sampling_mode(view), small_model_threads(view):
        stats = _update(
            view,
            steps,
            flat,
            flat_adv,
            settings,
            [refs[a] for a in range(n) for _ in range(t_count)],
            None,
            labels,
            names,
            together,
            None,
        )
    per = split_terms(stats, list(range(n)))
    return [per[a] for a in range(n)]


@dataclass
class _Step:
    """One optimizer step of an update: the optimizer, the parameters whose gradient it
    clips, and the prefix of its ``loss`` and ``grad_norm`` metrics (``""``: one step for
    every term; ``"term_<k>/"``: term ``k``'s own step)."""

    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    prefix: str


def _update(
    model: Any,
    steps: list[_Step],
    batches: Sequence[PolicyBatch],
    advantages: Sequence[torch.Tensor],
    settings: UpdateSettings,
    ref_models: Sequence[Any | None],
    sync: GradientSync | None,
    terms: list[int],
    names: list[tuple[str, int]],
    together: list[list[int]],
    extra_loss: Callable[[], Mapping[str, float]] | None = None,
    old_logprobs: Sequence[torch.Tensor] | None = None,
) -> dict[str, float]:
    """The update loop. ``together``: groups of batch indices whose micro-batches (same
    prompts) go through ``model`` in one forward (a group of one: the batch alone); each
    step of ``steps`` clips and steps its own parameters; ``old_logprobs``: as for
    :func:`update_policy`."""
    device = next(model.parameters()).device
    batches = [b.to(device) for b in batches]
    advantages = [a.to(device) for a in advantages]  # once, not per micro-batch
    chunks = [prompt_chunks(b, settings.micro_batch_size) for b in batches]
    # each loss term is normalised by its own denominators (rows, tokens): one transfer
    keys = sorted(set(terms))
    tokens_per_batch = (
        torch.stack([b.completion_mask.sum() for b in batches]).tolist() if batches else []
    )
    local = [
        float(
            sum(b.completion_mask.shape[0] for b, k in zip(batches, terms, strict=True) if k == key)
        )
        for key in keys
    ] + [
        float(sum(n for n, k in zip(tokens_per_batch, terms, strict=True) if k == key))
        for key in keys
    ]
    if sync is not None:  # normalise by the global batch, not this rank's share
        local = sync.all_sum(local)
    total_rows = dict(zip(keys, local[: len(keys)], strict=True))
    total_tokens = {k: max(1.0, v) for k, v in zip(keys, local[len(keys) :], strict=True)}
    forward = sync.module if sync is not None else model
    grad_scale = float(sync.world_size) if sync is not None else 1.0  # cancels the averaging
    num_backward = sum(len(chunks[group[0]]) for group in together)
    ref_logp: list[list[torch.Tensor]] = []
    if any(r is not None for r in ref_models):  # on its own device when placed apart
        with torch.no_grad():
            ref_logp = [
                [update_logprobs(ref, b.to(model_device(ref)), c, settings).to(device) for c in cs]
                if ref is not None
                else []
                for ref, b, cs in zip(ref_models, batches, chunks, strict=True)
            ]
    acc = MetricSums()
    passes = 0
    # the trainer's log-probs before any optimizer step (this call's first pass, or given):
    # the mismatch metrics, and with TIS (or a retempered update) the PPO ratio's reference
    first: dict[tuple[int, int], torch.Tensor] = {}
    if old_logprobs is not None:
        for i, (old_i, cs) in enumerate(zip(old_logprobs, chunks, strict=True)):
            g = batches[i].group_size
            for j, chunk in enumerate(cs):
                first[(i, j)] = old_i[chunk.start * g : chunk.stop * g].to(device)
    measured: set[tuple[int, int]] = set()
    for _ in range(settings.num_iterations):
        for st in steps:
            st.optimizer.zero_grad(set_to_none=True)
        done = 0
        for group in together:
            for j in range(len(chunks[group[0]])):
                done += 1
                last = done == num_backward
                with sync.accumulate(last) if sync is not None else contextlib.nullcontext():
                    logps = grouped_logprobs(
                        forward, [(batches[i], chunks[i][j]) for i in group], settings
                    )
                total: torch.Tensor | None = None
                for i, logp in zip(group, logps, strict=True):
                    term = _term_loss(
                        i, j, logp, batches[i], chunks[i][j], advantages[i], settings,
                        ref_logp[i][j] if ref_logp and ref_logp[i] else None,
                        first, measured, acc, names[i], passes, steps[0].prefix == "",
                        total_rows[terms[i]], total_tokens[terms[i]], grad_scale,
                    )  # fmt: skip
                    total = term if total is None else total + term
                assert total is not None
                with sync.accumulate(last) if sync is not None else contextlib.nullcontext():
                    total.backward()
        if extra_loss is not None:
            for key, value in extra_loss().items():
                acc.add(key, value, 1.0)
        if sync is not None:
            sync.finish()
        for st in steps:
            if settings.max_grad_norm is not None:
                norm = torch.nn.utils.clip_grad_norm_(st.params, settings.max_grad_norm)
                if hasattr(norm, "full_tensor"):  # fsdp2: a DTensor (already the global norm)
                    norm = norm.full_tensor()
                acc.add(f"{st.prefix}grad_norm", norm.detach(), 1.0)
            st.optimizer.step()
        passes += 1
    # the gradients live for the update only: between steps an agent holds its weights
    # and optimizer states, not a third copy of its parameters
    for st in steps:
        st.optimizer.zero_grad(set_to_none=True)
    sums, weights = acc.floats()  # the update's one read of its metrics
    if sync is not None:
        sums, weights = merge_rank_metrics(sums, weights)
    out = {}
    for key, value in sums.items():
        if key.rsplit("/", 1)[-1] in ("loss", "grad_norm"):  # one value per pass
            out[key] = value / passes
        else:
            out[key] = value / weights[key] if weights[key] else 0.0
    return out


def _term_loss(
    i: int,
    j: int,
    logp: torch.Tensor,
    batch: PolicyBatch,
    chunk: slice,
    adv: torch.Tensor,
    settings: UpdateSettings,
    ref_logp: torch.Tensor | None,
    first: dict[tuple[int, int], torch.Tensor],
    measured: set[tuple[int, int]],
    acc: MetricSums,
    name: tuple[str, int],
    passes: int,
    shared_step: bool,
    total_rows: float,
    total_tokens: float,
    grad_scale: float,
) -> torch.Tensor:
    """Micro-batch ``j`` of batch ``i``: its loss weighted by its share of its term's
    reduction denominator (so the accumulated gradient equals the all-turns loss's), and
    its metrics added to ``acc`` (device-side)."""
    g = batch.group_size
    rows = slice(chunk.start * g, chunk.stop * g)
    mask = batch.completion_mask[rows]
    behaviour = batch.behaviour_logprobs[rows]
    prefix, turn = name
    if (i, j) not in first:
        first[(i, j)] = logp.detach()
    if (i, j) not in measured and not settings.retempered:
        measured.add((i, j))
        seen = sampler_mismatch(first[(i, j)], behaviour, mask, sync=False)
        for key in ("mismatch_abs_logp_diff", "mismatch_kl"):
            value = seen[key] * seen["num_tokens"]
            acc.add(f"{prefix}turn_{turn}/{key}", value, seen["num_tokens"])
            acc.add(f"{prefix}{key}", value, seen["num_tokens"])
    tis = None
    if settings.tis_level is not None:
        tis = truncated_importance_weights(
            first[(i, j)], behaviour, mask, cap=settings.tis_cap, level=settings.tis_level
        )
        if passes == 0:
            add_tis_metrics(acc, prefix, turn, tis, mask, settings.tis_cap)
    old = first[(i, j)] if tis is not None or settings.retempered else behaviour
    loss, metrics = policy_loss(
        logp,
        adv[rows],
        mask,
        old_logprobs=old if settings.clip_ratio is not None or settings.importance_ratio else None,
        importance_weights=tis,
        importance_level=settings.importance_level,
        clip_ratio=settings.clip_ratio,
        ref_logprobs=ref_logp,
        kl_coef=settings.kl_coef,
        kl_estimator=settings.kl_estimator,
        reduction=settings.loss_reduction,
        max_completion_length=settings.max_completion_length,
        sync=False,
    )
    # weight by the share of the reduction's denominator, on the device for token_mean
    weight: Any
    if settings.loss_reduction == "token_mean":
        weight = mask.sum().to(torch.float64) / total_tokens
        scaled = (weight * grad_scale).to(loss.dtype)
    else:
        weight = logp.shape[0] / total_rows
        scaled = weight * grad_scale
    acc.add(
        "loss" if shared_step else f"{prefix}loss", loss.detach().to(torch.float64) * weight, 1.0
    )
    tokens = metrics["num_tokens"]
    for key in ("kl", "clip_fraction", "ratio_mean"):
        if key in metrics:
            value = metrics[key] * tokens
            acc.add(f"{prefix}turn_{turn}/{key}", value, tokens)
            acc.add(f"{prefix}{key}", value, tokens)
    return loss * scaled
