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
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from comlrl.algos.models.devices import model_device
from comlrl.algos.models.logprobs import completion_logprobs, prompt_chunks, sampling_mode
from comlrl.algos.models.threads import small_model_threads
from comlrl.algos.records import PolicyBatch, stack_batches
from comlrl.algos.training.run.diagnostics import gspo_reduction_problem, warn_training
from comlrl.estimators.importance import (
    TIS_LEVELS,
    sampler_mismatch,
    truncated_importance_weights,
)
from comlrl.estimators.importance import Level as TISLevel
from comlrl.estimators.losses import (
    ImportanceLevel,
    KLEstimator,
    Reduction,
    policy_loss,
    seq_sum_message,
)

if TYPE_CHECKING:
    from comlrl.algos.models.gradient_sync import GradientSync

__all__ = [
    "UpdateSettings",
    "split_terms",
    "trainer_logprobs",
    "update_adapters",
    "update_policy",
]


@dataclass(frozen=True)
class UpdateSettings:
    """How :func:`update_policy` turns advantages into an optimizer step.

    Attributes:
        temperature: the temperature of the log-probs the loss differentiates (and of the
            reference model's): the sampling temperature (the tempered policy that
            sampled), or 1.0 for the untempered softmax (CoMLRL 1.4.3's).
        sampling_temperature: the temperature the behaviour log-probs were sampled at;
            None: ``temperature``. When it differs from ``temperature`` the importance
            ratio (``clip_ratio``, ``importance_ratio``) is taken against the trainer's own
            log-probs before the update's first optimizer step, the sampler/trainer
            mismatch is not measured, and ``tis_level`` must be None.
        loss_reduction: see :func:`comlrl.estimators.losses.policy_loss`.
        max_completion_length: ``C`` of the ``seq_sum`` reduction (the token budget);
            required with ``seq_sum`` (a ValueError when the settings are made).
        clip_ratio: PPO clip against behaviour log-probs; ``None`` = on-policy REINFORCE
            (unless ``importance_ratio``).
        importance_ratio: without ``clip_ratio``, still weight each token by its ratio to
            the behaviour log-probs (``-r * A``): for completions updated after earlier
            optimizer steps on the same model (:mod:`~comlrl.algos.training.update.node_chunks`).
        kl_coef: weight of the reference KL (needs a reference model when > 0).
        kl_estimator: ``k3`` (gradient of ``KL(pi_ref || pi)``) or ``k2`` (of
            ``KL(pi || pi_ref)``); ``k1`` only with ``kl_coef = 0`` (see
            :func:`~comlrl.estimators.losses.kl_penalty`).
        num_iterations: optimizer steps per batch (> 1 needs ``clip_ratio``).
        max_grad_norm: clip the gradient's global norm; ``None`` = no clipping.
        micro_batch_size: sequences per forward/backward (whole groups); ``None`` = a
            whole turn at once.
        shared_prefix: compute each prompt once per micro-batch (same gradient).
        tis_level: truncated importance sampling from the sampler to the trainer (Yao et
            al. 2025; :func:`~comlrl.estimators.importance.truncated_importance_weights`):
            ``"token"`` or ``"sequence"`` weights ``min(pi_trainer / pi_behaviour, C)``
            on each token's policy-gradient term, the trainer's log-probs taken before any
            optimizer step of the update (this call's first pass, or ``old_logprobs``);
            the PPO ratio (``clip_ratio``, ``importance_ratio``) is then taken against
            those trainer log-probs, so the weight carries the sampler-to-trainer
            correction and the clip bounds the trainer's own drift (verl's split).
            ``None``: off, and the ratio is against the behaviour log-probs.
        tis_cap: ``C`` of ``tis_level`` (>= 1).
        importance_level: ``"token"`` (PPO's per-token ratio) or ``"sequence"`` (GSPO,
            Zheng et al. 2025: one length-normalised ratio and clip per completion); see
            :func:`~comlrl.estimators.losses.policy_loss`. ``"sequence"`` with a reduction
            other than ``seq_mean_token_mean`` warns (a
            :class:`~comlrl.algos.training.run.diagnostics.TrainingWarning`: not GSPO's
            objective, :func:`~comlrl.algos.training.run.diagnostics.gspo_reduction_problem`).
        fused_logprobs: compute log-probs from the last hidden states and the lm_head
            weight in chunks of tokens, never materialising the ``[tokens, V]`` logits
            (same values and gradient; less memory at large vocabularies). Models it cannot
            handle exactly fall back to the materialised logits with a warning; see
            :func:`comlrl.algos.models.logprobs.fused_logprobs_unsupported`. Applies to the
            reference model's log-probs too.
    """

    temperature: float = 1.0
    sampling_temperature: float | None = None
    loss_reduction: Reduction = "seq_mean_token_mean"
    max_completion_length: int | None = None
    clip_ratio: float | tuple[float, float] | None = None
    importance_ratio: bool = False
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    num_iterations: int = 1
    max_grad_norm: float | None = 1.0
    micro_batch_size: int | None = None
    shared_prefix: bool = True
    fused_logprobs: bool = True
    tis_level: TISLevel | None = None
    tis_cap: float = 2.0
    importance_level: ImportanceLevel = "token"

    def __post_init__(self) -> None:
        if self.tis_level is not None and self.tis_level not in TIS_LEVELS:
            raise ValueError(
                f"unknown tis_level {self.tis_level!r}; use one of {list(TIS_LEVELS)} or None"
            )
        if not (math.isfinite(self.tis_cap) and self.tis_cap >= 1.0):
            raise ValueError(f"tis_cap must be a finite number >= 1, got {self.tis_cap!r}")
        if self.loss_reduction == "seq_sum" and self.max_completion_length is None:
            raise ValueError(seq_sum_message())
        if self.retempered and self.tis_level is not None:
            raise ValueError(
                f"tis_level={self.tis_level!r} with temperature={self.temperature} and "
                f"sampling_temperature={self.sampling_temperature}: the truncated weight "
                "compares log-probs at one temperature; set tis_level=None"
            )
        gspo = gspo_reduction_problem(self.importance_level, self.loss_reduction)
        if gspo is not None:
            warn_training(gspo)

    @property
    def retempered(self) -> bool:
        """Whether the loss's log-probs are at another temperature than the behaviour
        log-probs (``sampling_temperature`` set and not ``temperature``)."""
        return (
            self.sampling_temperature is not None and self.sampling_temperature != self.temperature
        )


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
            (:func:`trainer_logprobs`; :func:`~comlrl.algos.training.update.node_chunks.update_in_node_chunks`
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


class _Sums:
    """Weighted metric sums kept on the device (no host synchronisation per micro-batch),
    read once at the end (:meth:`means`)."""

    def __init__(self) -> None:
        self.sums: dict[str, Any] = {}
        self.weights: dict[str, Any] = {}

    def add(self, key: str, value: Any, weight: Any) -> None:
        _add(self.sums, self.weights, key, value, weight)

    def floats(self) -> tuple[dict[str, float], dict[str, float]]:
        """The sums and weights as Python floats, fetched in one transfer."""
        tensors = [
            v for v in (*self.sums.values(), *self.weights.values()) if isinstance(v, torch.Tensor)
        ]
        fetched = iter(
            torch.stack([t.to(torch.float64).reshape(()) for t in tensors]).tolist()
            if tensors
            else []
        )
        index = {id(t): next(fetched) for t in tensors}

        def host(v: Any) -> float:
            return float(index[id(v)]) if isinstance(v, torch.Tensor) else float(v)

        return (
            {k: host(v) for k, v in self.sums.items()},
            {k: host(v) for k, v in self.weights.items()},
        )


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
                [_logp(ref, b.to(model_device(ref)), c, settings).to(device) for c in cs]
                if ref is not None
                else []
                for ref, b, cs in zip(ref_models, batches, chunks, strict=True)
            ]
    acc = _Sums()
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
                    logps = _group_logp(
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
        sums, weights = _merge_ranks(sums, weights)
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
    acc: _Sums,
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
            _add_tis_metrics(acc, prefix, turn, tis, mask, settings.tis_cap)
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


def _group_logp(
    model: Any, items: list[tuple[PolicyBatch, slice]], settings: UpdateSettings
) -> list[torch.Tensor]:
    """The log-probs ``[b_k, L_k]`` of each item's micro-batch (a batch and its prompts):
    one item alone, several stacked into one forward (``model`` then runs block ``k`` of
    the rows through item ``k``'s adapter; :class:`~comlrl.algos.models.lora_policy.AdapterBatch`)."""
    if len(items) == 1:
        batch, chunk = items[0]
        return [_logp(model, batch, chunk, settings)]
    parts = [_prompt_rows(batch, chunk) for batch, chunk in items]
    stacked = stack_batches(parts)
    logp = _logp(model, stacked, slice(0, stacked.num_prompts), settings)
    out, r = [], 0
    for part in parts:
        b, length = part.completion_mask.shape
        out.append(logp[r : r + b, :length])
        r += b
    return out


def _prompt_rows(batch: PolicyBatch, prompts: slice) -> PolicyBatch:
    """The rows of ``prompts`` (whole groups) as a batch of their own."""
    g = batch.group_size
    rows = slice(prompts.start * g, prompts.stop * g)
    return PolicyBatch(
        batch.input_ids[rows],
        batch.attention_mask[rows],
        batch.completion_mask[rows],
        batch.behaviour_logprobs[rows],
        g,
    )


_TERM_KEY = re.compile(r"^term_(\d+)/")


def split_terms(stats: Mapping[str, float], members: Sequence[int]) -> dict[int, dict[str, float]]:
    """Each member's metrics of one :func:`update_policy` (or
    :func:`~comlrl.algos.training.update.node_chunks.update_in_node_chunks`) call on a model they
    share: ``term_<m>/x`` goes to member ``m`` as ``x`` (its own completions' KL, clip
    fraction, ratio, per turn and over all turns); every other key (``loss``, the summed
    loss that was stepped, ``grad_norm``, ``optimizer_steps``, an ``extra_loss``'s
    metrics) belongs to the one step and goes to every member.

    Raises:
        ValueError: a ``term_<k>/`` key whose ``k`` is not one of ``members``.
    """
    out: dict[int, dict[str, float]] = {m: {} for m in members}
    for key, value in stats.items():
        match = _TERM_KEY.match(key)
        if match is None:
            for m in members:
                out[m][key] = value
            continue
        m = int(match.group(1))
        if m not in out:
            raise ValueError(
                f"metric {key!r} names term {m}, not one of the members {list(members)}"
            )
        out[m][key[match.end() :]] = value
    return out


def trainer_logprobs(model: Any, batch: PolicyBatch, settings: UpdateSettings) -> torch.Tensor:
    """The trainer's log-probs of ``batch``'s completions at ``settings.temperature``, as
    the update computes them (micro-batches of whole groups, eval mode), without
    gradient: ``[B, L]`` float32 on the model's device (meaningful under
    ``batch.completion_mask`` only)."""
    device = model_device(model)
    batch = batch.to(device)
    with torch.no_grad(), sampling_mode(model), small_model_threads(model):
        parts = [
            _logp(model, batch, chunk, settings)
            for chunk in prompt_chunks(batch, settings.micro_batch_size)
        ]
    return torch.cat(parts).float()


def _logp(model: Any, batch: PolicyBatch, chunk: slice, settings: UpdateSettings) -> torch.Tensor:
    return completion_logprobs(
        model,
        batch,
        chunk,
        temperature=settings.temperature,
        shared_prefix=settings.shared_prefix,
        fused=settings.fused_logprobs,
    )


def _merge_ranks(
    sums: dict[str, float], weights: dict[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Sum the metric sums and weights of every rank (keys may differ: a rank may have no
    completions at a later turn); ``grad_norm`` is already global and kept as is."""
    from comlrl.algos.models.ranks import gather_objects

    merged_sums: dict[str, float] = {}
    merged_weights: dict[str, float] = {}
    for rank_sums, rank_weights in gather_objects((sums, weights)):
        for key, value in rank_sums.items():
            if key != "grad_norm":
                _add(merged_sums, merged_weights, key, value, rank_weights[key])
    if "grad_norm" in sums:
        merged_sums["grad_norm"], merged_weights["grad_norm"] = (
            sums["grad_norm"],
            weights["grad_norm"],
        )
    return merged_sums, merged_weights


def _add_tis_metrics(
    acc: _Sums, prefix: str, turn: int, tis: torch.Tensor, mask: torch.Tensor, cap: float
) -> None:
    """Token-weighted ``tis_weight_mean`` and ``tis_truncated_fraction`` (share of valid
    tokens whose weight hit the cap) of one micro-batch, on the device."""
    valid = mask.to(torch.bool)
    tokens = valid.sum().to(torch.float64)
    mean = torch.where(valid, tis, 0.0).sum().to(torch.float64)
    truncated = (valid & (tis >= cap)).sum().to(torch.float64)
    for key, value in (("tis_weight_mean", mean), ("tis_truncated_fraction", truncated)):
        acc.add(f"{prefix}turn_{turn}/{key}", value, tokens)
        acc.add(f"{prefix}{key}", value, tokens)


def _add(sums: dict[str, Any], weights: dict[str, Any], key: str, value: Any, weight: Any) -> None:
    sums[key] = sums.get(key, 0.0) + value
    weights[key] = weights.get(key, 0.0) + weight
