"""Current-policy log-probs of sampled completions, with the autograd graph.

Only the ``L`` positions that predict completion tokens are projected onto the vocabulary
(never the prompt). Two ways to get there, same numbers and same gradients (tested):

- **fused** (the default where the model allows it, see :func:`fused_logprobs_unsupported`):
  the model's decoder gives the last hidden states ``[b, L, H]`` and
  :func:`comlrl.kernels.linear_token_logprobs` applies the lm_head weight ``[V, H]`` in
  chunks of tokens, so the ``[b * L, V]`` logits never exist whole, in the forward or the
  backward (each chunk is recomputed there). At Qwen2's ``V = 151,936`` those logits (and
  their gradient) are otherwise the memory ceiling of the update.
- **materialised**: the full causal LM returns ``[b, L, V]`` logits (``logits_to_keep``) and
  :func:`comlrl.kernels.token_logprobs` reduces them without an extra fp32 ``[N, V]`` copy.

Named axes: ``b`` rows of the micro-batch, ``G`` completions per prompt, ``S`` padded
prompt tokens, ``L`` completion tokens, ``H`` hidden size, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from comlrl.algos.models.hf_cache import cache_kwargs, output_cache
from comlrl.algos.records import PolicyBatch
from comlrl.kernels import linear_token_logprobs, token_logprobs

__all__ = [
    "completion_logprobs",
    "default_logprob_chunk_size",
    "fused_logprobs_unsupported",
    "prompt_chunks",
    "sampling_mode",
]

# Config fields (on the model's config or its text config) that change the logits after
# the lm_head matmul in some transformers architecture; the fused path would ignore them.
_SOFTCAP_FIELDS = ("final_logit_softcapping", "output_logit_soft_cap", "softcap")
_SCALE_FIELDS = ("logit_scale", "logits_scaling", "output_multiplier")
_TRUNCATE_FIELDS = ("unpadded_vocab_size",)

# Per model: the probe's verdict (None = fused path exact). Weak keys: a model that is
# deleted drops its entry; a new wrapper (e.g. PEFT) is a new key and is probed again.
_PROBED: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()

_MAX_CHUNK_BYTES = 256 * 2**20  # float32 logits of one chunk


@contextlib.contextmanager
def sampling_mode(model: Any) -> Iterator[None]:
    """Run the block with every module of ``model`` in eval mode, the mode the samplers
    generate in (no dropout), and give each module its own mode back afterwards.

    The updates compute their log-probs under it, so that the policy the ratio and the
    reference terms see is the one that sampled: the first PPO ratio of a batch is exactly
    1 and the DPO margin of a policy equal to its reference is 0, also for a model with
    dropout > 0 (in train mode, dropout made them random: TRL's RL and DPO trainers turn
    dropout off for the same reason). Gradients flow as usual. Objects without
    ``modules()`` are left as they are.
    """
    modules = getattr(model, "modules", None)
    if modules is None:
        yield
        return
    modes = [(m, m.training) for m in modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def default_logprob_chunk_size(vocab_size: int) -> int:
    """Rows (tokens) per chunk of the fused path on CPU: the largest power of two whose
    float32 ``[rows, V]`` chunk of logits stays within 256 MiB, between 64 and 1024 rows.

    At ``V = 151,936`` that is 256 rows (148 MiB), well under the float32 ``[V, H]`` weight
    gradient the update allocates anyway (519 MiB at ``H = 896``), so the chunk no longer
    sets the peak. CPU matmuls are compute-bound at these sizes, so smaller chunks cost
    no measurable time there (one [2048, 896] x [896, 151936] float32 matmul: 12.3 s in
    chunks of 256 rows, 14.8 s whole, 2 threads). On CUDA :func:`completion_logprobs` keeps
    the kernels' own default (at least 1024 rows), since every chunk re-reads the weight
    and re-accumulates its float32 gradient.

    Raises:
        ValueError: ``vocab_size < 1``.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    rows = max(1, _MAX_CHUNK_BYTES // (4 * vocab_size))
    return int(min(1024, max(64, 1 << (rows.bit_length() - 1))))


def fused_logprobs_unsupported(model: Any) -> str | None:
    """Why the fused path cannot compute ``model``'s log-probs exactly, or ``None`` if it can.

    The fused path computes ``log_softmax(decoder(x) @ W.T / T)`` with ``W`` the weight of
    ``model.get_output_embeddings()``; it is exact only when that is everything the model's
    own forward does after its decoder. Checked, in order:

    1. ``model`` has ``get_decoder`` and ``get_output_embeddings`` (a ``transformers``
       causal LM; a ``DistributedDataParallel`` or other wrapper is not) and carries no
       peft adapters, unless it is one of our LoRA views whose ``get_decoder`` selects
       their adapters (``selects_adapters``: a LoRA agent, agents in one batch, a LoRA
       agent's reference);
    2. the output embedding is a plain ``torch.nn.Linear`` (not a subclass with its own
       forward, e.g. a LoRA or quantized layer), has no bias and a floating-point weight;
    3. no forward hooks on the model or its lm_head (they would be bypassed) and no
       ``accelerate`` device-map hook;
    4. no final logit soft-capping (``final_logit_softcapping``, ...), logit scaling
       (``logit_scale``, ``logits_scaling``, ``output_multiplier`` other than 1) or vocabulary
       truncation (``unpadded_vocab_size``) in the config or its text config;
    5. a probe: on 4 tokens (one row per adapter block of an adapter batch), ``model(...).logits`` equals ``F.linear(decoder(...)
       .last_hidden_state, W)`` (rtol 1e-4, atol 1e-5: both sides run the same ops on the same
       inputs, so they agree to rounding; a scaling or soft-cap the config checks missed
       changes logits of order 1 by far more). Run once per model object (no grad, modules
       in eval mode for the probe, their modes restored after) and cached.

    Returns:
        A sentence naming what was found, or ``None`` when the fused path is exact.
    """
    decoder, head = (
        getattr(model, "get_decoder", None),
        getattr(model, "get_output_embeddings", None),
    )
    if not callable(decoder) or not callable(head):
        return (
            f"{type(model).__name__} has no get_decoder()/get_output_embeddings() "
            "(not a transformers causal LM)"
        )
    if getattr(model, "peft_config", None) is not None and not getattr(
        model, "selects_adapters", False
    ):
        # A bare peft model selects its adapter inside its forward; its decoder would run
        # whichever adapter happens to be active. Our LoRA views (LoraPolicy, AdapterBatch,
        # LoraReference) give a decoder that selects their adapters itself.
        return "the model carries peft (LoRA) adapters, which are selected in its forward"
    lm_head = head()
    if (
        not isinstance(lm_head, torch.nn.Linear)
        or type(lm_head).forward is not torch.nn.Linear.forward
    ):
        return f"the output embedding is a {type(lm_head).__name__}, not a plain torch.nn.Linear"
    if lm_head.bias is not None:
        return "the lm_head has a bias"
    if not lm_head.weight.dtype.is_floating_point:
        return f"the lm_head weight is {lm_head.weight.dtype}, not a floating-point tensor"
    for module, name in ((model, "the model"), (lm_head, "the lm_head")):
        hooks = getattr(module, "_forward_hooks", None) or getattr(
            module, "_forward_pre_hooks", None
        )
        if hooks or hasattr(module, "_hf_hook"):
            return f"{name} has forward hooks, which the fused path would bypass"
    config = getattr(model, "config", None)
    configs = [config]
    if config is not None and callable(getattr(config, "get_text_config", None)):
        configs.append(config.get_text_config())
    for cfg in configs:
        for field in _SOFTCAP_FIELDS + _TRUNCATE_FIELDS:
            if getattr(cfg, field, None) is not None:
                return f"the config sets {field}={getattr(cfg, field)!r}"
        for field in _SCALE_FIELDS:
            value = getattr(cfg, field, None)
            if value is not None and value != 1:
                return f"the config sets {field}={value!r}"
    if model not in _PROBED:
        _PROBED[model] = _probe(model, decoder(), lm_head)
    return _PROBED[model]


def _probe(model: Any, decoder: Any, lm_head: torch.nn.Linear) -> str | None:
    """Compare the model's own logits with the decoder's hidden states times the weight."""
    weight = lm_head.weight
    rows = len(getattr(model, "adapter_layout", None) or (0,))  # one row per adapter block
    ids = torch.arange(4, device=weight.device).remainder(weight.shape[0]).expand(rows, 4)
    try:
        with sampling_mode(model), torch.no_grad():
            full = model(input_ids=ids, use_cache=False).logits
            hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
            ours = torch.nn.functional.linear(hidden, weight)
    except Exception as err:  # any failure here only means: use the materialised path
        return f"calling the decoder alone failed ({type(err).__name__}: {err})"
    if full.shape != ours.shape:
        return (
            f"the model's logits {list(full.shape)} are not hidden @ lm_head.T {list(ours.shape)}"
        )
    if not torch.allclose(full.float(), ours.float(), rtol=1e-4, atol=1e-5):
        diff = float((full.float() - ours.float()).abs().max())
        return f"the model's logits differ from hidden @ lm_head.T by up to {diff:.3g} (post-processing)"
    return None


def completion_logprobs(
    model: Any,
    batch: PolicyBatch,
    prompts: slice,
    *,
    temperature: float = 1.0,
    shared_prefix: bool = True,
    fused: bool = True,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Log-probs ``[b, L]`` (float32, nats) of the completions of prompts ``prompts``.

    ``logp[i, j] = log_softmax(z[i, j] / temperature)[y[i, j]]`` where ``y`` are the
    completion tokens and ``z`` the logits at the positions predicting them. Differentiable
    with respect to the model's parameters. Positions past a completion's end get the
    log-prob of the padding token there; mask them with ``batch.completion_mask``.

    With ``shared_prefix`` each prompt runs through the model once and its KV cache (with
    its autograd graph) is repeated for its ``G`` completions, so prompt work is not
    repeated ``G`` times; the result and its gradient equal the plain per-sequence forward
    (tested to 1e-5). Without it, every row runs prompt and completion in one forward.

    With ``fused`` (default) the logits are never materialised whole: the decoder's last
    hidden states go through :func:`comlrl.kernels.linear_token_logprobs` in chunks of
    ``chunk_size`` tokens. Models for which that is not exact (see
    :func:`fused_logprobs_unsupported`) take the materialised path, with a ``UserWarning``
    naming the reason once per model.

    Args:
        model: a ``transformers`` causal LM (``logits_to_keep``, ``past_key_values``; for
            the fused path also ``get_decoder()`` and ``get_output_embeddings()``).
        batch: the agent's :class:`PolicyBatch`.
        prompts: which prompts (groups), as a slice over ``[0, N)``.
        temperature: the sampling temperature (> 0); log-probs are those of
            ``log_softmax(logits / temperature)``.
        shared_prefix: see above.
        fused: use the fused path where the model supports it.
        chunk_size: tokens per chunk of the fused path; ``None`` = on CPU
            :func:`default_logprob_chunk_size` of the vocabulary, elsewhere the default of
            :func:`comlrl.kernels.linear_token_logprobs`.

    Raises:
        ValueError: a non-positive temperature or chunk size (from the kernels).
    """
    g = batch.group_size
    rows = slice(prompts.start * g, prompts.stop * g)
    ids, mask = batch.input_ids[rows], batch.attention_mask[rows]
    length = batch.completion_mask.shape[1]
    s = ids.shape[1] - length
    head = None
    if fused:
        reason = fused_logprobs_unsupported(model)
        if reason is None:
            head = model.get_output_embeddings()
        elif model not in _WARNED:
            _WARNED.add(model)
            warnings.warn(
                f"fused log-probs are not exact for {type(model).__name__}: {reason}; using the "
                "materialised [tokens, vocab] logits (more memory). Set fused_logprobs=False to "
                "silence this.",
                stacklevel=2,
            )
    decoder = model.get_decoder() if head is not None else None
    if not shared_prefix:
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = torch.arange(s - 1, s - 1 + length, device=ids.device)
        feats = _run(
            model,
            decoder,
            keep,
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=False,
        )  # [b, L, H or V]
    else:
        prompt_ids, prompt_mask = ids[::g, :s], mask[::g, :s]
        cache: list[Any] = []
        first = _run(
            model,
            decoder,
            1,
            cache,
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
        ).repeat_interleave(g, dim=0)  # [b, 1, H or V]
        if length == 1:
            feats = first
        else:
            cache[0].batch_repeat_interleave(g)
            start = prompt_mask.sum(-1, keepdim=True).repeat_interleave(g, dim=0)
            rest = _run(
                model,
                decoder,
                0,
                input_ids=ids[:, s : s + length - 1],
                attention_mask=mask[:, : s + length - 1],
                position_ids=start + torch.arange(length - 1, device=ids.device),
                past=cache[0],
                use_cache=True,
            )  # [b, L - 1, H or V]
            feats = torch.cat([first, rest], dim=1)
    b = feats.shape[0]
    targets = ids[:, s:].reshape(-1)
    if head is None:
        logp = token_logprobs(feats.reshape(b * length, -1), targets, temperature=temperature)
    else:
        weight = head.weight
        if chunk_size is None and weight.device.type == "cpu":
            chunk_size = default_logprob_chunk_size(weight.shape[0])
        logp = linear_token_logprobs(
            feats.reshape(b * length, -1),
            weight,
            targets,
            temperature=temperature,
            chunk_size=chunk_size,
        )
    return logp.view(b, length)


def _run(
    model: Any,
    decoder: Any | None,
    keep: int | torch.Tensor,
    caches: list[Any] | None = None,
    past: Any | None = None,
    **inputs: Any,
) -> torch.Tensor:
    """Logits (``decoder is None``) or last hidden states at the positions ``keep`` selects:
    an int ``k`` keeps the last ``k`` (0 = all), a 1-D tensor those positions. ``past``:
    a KV cache to continue from; the returned KV cache is appended to ``caches`` when
    given."""
    callee = model if decoder is None else decoder
    if past is not None:
        inputs.update(cache_kwargs(callee, past))
    if decoder is None:
        out = model(**inputs, logits_to_keep=keep)
        feats = out.logits
    else:
        out = decoder(**inputs)
        hidden = out.last_hidden_state
        feats = (
            hidden[:, keep]
            if isinstance(keep, torch.Tensor)
            else hidden[:, -keep:]
            if keep
            else hidden
        )
    if caches is not None:
        caches.append(output_cache(out))
    return feats  # type: ignore[no-any-return]


def prompt_chunks(batch: PolicyBatch, micro_batch_size: int | None) -> list[slice]:
    """Micro-batches as slices of prompts: whole groups, so each prefix is computed once.

    ``micro_batch_size`` counts sequences and is rounded down to whole groups of ``G``
    (at least one group); ``None`` puts the whole batch in one chunk.
    """
    b = batch.completion_mask.shape[0]
    n = b // batch.group_size
    per = max(1, (micro_batch_size or b) // batch.group_size)
    return [slice(i, min(i + per, n)) for i in range(0, n, per)]
