"""What the vLLM backend needs from vLLM, and how it reads vLLM's answers.

Whether vLLM can run here (:func:`vllm_unavailable_reason`, without importing it), the
constructors the backend calls (:class:`VLLMApi`, :func:`load_vllm_api`; swapped for fakes
in the contract tests), whether a sampling filter makes the engine's log-probs unusable
(:func:`filters_tokens`), and vLLM's ``RequestOutput``\\ s as the native sampler's padded
tensors (:func:`assemble_outputs`). Used by
:class:`~comlrl.algos.rollout.sampling.vllm_backend.VLLMBackend`.

Named axes: ``P`` prompts, ``G`` completions per prompt, ``B = P * G`` rows, ``L``
completion tokens.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from comlrl.core import SamplingParams

__all__ = [
    "BEHAVIOUR_LOGPROBS",
    "VLLM_INSTALL_HINT",
    "VLLMApi",
    "assemble_outputs",
    "filters_tokens",
    "load_vllm_api",
    "vllm_unavailable_reason",
]

#: Where behaviour log-probs come from (see the module docstring).
BEHAVIOUR_LOGPROBS = ("engine", "recompute")

VLLM_INSTALL_HINT = (
    "install it with: pip install 'comlrl-algos[vllm]' (needs a CUDA GPU), or use "
    "generation_backend='native'"
)


def vllm_unavailable_reason(*, need_cuda: bool = True) -> str | None:
    """Why the vLLM backend cannot run here (``None`` when it can).

    Checks that ``vllm`` is importable (without importing it) and, with ``need_cuda``,
    that torch sees a CUDA device.
    """
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed; {VLLM_INSTALL_HINT}"
    if need_cuda and not torch.cuda.is_available():
        return "vLLM needs a CUDA GPU and torch sees none; use generation_backend='native'"
    return None


@dataclass(frozen=True)
class VLLMApi:
    """The vLLM constructors the backend calls (swapped for fakes in the contract tests).

    Attributes:
        sampling_params: ``vllm.SamplingParams``.
        lora_request: ``vllm.lora.request.LoRARequest``.
    """

    sampling_params: Callable[..., Any]
    lora_request: Callable[..., Any]


def load_vllm_api() -> VLLMApi:
    """Import vLLM's ``SamplingParams`` and ``LoRARequest``.

    Raises:
        ImportError: vLLM is not installed (the message says how to install it).
    """
    try:
        from vllm import SamplingParams as VSamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        raise ImportError(
            f"the 'vllm' generation backend needs vLLM ({exc}); {VLLM_INSTALL_HINT}"
        ) from exc
    return VLLMApi(sampling_params=VSamplingParams, lora_request=LoRARequest)


def filters_tokens(params: SamplingParams) -> bool:
    """True when top-p or top-k truncates the sampling distribution (``top_p < 1`` or
    ``top_k > 0``): then vLLM's processed log-probs are renormalised over the kept tokens
    and do not match the full tempered softmax the update uses."""
    return params.top_p < 1.0 or params.top_k > 0


def assemble_outputs(
    outputs: Sequence[Any],
    group_size: int,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    with_logprobs: bool,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM ``RequestOutput``\\ s to the native sampler's padded tensors.

    Each output's ``G`` completions are ordered by ``CompletionOutput.index``; a
    completion is cut after its first EOS (kept), and rows are right-padded with
    ``pad_token_id`` to the longest (at least one token, like the native sampler).

    Args:
        outputs: ``P`` request outputs (``.outputs``: ``G`` completion outputs with
            ``index``, ``token_ids`` and, with ``with_logprobs``, ``logprobs``: one
            ``{token_id: Logprob}`` mapping per token).
        group_size: ``G``.
        eos_token_ids: ids that end a completion.
        pad_token_id: id written after a row's end.
        with_logprobs: read the sampled tokens' log-probs; otherwise they are NaN
            (to be recomputed).
        max_tokens: the completion budget; a completion without EOS must have used all
            of it (the native convention: only EOS ends a row early, so padding is never
            mistaken for sampled tokens). ``None`` skips the check.

    Returns:
        ids ``[B, L]`` int64 and log-probs ``[B, L]`` float32 (0 after a row's end),
        ``B = P * G``, node-major.

    Raises:
        ValueError: a request with other than ``G`` completions, a completion without
            log-probs (or without the sampled token's) when they were asked for, or one
            that stopped without EOS before ``max_tokens`` (the engine's context limit).
    """
    eos = {int(i) for i in eos_token_ids}
    rows: list[list[int]] = []
    logps: list[list[float]] = []
    for p, request in enumerate(outputs):
        completions = sorted(request.outputs, key=lambda c: c.index)
        if len(completions) != group_size:
            raise ValueError(
                f"vLLM returned {len(completions)} completions for prompt {p}, expected "
                f"G={group_size}; the engine must be called with SamplingParams(n=G)"
            )
        for c in completions:
            ids = [int(t) for t in c.token_ids]
            end = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
            ids = ids[:end]
            if max_tokens is not None and len(ids) < max_tokens and not (ids and ids[-1] in eos):
                raise ValueError(
                    f"vLLM stopped completion {c.index} of prompt {p} after {len(ids)} of "
                    f"{max_tokens} tokens without EOS (finish_reason="
                    f"{getattr(c, 'finish_reason', None)!r}), most likely at the engine's "
                    "context limit; raise vllm.engine_kwargs.max_model_len or lower "
                    "max_new_tokens"
                )
            if with_logprobs:
                if c.logprobs is None or len(c.logprobs) < len(ids):
                    raise ValueError(
                        f"vLLM returned no log-probs for completion {c.index} of prompt {p}; "
                        "the engine must be called with SamplingParams(logprobs=0)"
                    )
                try:
                    lp = [float(c.logprobs[i][t].logprob) for i, t in enumerate(ids)]
                except KeyError as exc:
                    raise ValueError(
                        f"vLLM's log-probs for completion {c.index} of prompt {p} miss the "
                        f"sampled token {exc}"
                    ) from None
            else:
                lp = [float("nan")] * len(ids)
            rows.append(ids)
            logps.append(lp)
    length = max([1, *(len(r) for r in rows)])
    out_ids = torch.full((len(rows), length), int(pad_token_id), dtype=torch.int64)
    out_logp = torch.zeros(len(rows), length, dtype=torch.float32)
    for i, (ids, lp) in enumerate(zip(rows, logps, strict=True)):
        out_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        out_logp[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return out_ids, out_logp
