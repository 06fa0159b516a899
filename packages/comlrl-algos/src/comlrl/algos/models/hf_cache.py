"""The KV cache's name in a ``transformers`` model's forward: ``cache`` or ``past_key_values``.

transformers 5.24 renamed the forward argument and the output field ``past_key_values`` to
``cache`` (the old name still works there, with a deprecation warning); earlier releases,
and models with their own modelling code (``trust_remote_code``), know only
``past_key_values``. These two helpers pick the name the model at hand uses, so the
sampler and the log-prob path work on both without warnings.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

__all__ = ["cache_kwargs", "output_cache"]


@functools.lru_cache(maxsize=64)
def _cache_name(cls: type) -> str:
    forward = getattr(cls, "forward", None)
    try:
        params = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    # a wrapper taking **kwargs (peft's LoRA model, our LoraReference): the transformers
    # release decides
    from transformers.modeling_outputs import CausalLMOutputWithPast

    fields = getattr(CausalLMOutputWithPast, "__dataclass_fields__", {})
    return "cache" if "cache" in fields else "past_key_values"


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model(...)``, with the KV-cache argument's name the model
    takes (``cache`` from transformers 5.24 on, else ``past_key_values``)."""
    return {_cache_name(type(model)): cache}  # type: ignore[arg-type]  # classes hash


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned: ``output.cache`` (transformers >= 5.24) or
    ``output.past_key_values``."""
    fields = getattr(output, "__dataclass_fields__", {})
    if "cache" in fields:
        return output.cache
    return output.past_key_values
