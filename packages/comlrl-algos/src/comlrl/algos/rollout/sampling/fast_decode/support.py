"""Which models the lean decode step (:class:`~comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder`)
can run: a known Llama-family architecture whose every module on the decode path is a plain
``torch.nn`` building block (no quantized linears, hooks, FSDP sharding or sliding windows
longer than the decoded sequence), or vanilla LoRA layers over plain linears on a model
that names its adapter layout (:func:`adapter_layout`: a LoRA agent, or agents sharing one
base)."""

from __future__ import annotations

from typing import Any

from comlrl.algos.rollout.sampling.fast_decode.lora import is_lora_layer, lora_reason
from torch import nn

__all__ = ["SUPPORTED_MODEL_TYPES", "adapter_layout", "unsupported_reason"]

#: ``config.model_type`` values whose decoder layers ``FastDecoder`` reproduces.
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})

#: Activation module classes that compute ``x * sigmoid(x)`` exactly (torch's and
#: ``transformers.activations``').
_SILU_TYPES = frozenset({"SiLU", "SiLUActivation"})


def _plain_linear(m: Any) -> bool:
    return type(m) is nn.Linear and not _has_hooks(m)


def adapter_layout(model: Any) -> list[str] | None:
    """The LoRA adapters of ``model``'s rows, one per equal contiguous block of rows
    (``model.adapter_layout``: ``[name]`` for a LoRA agent, one name per agent for agents
    decoding together on one base), or ``None`` for a model without one."""
    layout = getattr(model, "adapter_layout", None)
    return None if layout is None else [str(x) for x in layout]


def _linear_reason(m: Any, layout: list[str] | None) -> str | None:
    """Why the step cannot apply ``m`` (``None``: a plain linear, or a LoRA layer it reads)."""
    if m is None or _has_hooks(m):
        return "missing or hooked"
    if is_lora_layer(m):
        return lora_reason(m, layout)
    return None if _plain_linear(m) else f"a {type(m).__name__}, not a plain nn.Linear"


def _is_fsdp(model: Any) -> bool:
    """True for a model that ``torch.distributed.fsdp.fully_shard`` has wrapped."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch build without distributed support
        return False
    return isinstance(model, FSDPModule)


def _has_hooks(m: nn.Module) -> bool:
    return bool(
        m._forward_hooks or m._forward_pre_hooks or getattr(m, "_forward_hooks_with_kwargs", None)
    )


def unsupported_reason(model: Any, max_length: int | None = None) -> str | None:
    """Why :class:`FastDecoder` cannot run ``model`` (``None`` when it can).

    Args:
        model: the causal LM.
        max_length: the longest sequence (prompt plus completion) that will be
            decoded; needed to accept models with a sliding window longer than it.
    """
    if _is_fsdp(model):
        return (
            "the model is sharded by FSDP2 (data_parallel='fsdp2'); decoding runs through "
            "its forward, on the weights gathered for the rollout"
        )
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(cfg, 'hidden_act', None)!r} is not 'silu'"
    if (getattr(cfg, "pretraining_tp", 1) or 1) != 1:
        return "pretraining_tp > 1"
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if base is None or layers is None or not len(layers):
        return "no model.model.layers"
    embed, norm, head = (
        getattr(base, "embed_tokens", None),
        getattr(base, "norm", None),
        getattr(model, "lm_head", None),
    )
    if (
        type(embed) is not nn.Embedding
        or _has_hooks(embed)
        or not _plain_linear(head)
        or getattr(head, "bias", None) is not None
    ):
        return "embedding or LM head is not a plain nn.Embedding / bias-free nn.Linear"
    if norm is None or _has_hooks(norm) or _has_hooks(model) or _has_hooks(base):
        return "hooks on the model (e.g. accelerate offloading) or no final norm"
    if getattr(base, "rotary_emb", None) is None:
        return "no model.model.rotary_emb"
    layout = adapter_layout(model)
    for i, layer in enumerate(layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None or _has_hooks(layer) or _has_hooks(attn) or _has_hooks(mlp):
            return f"layer {i} has hooks or no self_attn/mlp"
        names = {n for n, _ in attn.named_children()}
        if names != {"q_proj", "k_proj", "v_proj", "o_proj"}:
            return f"layer {i} attention has modules {sorted(names)} (expected q/k/v/o_proj only)"
        for n in (*sorted(names), "gate_proj", "up_proj", "down_proj"):
            module = getattr(attn if n in names else mlp, n, None)
            reason = _linear_reason(module, layout)
            if reason is not None:
                return f"layer {i} {n}: {reason}"
        if type(getattr(mlp, "act_fn", None)).__name__ not in _SILU_TYPES:
            return f"layer {i} MLP activation is not SiLU"
        window = getattr(attn, "sliding_window", None)
        if window is None and model_type == "mistral":
            window = getattr(cfg, "sliding_window", None)
        if window is not None and (max_length is None or max_length > int(window)):
            return f"layer {i} uses a sliding window of {window} tokens"
        for n in ("input_layernorm", "post_attention_layernorm"):
            ln = getattr(layer, n, None)
            if ln is None or _has_hooks(ln) or not hasattr(ln, "variance_epsilon"):
                return f"layer {i} {n} is not an RMSNorm"
    return None
