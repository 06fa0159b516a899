"""The policy update's settings of an RL config for its agents (:func:`update_settings`),
with the truncated importance-sampling level they need (:func:`tis_level`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from comlrl.algos.training.config.rl import RLConfig
from comlrl.algos.training.update.policy import UpdateSettings

__all__ = ["update_settings", "tis_level"]


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
