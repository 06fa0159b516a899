"""Prompts to model input text: the tokenizer's chat template for instruct models, plain text
for base models.

A task's prompt is a plain ``str`` or a :class:`comlrl.core.ChatPrompt` (chat messages with an
optional ``raw`` text form). How an agent feeds it to its model is its *prompt format*:

- ``"chat"``: ``tokenizer.apply_chat_template(chat_messages(prompt), add_generation_prompt=True)``
  (a plain string becomes one user message). The rendered text already holds the special
  tokens the template wants (BOS, role markers), so it is tokenized without adding any.
- ``"raw"``: :func:`comlrl.core.prompt_text` (the string itself, or the chat prompt's ``raw``
  text), tokenized with the tokenizer's usual special tokens.
- ``"auto"`` (default): ``"chat"`` when the tokenizer has a chat template, else ``"raw"``.
  Instruct models (SmolLM2-Instruct, Qwen2.5-Instruct, Llama-3-Instruct) ship a template;
  base models (and the built-in ``stories260k``) do not, so they keep completion-style text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from comlrl.core.prompts import ChatPrompt, chat_messages, prompt_text

__all__ = [
    "PromptFormat",
    "PROMPT_FORMATS",
    "has_chat_template",
    "resolve_prompt_format",
    "render_prompts",
]

PromptFormat = Literal["auto", "chat", "raw"]
#: The accepted prompt formats.
PROMPT_FORMATS: tuple[str, ...] = ("auto", "chat", "raw")


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template (``tokenizer.chat_template`` is set)."""
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_prompt_format(tokenizer: Any, prompt_format: str, *, name: str = "agent") -> str:
    """``"chat"`` or ``"raw"`` for ``prompt_format`` (``auto`` looks at the tokenizer).

    Raises:
        ValueError: an unknown ``prompt_format``, or ``"chat"`` for a tokenizer without a
            chat template (use ``"raw"``, or set ``tokenizer.chat_template``).
    """
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(
            f"{name}: unknown prompt_format {prompt_format!r}; use one of {list(PROMPT_FORMATS)}"
        )
    if prompt_format == "auto":
        return "chat" if has_chat_template(tokenizer) else "raw"
    if prompt_format == "chat" and not has_chat_template(tokenizer):
        raise ValueError(
            f"{name}: prompt_format='chat' but the tokenizer has no chat template (a base "
            "model?); use prompt_format='raw' (or 'auto'), or set tokenizer.chat_template."
        )
    return prompt_format


def render_prompts(tokenizer: Any, prompts: Sequence[str | ChatPrompt], fmt: str) -> list[str]:
    """The model-input text of each prompt under the resolved format ``fmt`` (``chat``/``raw``).

    Raises:
        TypeError: a prompt that is neither a ``str`` nor a :class:`~comlrl.core.ChatPrompt`.
    """
    if fmt == "raw":
        return [prompt_text(p) for p in prompts]
    return [
        tokenizer.apply_chat_template(chat_messages(p), add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
