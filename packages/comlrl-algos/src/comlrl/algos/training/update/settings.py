"""The policy update's settings (:class:`UpdateSettings`), those of an RL config for its
agents (:func:`update_settings`), and the truncated importance-sampling level they need
(:func:`tis_level`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from comlrl.algos.training.config.rl import RLConfig
from comlrl.algos.training.run.diagnostics import gspo_reduction_problem, warn_training
from comlrl.estimators.importance import TIS_LEVELS
from comlrl.estimators.importance import Level as TISLevel
from comlrl.estimators.kl import KLEstimator
from comlrl.estimators.losses import ImportanceLevel, Reduction, seq_sum_message

__all__ = ["UpdateSettings", "update_settings", "tis_level"]


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
            :func:`~comlrl.estimators.kl.kl_penalty`).
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


def update_settings(config: RLConfig, agents: Sequence[Any]) -> UpdateSettings:
    """The policy update's settings of ``config`` for these agents: the loss's log-probs
    at ``update_temperature`` (default the sampling temperature), the reference KL as a loss
    term only with ``kl_mode="loss"`` (with ``"reward"`` the group-baseline step subtracts it
    from the returns), no truncated importance sampling when the update is retempered."""
    return UpdateSettings(
        temperature=(
            config.temperature if config.update_temperature is None else config.update_temperature
        ),
        sampling_temperature=config.temperature,
        loss_reduction=config.loss_reduction,
        max_completion_length=config.max_new_tokens,
        clip_ratio=config.clip_ratio,
        kl_coef=config.kl_coef if config.kl_mode == "loss" else 0.0,  # else in the reward
        kl_estimator=config.kl_estimator,
        num_iterations=config.num_iterations,
        max_grad_norm=config.max_grad_norm,
        micro_batch_size=config.micro_batch_size,
        shared_prefix=config.shared_prefix,
        fused_logprobs=config.fused_logprobs,
        tis_level=None if config.retempered_update else tis_level(config.tis, agents),
        tis_cap=config.tis_cap,
        importance_level=config.importance_level,
    )


def tis_level(setting: str, agents: Sequence[Any]) -> Literal["token", "sequence"] | None:
    """The truncated importance-sampling level of ``config.tis`` for these agents.

    ``"auto"`` turns token-level TIS on when some agent's behaviour log-probs are not the
    trainer's own numbers: a generation backend other than the native sampler that does
    not recompute them (a vLLM engine's log-probs), or a model in a 16-bit dtype (the
    sampler's KV-cached decode step and the training forward round differently). The
    native sampler in float32 gives the trainer's log-probs up to float32 round-off (the
    first update's ratio is 1 within 1e-5): off there.
    """
    if setting == "off":
        return None
    if setting in ("token", "sequence"):
        return setting  # type: ignore[return-value]
    for agent in agents:
        backend = getattr(agent, "generation_backend", None)
        engine = (
            backend is not None
            and backend.name not in ("native", "hf")
            and not backend.recompute_logprobs
        )
        model = getattr(agent, "model", None)
        params = model.parameters() if isinstance(model, torch.nn.Module) else iter(())
        dtype = next(params, torch.zeros(())).dtype
        if engine or dtype in (torch.bfloat16, torch.float16):
            return "token"
    return None
