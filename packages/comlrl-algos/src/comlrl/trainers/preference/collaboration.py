"""CoMLRL 1.4.3's module path ``comlrl.trainers.preference.collaboration``.

Provided: :func:`joint_sequence_log_prob`, the log-probability of one joint response
(every role's text in one sequence) under one joint actor. Not provided: 1.4.3's
``CentralizedCollaboration`` (centralized MADPO/MARLHF training): the name imports, building
one raises ``NotProvidedError``; ``collaboration_mode="centralized"`` raises
``UnsupportedFieldError`` in those trainers (see docs/compat.md).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CentralizedCollaboration", "joint_sequence_log_prob"]


def _response_tokens(tokenizer: Any, completion_ids: torch.Tensor) -> list[int]:
    """The response's token ids through its first EOS; without an EOS, trailing padding
    dropped."""
    ids = [int(t) for t in completion_ids.reshape(-1).tolist()]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if eos is not None and int(eos) in ids:
        return ids[: ids.index(int(eos)) + 1]
    while ids and pad is not None and ids[-1] == int(pad):
        ids.pop()
    return ids


def joint_sequence_log_prob(
    model: Any, tokenizer: Any, prompt_input_ids: torch.Tensor, completion_ids: torch.Tensor
) -> torch.Tensor:
    """``sum_t log pi(y_t | x, y_<t)`` (nats, float32 scalar, temperature 1) of a joint
    response ``y`` (``completion_ids [L]``, through its first EOS; padding after it is not
    scored) after the prompt ``x`` (``prompt_input_ids [S]``), as CoMLRL 1.4.3 scores its
    joint actor: one forward pass of ``x + y[:-1]`` in the model's current mode (the
    caller chooses train or eval mode; with dropout the result depends on it), log-probs
    by :func:`comlrl.kernels.token_logprobs`. Differentiable; inference tensors (from
    generation) are accepted. An empty response gives 0 that ``backward()`` accepts.

    Raises:
        ValueError: an empty prompt.
    """
    from comlrl.kernels import token_logprobs

    prompt = [int(t) for t in prompt_input_ids.reshape(-1).tolist()]
    if not prompt:
        raise ValueError(
            "joint_sequence_log_prob needs a non-empty tokenized prompt (the first response "
            "token is predicted from the prompt's last position); got 0 prompt tokens."
        )
    response = _response_tokens(tokenizer, completion_ids)
    device = next(model.parameters()).device
    if not response:
        return torch.zeros((), device=device, requires_grad=True)
    inputs = torch.tensor([prompt + response[:-1]], device=device)
    logits = model(inputs, use_cache=False).logits[0, len(prompt) - 1 :]
    targets = torch.tensor(response, device=device)
    return token_logprobs(logits, targets, temperature=1.0).sum()


class CentralizedCollaboration:
    """1.4.3's centralized MADPO/MARLHF collaboration (one joint actor writing every
    role's text): importable so 1.4.3 scripts load, but not provided here.

    Raises:
        NotProvidedError: always, when built (see the module docstring).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from comlrl.utils import NotProvidedError

        raise NotProvidedError(
            "comlrl.trainers.preference.collaboration.CentralizedCollaboration (CoMLRL "
            "1.4.3's centralized MADPO/MARLHF) is not provided; collaboration_mode="
            "'centralized' is supported by CentralizedMAGRPOTrainer only (see docs/compat.md).",
            name="CentralizedCollaboration",
        )
