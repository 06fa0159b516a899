"""comlrl.utils: the helpers of CoMLRL 1.4.3's ``comlrl.utils`` that user scripts import.

Provided: :class:`RewardProcessors` (``reward_processor=`` factories; CoMLRL's
tutorials use ``from comlrl.utils.reward_processor import RewardProcessors``) and
:func:`ensure_pad_token`. The rest of 1.4.3's ``comlrl.utils.__all__`` are its trainers'
internals (model loading, reference-KL, checkpoint and distributed plumbing); asking for
one raises :class:`NotProvidedError` naming it and what to use instead (see
docs/compat.md).
"""

from __future__ import annotations

from typing import Any

from comlrl.utils.reward_processor import RewardProcessors
from comlrl.utils.tokenizer_utils import ensure_pad_token

__all__ = ["NotProvidedError", "RewardProcessors", "ensure_pad_token"]


class NotProvidedError(ImportError):
    """A CoMLRL 1.4.3 ``comlrl.utils`` name this package does not provide (the message
    names it and the replacement)."""


#: CoMLRL 1.4.3's ``comlrl.utils.__all__`` names that are not provided -> what to use.
_NOT_PROVIDED = {
    "read_checkpoint_metadata": "comlrl.algos checkpoints (comlrl.algos.training.checkpoint)",
    "build_formatters": "pass formatters= to the trainer (None, one, or one per agent)",
    "ensure_tokenizer": "transformers.AutoTokenizer.from_pretrained + ensure_pad_token",
    "apply_tokenizer_specials": "model_config={'special_tokens': {...}} on the trainer",
    "resolve_tokenizers": "pass tokenizer= (one, or one per agent) to the trainer",
    "infer_model_name": "the trainer's model_name attribute",
    "resolve_model_sources": "pass agent_model= or agents= to the trainer",
    "clone_reference_models": "reference_kl_enabled=True in the config",
    "load_reference_models_from_sources": "reference_kl_enabled=True in the config",
    "reference_kl_coef": "the config's reference_kl_coef field",
    "reference_kl_enabled": "the config's reference_kl_enabled field",
    "reference_kl_for_sequence": "comlrl.algos.functional.losses (the k1/k2/k3 KL estimators)",
    "resolve_reference_devices": "reference_devices=None (models share the agents' device)",
    "validate_reference_kl_config": "the config dataclass, which validates itself",
    "call_reward_function": "the trainer, which calls reward_func in every 1.4.3 form",
    "normalize_reward_lengths": "the trainer (one reward per joint action is checked)",
    "resolve_reward_range": "nothing: rewards are not range-clipped here",
    "set_reward_range": "nothing: rewards are not range-clipped here",
    "DistributedContext": "torchrun with comlrl.algos (data_parallel)",
    "local_context": "torchrun with comlrl.algos (data_parallel)",
    "unwrap_model": "the trainer's agents attribute (plain transformers models)",
}


def __getattr__(name: str) -> Any:
    if name in _NOT_PROVIDED:
        raise NotProvidedError(
            f"comlrl.utils.{name} (a CoMLRL 1.4.3 internal helper) is not provided by this "
            f"package; use {_NOT_PROVIDED[name]}. See docs/compat.md.",
            name=name,
        )
    raise AttributeError(f"module 'comlrl.utils' has no attribute {name!r}")
