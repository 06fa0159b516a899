"""CoMLRL 1.4.3's ``comlrl.utils.formatters``: per-agent prompt formatters from the
trainers' ``formatters`` argument."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Formatter", "build_formatters"]

#: ``formatter(example, external_prompts=None) -> prompt``.
Formatter = Callable[..., str]


def _default_formatter(example: Mapping[str, Any], external_prompts: Any = None) -> Any:
    """``external_prompts`` when given (even ``""``), else ``example["prompt"]`` (``""``
    when absent)."""
    if external_prompts is not None:
        return external_prompts
    return example.get("prompt", "")


def _wrap(fmt: Callable[..., Any], pass_none: bool) -> Formatter:
    try:
        takes_external = "external_prompts" in inspect.signature(fmt).parameters
    except (TypeError, ValueError):
        takes_external = False

    def formatter(example: Mapping[str, Any], external_prompts: Any = None) -> Any:
        if takes_external and (pass_none or external_prompts is not None):
            return fmt(example, external_prompts=external_prompts)
        return fmt(example)

    formatter.__wrapped__ = fmt  # type: ignore[attr-defined]
    return formatter


def build_formatters(
    formatters: Any, num_agents: int, *, pass_none_external_prompts: bool = True
) -> list[Formatter]:
    """``A`` formatters ``(example, external_prompts=None) -> prompt``.

    ``None``: each returns ``external_prompts`` when given, else ``example["prompt"]``;
    one callable: shared by all agents; a sequence: one per agent. A user formatter that
    declares ``external_prompts`` receives it (with ``pass_none_external_prompts=False``
    only when it is not None, so its own default applies on the first turn); one that
    does not is called with the example alone.

    Raises:
        ValueError: a sequence whose length is not ``num_agents``, a non-callable in it,
            or something that is neither None, a callable nor a sequence.
    """
    if formatters is None:
        return [_default_formatter] * num_agents
    if callable(formatters):
        return [_wrap(formatters, pass_none_external_prompts)] * num_agents
    if isinstance(formatters, Sequence) and not isinstance(formatters, (str, bytes)):
        if len(formatters) != num_agents:
            raise ValueError(
                f"Number of formatters must match num_agents: got {len(formatters)} formatters for "
                f"num_agents={num_agents}; give one per agent or a single one for all."
            )
        bad = [f for f in formatters if not callable(f)]
        if bad:
            raise ValueError(f"formatters must be callables, got {bad!r}")
        return [_wrap(f, pass_none_external_prompts) for f in formatters]
    raise ValueError(
        "formatters must be None, a callable, or a sequence of callables, got "
        f"{type(formatters).__name__}"
    )
