"""Chat prompts of the code suites (for instruct models) and how feedback turns continue them.

Every code suite returns :class:`comlrl.core.ChatPrompt` s: a short system message saying the
agent's role in the team and a user message with the problem and exactly what to write (one
fenced ``python`` block, only the agent's own function(s), no tests or example calls). Their
``raw`` text is the suite's completion-style prompt for base models, unchanged.

Multi-turn (the choice, for every code suite):

- **chat**: a feedback turn *continues the conversation*: the turn-0 messages, then for
  each earlier turn the agent's own completion as the assistant's message and that turn's
  feedback (verdict, failing test, error, teammate's signatures) as the next user message,
  ending with the request to write its part again in full. The model thus sees what it
  wrote, as it wrote it, and what went wrong. The completions come from
  ``Feedback.info["completions"]`` (the code suites' :meth:`feedback` puts them there); a
  feedback without them (e.g. built by other code) is shown inside one rebuilt user message
  instead.
- **raw**: the text prompt is *rebuilt*: the instructions, the latest feedback as ``#``
  comments, and the code the base model continues (as before; only the latest feedback is
  shown, since it already holds the agent's previous code).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from comlrl.core import ChatPrompt, Feedback

__all__ = [
    "helper_messages",
    "main_messages",
    "method_messages",
    "continue_conversation",
    "RETRY_REQUEST",
]

RETRY_REQUEST = "Fix the problem and write your part again in full, in one ```python code block."
"""Closes every feedback message of a continued conversation."""

_HELPER_SYSTEM = (
    "You are a Python programmer in a team of two. You write a helper function named "
    "`{helper}`. Your teammate writes `{entry}` and calls `{helper}`."
)
# The problem is told in words (signature + docstring text), not shown as code: shown the
# entry point's stub, SmolLM2-135M-Instruct rewrote the entry point instead of `aux` on
# 8 of 8 HumanEval test problems; told in words and shown the answer's shape, it wrote
# `aux` on 6 of 8 (greedy, see tests/data/record_smollm2.py).
_HELPER_USER = (
    "Your teammate's function `{signature}`:\n{description}\n\n"
    "Write the helper function `{helper}` that does one useful step of this task (not "
    "`{entry}` itself). Reply with only the function `{helper}` (and any imports it needs) "
    "in one ```python code block, like this:\n"
    "```python\ndef {helper}(...):\n    # your code\n    return result\n```\n"
    "Do not write tests or example calls."
)
_MAIN_SYSTEM = (
    "You are agent 2 in a team of two Python programmers. You write the function "
    "`{entry}`. Your teammate has written a helper function `{helper}` that you may call."
)
_MAIN_USER = (
    "Complete this function:\n```python\n{problem}\n```\n"
    "Write the whole function `{entry}` (the `def {entry}(...)` line and its body) in one "
    "```python code block. You may call `{helper}`; do not define it. "
    "Do not write tests or example calls."
)
_METHOD_SYSTEM = (
    "You are agent {agent} in a team of two Python programmers implementing the class "
    "`{cls}`. You write the methods {mine}; your teammate writes {theirs}."
)
_METHOD_USER = (
    "Here is the class skeleton:\n```python\n{skeleton}\n```\n"
    "Write your methods {mine} in full inside `class {cls}:` in one ```python code block. "
    "Do not write `__init__` or your teammate's methods, and no tests or example calls."
)


def _chat(system: str, user: str, raw: str) -> ChatPrompt:
    return ChatPrompt(
        ({"role": "system", "content": system}, {"role": "user", "content": user}), raw=raw
    )


def helper_messages(problem: str, entry: str, helper: str, raw: str) -> ChatPrompt:
    """Agent 1's turn-0 prompt: write ``helper`` for the problem whose code is ``problem``.

    The user message tells the problem in words: the entry point's signature and its
    docstring's text (the whole ``problem`` as code when it does not parse or lacks
    ``entry``), then the shape of the answer.

    Args:
        problem: the problem as code (imports, signature and docstring of ``entry``).
        entry: the entry point's name (written by the teammate).
        helper: the helper's name (``"aux"``).
        raw: the completion-style text for base models.
    """
    signature, description = _describe(problem, entry)
    fmt = {
        "signature": signature,
        "description": description,
        "entry": entry,
        "helper": helper,
    }
    return _chat(_HELPER_SYSTEM.format(**fmt), _HELPER_USER.format(**fmt), raw)


def _describe(problem: str, entry: str) -> tuple[str, str]:
    """``(signature, docstring text)`` of ``entry`` in ``problem``; falls back to
    ``("<entry>(...)", problem as a code block)``."""
    try:
        module = ast.parse(problem)
    except (SyntaxError, ValueError):
        module = None
    for node in module.body if module is not None else []:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry:
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            doc = ast.get_docstring(node) or ""
            if doc.strip():
                return f"{entry}({ast.unparse(node.args)}){returns}", doc.strip()
    return f"{entry}(...)", f"```python\n{problem.strip(chr(10))}\n```"


def main_messages(problem: str, entry: str, helper: str, raw: str) -> ChatPrompt:
    """Agent 2's turn-0 prompt: write the whole ``entry`` function (it may call ``helper``)."""
    fmt = {"problem": problem.strip("\n"), "entry": entry, "helper": helper}
    return _chat(_MAIN_SYSTEM.format(**fmt), _MAIN_USER.format(**fmt), raw)


def method_messages(
    skeleton: str, cls: str, mine: Sequence[str], theirs: Sequence[str], agent: int, raw: str
) -> ChatPrompt:
    """ClassEval agent ``agent`` (0-based)'s turn-0 prompt: its share of ``cls``'s methods."""
    fmt = {
        "skeleton": skeleton.strip("\n"),
        "cls": cls,
        "mine": ", ".join(f"`{m}`" for m in mine) or "(none)",
        "theirs": ", ".join(f"`{m}`" for m in theirs) or "nothing",
        "agent": agent + 1,
    }
    return _chat(_METHOD_SYSTEM.format(**fmt), _METHOD_USER.format(**fmt), raw)


def continue_conversation(
    first: ChatPrompt, history: Sequence[Feedback], agent: int, raw: str
) -> ChatPrompt:
    """Agent ``agent``'s prompt after the turns in ``history`` (see the module docstring).

    Args:
        first: the agent's turn-0 chat prompt.
        history: the feedback of earlier turns, oldest first.
        agent: the agent's index (which of ``Feedback.texts`` and completions is its own).
        raw: the rebuilt completion-style text for base models (latest feedback only).

    Returns:
        ``first`` (with ``raw``) when ``history`` is empty; else the conversation
        continued with one assistant + user pair per turn whose feedback carries the
        completions, ending with the latest feedback and :data:`RETRY_REQUEST`.
    """
    if not history:
        return ChatPrompt(first.messages, raw=raw)
    messages = list(first.messages)
    for fb in history:
        note = f"Feedback on your team's attempt:\n{fb.texts[agent]}\n\n{RETRY_REQUEST}"
        completions = fb.info.get("completions") if fb.info else None
        if isinstance(completions, Sequence) and len(completions) > agent:
            messages.append({"role": "assistant", "content": str(completions[agent])})
            messages.append({"role": "user", "content": note})
        else:  # no completion to show: fold the feedback into the last user message
            last = messages[-1]
            messages[-1] = {"role": last["role"], "content": f"{last['content']}\n\n{note}"}
    return ChatPrompt(tuple(messages), raw=raw)
