"""comlrl.utils: CoMLRL 1.4.3's ``comlrl.utils`` helpers that user scripts import.

Its module paths are kept: :mod:`comlrl.utils.reward_utils` (calling a reward function in
1.4.3's forms, ``set_reward_range``), :mod:`comlrl.utils.formatters`,
:mod:`comlrl.utils.wandb_utils`, :mod:`comlrl.utils.distributed`,
:mod:`comlrl.utils.reward_processor` (``RewardProcessors``) and
:mod:`comlrl.utils.tokenizer_utils` (``ensure_pad_token``).
The rest of 1.4.3's ``comlrl.utils.__all__`` are its trainers' internals (reference-KL
helpers, its checkpoint reader); asking for one raises :class:`NotProvidedError` naming it
and what to use instead (docs/compat.md).

Names load lazily (PEP 562): importing this package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from comlrl.utils.reward_processor import RewardProcessors
from comlrl.utils.tokenizer_utils import ensure_pad_token

#: provided names -> their module under comlrl.utils
_EXPORTS = {
    "build_formatters": "formatters",
    "call_reward_function": "reward_utils",
    "normalize_reward_lengths": "reward_utils",
    "resolve_reward_range": "reward_utils",
    "set_reward_range": "reward_utils",
    "DistributedContext": "distributed",
    "local_context": "distributed",
    "unwrap_model": "distributed",
}

__all__ = ["NotProvidedError", "RewardProcessors", "ensure_pad_token", *_EXPORTS]


class NotProvidedError(ImportError):
    """A CoMLRL 1.4.3 ``comlrl.utils`` name this package does not provide (the message
    names it and the replacement)."""


#: CoMLRL 1.4.3's ``comlrl.utils.__all__`` names that are not provided -> what to use.
_NOT_PROVIDED = {
    "ensure_tokenizer": "transformers.AutoTokenizer.from_pretrained + ensure_pad_token",
    "apply_tokenizer_specials": "model_config={'special_tokens': {...}} on the trainer",
    "resolve_tokenizers": "pass tokenizer= (one, or one per agent) to the trainer",
    "infer_model_name": "the trainer's model_name attribute",
    "resolve_model_sources": "pass agent_model= or agents= to the trainer",
    "load_reference_models_from_sources": "reference_kl_enabled=True in the config",
    "clone_reference_models": "reference_kl_enabled=True in the config",
    "reference_kl_coef": "the config's reference_kl_coef",
    "reference_kl_enabled": "the config's reference_kl_enabled",
    "reference_kl_for_sequence": "comlrl.algos.kl_penalty",
    "resolve_reference_devices": "the config's reference_devices",
    "validate_reference_kl_config": "building the config (it checks its fields)",
    "read_checkpoint_metadata": "train(resume_from_checkpoint=...) (comlrl.algos' format)",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"comlrl.utils.{module}"), name)
        globals()[name] = value
        return value
    if name in _NOT_PROVIDED:
        raise NotProvidedError(
            f"comlrl.utils.{name} (a CoMLRL 1.4.3 internal helper) is not provided by this "
            f"package; use {_NOT_PROVIDED[name]}. See docs/compat.md.",
            name=name,
        )
    raise AttributeError(f"module 'comlrl.utils' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
