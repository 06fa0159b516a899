"""CoMLRL 1.4.3's ``ensure_pad_token``."""

from __future__ import annotations

from typing import Any

__all__ = ["ensure_pad_token"]


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token (its EOS token) when it has none; returns it.

    Raises:
        ValueError: the tokenizer has neither a pad nor an EOS token.
    """
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has no pad token and no EOS token to use as one; "
            "set tokenizer.pad_token (or add one with add_special_tokens)."
        )
    return tokenizer
