"""Prompts as chat messages (for instruct models) or plain text (for base models).

A task's :meth:`~comlrl.core.Task.prompts` returns one :data:`Prompt` per agent: a plain
``str`` (completion-style text, as CoMLRL's formatters write it) or a :class:`ChatPrompt`
(a tuple of chat messages, with an optional ``raw`` text form for base models). The agent
decides how to feed it:

- ``prompt_format="chat"`` (or ``"auto"`` with a tokenizer that has a chat template):
  the tokenizer's chat template is applied to :func:`chat_messages` ``(prompt)``;
- ``prompt_format="raw"`` (or ``"auto"`` without a template): the model sees
  :func:`prompt_text` ``(prompt)``.

A plain string is valid everywhere: as chat it becomes one user message, as raw text it is
itself. Nothing here imports torch or a tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

__all__ = ["ChatPrompt", "Prompt", "ROLES", "prompt_text", "chat_messages", "prompt_key"]

ROLES = ("system", "user", "assistant")
"""The message roles a :class:`ChatPrompt` accepts."""


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A prompt as chat messages, for instruct models, with an optional text form for base models.

    Attributes:
        messages: the conversation so far, oldest first; each message a mapping
            ``{"role": "system" | "user" | "assistant", "content": str}``. Stored as a tuple
            of plain dicts (copies of what was given). The last message is not the
            assistant's: the model writes the next assistant turn.
        raw: completion-style text for base models (``prompt_format="raw"``); ``None``
            renders the messages' contents plainly (see :meth:`text`).

    Raises:
        ValueError: for no messages, a message that is not a mapping with exactly the keys
            ``role`` and ``content``, an unknown role, a non-string content, a last message
            from the assistant, or a ``raw`` that is not a string (the message names the
            offending value).
    """

    messages: tuple[dict[str, str], ...]
    raw: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.messages, (str, bytes)) or not isinstance(self.messages, Sequence):
            raise ValueError(
                f"ChatPrompt.messages must be a sequence of {{'role', 'content'}} dicts, "
                f"got {type(self.messages).__name__}: {self.messages!r:.120}"
            )
        if not self.messages:
            raise ValueError("ChatPrompt needs at least one message, got none")
        checked = tuple(_check_message(i, m) for i, m in enumerate(self.messages))
        if checked[-1]["role"] == "assistant":
            raise ValueError(
                "ChatPrompt's last message is the assistant's "
                f"({checked[-1]['content']!r:.80}); end with a user (or system) message "
                "so the model writes the next assistant turn"
            )
        if self.raw is not None and not isinstance(self.raw, str):
            raise ValueError(
                f"ChatPrompt.raw must be a str or None, got {type(self.raw).__name__}: "
                f"{self.raw!r:.80}"
            )
        object.__setattr__(self, "messages", checked)

    def __hash__(self) -> int:
        # the dataclass hash would hash the (unhashable) message dicts
        return hash((tuple((m["role"], m["content"]) for m in self.messages), self.raw))

    def text(self) -> str:
        """``raw`` if given, else the messages' contents joined by blank lines."""
        if self.raw is not None:
            return self.raw
        return "\n\n".join(m["content"] for m in self.messages)

    def continued(self, assistant: str, user: str) -> ChatPrompt:
        """This conversation plus the assistant's answer and the user's next message.

        ``raw`` is not carried over (the new prompt's ``raw`` is ``None``); pass a rebuilt
        text with :func:`dataclasses.replace` when base models need one.

        Raises:
            ValueError: when ``assistant`` or ``user`` is not a string.
        """
        return ChatPrompt(
            (
                *self.messages,
                {"role": "assistant", "content": assistant},
                {"role": "user", "content": user},
            )
        )


def _check_message(index: int, message: Any) -> dict[str, str]:
    if not isinstance(message, Mapping):
        raise ValueError(
            f"ChatPrompt message {index} must be a mapping with 'role' and 'content', "
            f"got {type(message).__name__}: {message!r:.80}"
        )
    if set(message) != {"role", "content"}:
        raise ValueError(
            f"ChatPrompt message {index} must have exactly the keys 'role' and 'content', "
            f"got {sorted(map(str, message))}"
        )
    role, content = message["role"], message["content"]
    if role not in ROLES:
        raise ValueError(
            f"ChatPrompt message {index} has unknown role {role!r}; use one of {list(ROLES)}"
        )
    if not isinstance(content, str):
        raise ValueError(
            f"ChatPrompt message {index} ({role}) content must be a str, "
            f"got {type(content).__name__}: {content!r:.80}"
        )
    return {"role": role, "content": content}


Prompt = Union[str, ChatPrompt]  # noqa: UP007 - a runtime alias that must work on Python 3.10
"""One agent's prompt: completion-style text, or chat messages (:class:`ChatPrompt`)."""


def prompt_text(prompt: Prompt) -> str:
    """What a base model sees (``prompt_format="raw"``): the string itself, or
    :meth:`ChatPrompt.text`.

    Raises:
        TypeError: when ``prompt`` is neither a ``str`` nor a :class:`ChatPrompt`.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, ChatPrompt):
        return prompt.text()
    raise TypeError(_not_a_prompt(prompt))


def chat_messages(prompt: Prompt) -> list[dict[str, str]]:
    """The messages a chat template is applied to: a string becomes one user message.

    Returns fresh dicts (safe to modify).

    Raises:
        TypeError: when ``prompt`` is neither a ``str`` nor a :class:`ChatPrompt`.
    """
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, ChatPrompt):
        return [dict(m) for m in prompt.messages]
    raise TypeError(_not_a_prompt(prompt))


def prompt_key(prompt: Prompt) -> str:
    """A stable string for logs, JSON and dictionary keys.

    A string is its own key; a :class:`ChatPrompt` is ``json.dumps`` of its messages (and
    ``raw`` when given), so two prompts have the same key exactly when they are equal.

    Raises:
        TypeError: when ``prompt`` is neither a ``str`` nor a :class:`ChatPrompt`.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, ChatPrompt):
        payload: dict[str, Any] = {"messages": list(prompt.messages)}
        if prompt.raw is not None:
            payload["raw"] = prompt.raw
        return json.dumps(payload, ensure_ascii=False, sort_keys=True)
    raise TypeError(_not_a_prompt(prompt))


def _not_a_prompt(prompt: object) -> str:
    return (
        f"a prompt must be a str or a comlrl.core.ChatPrompt, got {type(prompt).__name__}: "
        f"{prompt!r:.80}"
    )
