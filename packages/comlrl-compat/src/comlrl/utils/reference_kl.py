"""CoMLRL 1.4.3's ``comlrl.utils.reference_kl``: a frozen reference copy of each agent
and a per-sequence KL estimate against it.

CoMLRL 1.4.3 subtracts ``reference_kl_coef * KL`` from each completion's return, with
``KL`` the sum over the completion's tokens of Schulman's k3 estimator
``exp(d) - d - 1``, ``d = log p_ref - log p_policy`` (an estimate of KL(pi || pi_ref)
whose every term is >= 0). :func:`reference_kl_for_sequence` computes that value;
``comlrl.trainers`` applies the same penalty to the rewards (docs/compat.md).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from comlrl.utils.distributed import unwrap_model

__all__ = [
    "clone_reference_models",
    "reference_kl_coef",
    "reference_kl_enabled",
    "reference_kl_for_sequence",
    "resolve_device_list",
    "resolve_reference_devices",
    "response_token_logprobs",
    "validate_reference_kl_config",
]


def reference_kl_enabled(args: Any) -> bool:
    """``args.reference_kl_enabled`` (False when absent)."""
    return bool(getattr(args, "reference_kl_enabled", False))


def reference_kl_coef(args: Any) -> float:
    """``args.reference_kl_coef`` (0.1 when absent, 1.4.3's default)."""
    return float(getattr(args, "reference_kl_coef", 0.1))


def resolve_device_list(spec: Any, count: int, kind: str) -> list[torch.device]:
    """``count`` devices from a device spec: None / ``"auto"`` (the GPUs in turn when there
    are any, else the CPU), one name (repeated), or a list of one (repeated) or ``count``.

    Raises:
        ValueError: ``count < 1``, an empty list, a list of another length (the message
            says ``"<kind> length (n) must be 1 or count"``), or another type.
    """
    if count < 1:
        raise ValueError(f"{kind} count must be >= 1, got {count}")
    if spec is None or (isinstance(spec, str) and spec.lower() == "auto"):
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            return [torch.device("cpu")] * count
        return [torch.device(f"cuda:{i % gpus}") for i in range(count)]
    if isinstance(spec, (str, torch.device)):
        return [torch.device(spec)] * count
    if isinstance(spec, Sequence):
        if not spec:
            raise ValueError(f"{kind} must be a non-empty list or 'auto', got []")
        if len(spec) == 1:
            return [torch.device(spec[0])] * count
        if len(spec) != count:
            raise ValueError(f"{kind} length ({len(spec)}) must be 1 or {count}: {list(spec)!r}")
        return [torch.device(s) for s in spec]
    raise ValueError(f"unsupported {kind} spec {spec!r}; give a device name or a list of them")


def validate_reference_kl_config(args: Any, expected_count: int) -> None:
    """Check ``reference_kl_coef >= 0`` and, when the KL is on, ``reference_devices``.

    Raises:
        ValueError: a negative coefficient, or bad ``reference_devices`` (see
            :func:`resolve_device_list`).
    """
    coef = reference_kl_coef(args)
    if coef < 0:
        raise ValueError(f"reference_kl_coef must be >= 0, got {coef!r}")
    devices = getattr(args, "reference_devices", None)
    if reference_kl_enabled(args) and devices is not None:
        resolve_device_list(devices, expected_count, "reference_devices")


def resolve_reference_devices(
    args: Any, fallback_devices: Sequence[torch.device], expected_count: int
) -> list[torch.device]:
    """The reference models' devices: ``args.reference_devices`` when set, else
    ``fallback_devices`` (the agents')."""
    spec = getattr(args, "reference_devices", None)
    if spec is None:
        return list(fallback_devices)
    return resolve_device_list(spec, expected_count, "reference_devices")


def clone_reference_models(
    policy_models: Sequence[Any], *, devices: Sequence[torch.device]
) -> list[Any]:
    """A frozen copy (eval mode, no gradients) of each model, on ``devices[i]``."""
    references = []
    for model, device in zip(policy_models, devices, strict=True):
        ref = copy.deepcopy(unwrap_model(model)).to(device)
        ref.eval()
        ref.requires_grad_(False)
        references.append(ref)
    return references


def response_token_logprobs(
    model: Any,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    response_len: int,
) -> torch.Tensor:
    """``log p(token)`` of the ``response_len`` tokens after the first ``prompt_len``.

    Args:
        sequences, attention_mask: ``[B, L]`` int64 prompt + response ids and mask.

    Returns:
        ``[B, response_len]`` log-probs in the model's dtype (untempered softmax).
    """
    out = unwrap_model(model)(input_ids=sequences, attention_mask=attention_mask, return_dict=True)
    logits = out.logits[:, :-1, :]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
    start = max(int(prompt_len) - 1, 0)
    return logp[:, start : start + int(response_len)]


def reference_kl_for_sequence(
    policy_model: Any,
    reference_model: Any,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    response_len: int,
) -> torch.Tensor:
    """The k3 estimate of KL(pi || pi_ref) of each sequence's response, summed over its
    tokens: ``sum_t exp(d_t) - d_t - 1``, ``d_t = log p_ref - log p_policy`` (Schulman
    2020, "Approximating KL divergence"). Both models run in eval mode without gradients;
    their training modes are restored.

    Returns:
        ``[B]`` float CPU tensor, each >= 0 (0 for identical models).
    """
    policy, reference = unwrap_model(policy_model), unwrap_model(reference_model)
    modes = (policy.training, reference.training)
    policy.eval()
    reference.eval()
    ref_device = next(reference.parameters()).device
    pol_device = next(policy.parameters()).device
    try:
        with torch.no_grad():
            lp = response_token_logprobs(
                policy,
                sequences.to(pol_device),
                attention_mask.to(pol_device),
                prompt_len,
                response_len,
            ).to(ref_device)
            lr = response_token_logprobs(
                reference,
                sequences.to(ref_device),
                attention_mask.to(ref_device),
                prompt_len,
                response_len,
            )
            d = (lr - lp).float()
            kl = (torch.exp(d) - d - 1.0).sum(dim=-1)
    finally:
        policy.train(modes[0])
        reference.train(modes[1])
    return kl.detach().cpu()
