"""An agent's tools for a turn: how they are declared to the model, run, and shown back.

:class:`ToolBox` holds one agent's :class:`comlrl.core.Tool` s, the call format its task
asks for, the per-turn limits, and the thread pool its calls run on.
:func:`render_tool_prompts` writes the prompts with the tools declared and
:func:`observation_text` the text a result comes back as:

- a chat template that renders tools (``apply_chat_template(..., tools=...)``, e.g.
  Qwen2.5 and Hermes templates) declares them and renders each result as the template's
  tool message, with the ``<tool_call>{json}</tool_call>`` call format;
- otherwise the task's ``tool_format`` (json, or fenced ``python`` blocks) is used: the
  tools are declared by :meth:`comlrl.core.ToolFormat.describe` in the system message (or
  ahead of a raw prompt), and results come back as
  :meth:`comlrl.core.ToolFormat.result_text`.

:mod:`comlrl.algos.rollout.tool_calls` runs the sampling loop that uses them.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from comlrl.core import (
    JsonToolFormat,
    Tool,
    ToolFormat,
    ToolResult,
    get_tool_format,
    run_tool_call,
)
from comlrl.core.prompts import Prompt, chat_messages, prompt_text

__all__ = [
    "ToolBox",
    "cut_content",
    "observation_ids",
    "observation_text",
    "render_tool_prompts",
    "resolve_tool_format",
    "template_renders_tools",
]

_MARK = "\x00COMLRL_TOOL_MARK\x00"


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template renders a ``tools`` list (and tool messages)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and "tools" in template and "tool" in template


@dataclass
class ToolBox:
    """One agent's tools for a turn, and how calls are run.

    Attributes:
        tools: the agent's tools.
        fallback_format: the task's call format for templates that do not render tools.
        max_tool_calls: calls run per completion per turn; later calls get ``"limit"``.
        max_result_tokens: the most tokens of an observation; a longer one gets its
            result's content cut (:func:`observation_ids`), never its markup.
        executor: where calls run (threads; a sandboxed tool's thread waits on its child
            process). ``None``: a pool of :attr:`max_workers` threads made on first use.
        max_workers: size of that pool.
    """

    tools: tuple[Tool, ...]
    fallback_format: str = "json"
    max_tool_calls: int = 4
    max_result_tokens: int = 256
    executor: concurrent.futures.Executor | None = None
    max_workers: int = 16
    _own: concurrent.futures.ThreadPoolExecutor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {self.max_tool_calls}")
        if self.max_result_tokens < 1:
            raise ValueError(f"max_result_tokens must be >= 1, got {self.max_result_tokens}")
        get_tool_format(self.fallback_format)  # raises on an unknown name
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"two tools share a name: {names}; give each tool its own name")

    @property
    def by_name(self) -> dict[str, Tool]:
        """The tools by name."""
        return {t.name: t for t in self.tools}

    def submit(self, fmt: ToolFormat, call_text: str) -> concurrent.futures.Future[ToolResult]:
        """Run one call in the pool; the future never raises (see
        :func:`comlrl.core.run_tool_call`)."""
        pool = self.executor
        if pool is None:
            if self._own is None:
                self._own = concurrent.futures.ThreadPoolExecutor(
                    self.max_workers, thread_name_prefix="comlrl-tools"
                )
            pool = self._own
        return pool.submit(run_tool_call, self.by_name, fmt, call_text)

    def close(self) -> None:
        """Shut the pool this box made down (safe to call twice)."""
        if self._own is not None:
            self._own.shutdown(wait=False, cancel_futures=True)
            self._own = None


def resolve_tool_format(
    tokenizer: Any, prompt_format: str, box: ToolBox
) -> tuple[ToolFormat, bool]:
    """The call format an agent uses and whether its chat template renders the tools.

    A chat agent whose template renders tools uses :class:`~comlrl.core.JsonToolFormat`
    through the template; every other agent uses ``box.fallback_format``.
    """
    if prompt_format == "chat" and template_renders_tools(tokenizer):
        return JsonToolFormat(), True
    return get_tool_format(box.fallback_format), False


def _with_declaration(prompt: Prompt, declaration: str) -> list[dict[str, str]]:
    """Chat messages of ``prompt`` with the tool declaration in the system message."""
    messages = [dict(m) for m in chat_messages(prompt)]
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{declaration}"
    else:
        messages.insert(0, {"role": "system", "content": declaration})
    return messages


def render_tool_prompts(
    tokenizer: Any, prompts: Sequence[Prompt], prompt_format: str, box: ToolBox
) -> tuple[list[str], ToolFormat, bool]:
    """Model-input texts of ``prompts`` with the tools declared, the call format, and
    whether the template renders tools (see the module docstring)."""
    fmt, templated = resolve_tool_format(tokenizer, prompt_format, box)
    schemas = [t.schema() for t in box.tools]
    if templated:
        texts = [
            tokenizer.apply_chat_template(
                chat_messages(p), tools=schemas, add_generation_prompt=True, tokenize=False
            )
            for p in prompts
        ]
    elif prompt_format == "chat":
        declaration = fmt.describe(box.tools)
        texts = [
            tokenizer.apply_chat_template(
                _with_declaration(p, declaration), add_generation_prompt=True, tokenize=False
            )
            for p in prompts
        ]
    else:
        declaration = fmt.describe(box.tools)
        texts = [f"{declaration}\n\n{prompt_text(p)}" for p in prompts]
    return texts, fmt, templated


def observation_text(
    tokenizer: Any, prompt: Prompt, fmt: ToolFormat, templated: bool, result: ToolResult
) -> str:
    """The text appended after a call: the template's tool message (from the end of the
    assistant's text to the start of its next message) or ``fmt.result_text``."""
    if not templated:
        return fmt.result_text(result)
    messages = [
        *chat_messages(prompt),
        {"role": "assistant", "content": _MARK},
        {"role": "tool", "content": result.content},
    ]
    full = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    at = full.rfind(_MARK)
    if at < 0:  # a template that drops assistant content: fall back to plain text
        return fmt.result_text(result)
    return full[at + len(_MARK) :]


def cut_content(content: str, keep: int) -> str:
    """``content`` cut to its first ``keep`` characters, with a note of how many were cut
    (``"[... N characters cut]"`` on a line of its own); ``content`` itself when
    ``keep >= len(content)``."""
    if keep >= len(content):
        return content
    keep = max(keep, 0)
    return f"{content[:keep]}\n[... {len(content) - keep} characters cut]"


def observation_ids(
    tokenizer: Any,
    prompt: Prompt,
    fmt: ToolFormat,
    templated: bool,
    result: ToolResult,
    max_tokens: int,
) -> tuple[ToolResult, list[int]]:
    """The observation of ``result`` as token ids, at most ``max_tokens`` of them where the
    markup allows, and the result as the model reads it.

    A result whose observation (:func:`observation_text`) is longer keeps the start of its
    content, cut at the most characters that fit, with a note of how many characters were
    cut (:func:`cut_content`); the observation's markup (the closing fence, the end of the
    tool message and the next assistant header) is always whole, so the model always goes
    on in its own message. When the markup and the note alone take more than
    ``max_tokens``, the observation is the markup with the note (longer than
    ``max_tokens``).

    Returns:
        ``(result, ids)``: the result with the content the model reads (``result`` itself
        when nothing was cut) and the observation's token ids (no special tokens added).
    """

    def render(content: str) -> list[int]:
        text = observation_text(tokenizer, prompt, fmt, templated, replace(result, content=content))
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    ids = render(result.content)
    if len(ids) <= max_tokens:
        return result, ids
    content = result.content
    # the most characters whose observation fits (tokens grow with the characters kept)
    lo, hi = 0, len(content) - 1
    best: list[int] | None = None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        trial = render(cut_content(content, mid))
        if len(trial) <= max_tokens:
            lo, best = mid, trial
        else:
            hi = mid - 1
    if best is None:  # not even one character fits: the markup and the note
        best = render(cut_content(content, lo))
    return replace(result, content=cut_content(content, lo)), best
