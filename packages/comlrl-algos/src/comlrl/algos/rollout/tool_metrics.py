"""Counting an agent's tool calls for the step and evaluation metrics.

:func:`tool_counts` reads one agent's :class:`~comlrl.algos.records.AgentSamples` (the
``tool_results`` of its completions), :func:`sum_tool_counts` adds counts up (turns, ranks,
batches), and :func:`tool_metrics` turns them into the metric keys documented there
(``tool_calls_mean/agent_<a>``, ``tool_errors/<kind>``, ``tool_error_fraction``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from comlrl.algos.records import AgentSamples
from comlrl.core import TOOL_ERROR_KINDS

__all__ = ["sum_tool_counts", "tool_counts", "tool_metrics"]


def tool_counts(samples: AgentSamples) -> dict[str, float] | None:
    """Tool-call counts of one agent's completions (``None`` when it had no tools):
    ``completions``, ``calls``, ``result_tokens``, ``seconds`` and one count per error kind
    that occurred."""
    if not samples.with_tools:
        return None
    counts = {"completions": 0.0, "calls": 0.0, "result_tokens": 0.0, "seconds": 0.0}
    for group in samples.completions:
        for c in group:
            counts["completions"] += 1
            for r in c.tool_results:
                counts["calls"] += 1
                counts["result_tokens"] += r.result_tokens
                counts["seconds"] += r.seconds
                if r.error is not None:
                    counts[r.error] = counts.get(r.error, 0.0) + 1
    return counts


def sum_tool_counts(parts: Sequence[Mapping[str, float] | None]) -> dict[str, float] | None:
    """The key-wise sum of :func:`tool_counts` results (``None`` when all are ``None``)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    total: dict[str, float] = {}
    for counts in present:
        for key, n in counts.items():
            total[key] = total.get(key, 0.0) + n
    return total


def tool_metrics(
    per_agent: Sequence[Mapping[str, float] | None], prefix: str = ""
) -> dict[str, float]:
    """Metrics of per-agent :func:`tool_counts`: ``<prefix>tool_calls_mean/agent_<a>``
    (calls per completion), ``tool_result_tokens_mean/agent_<a>``,
    ``tool_seconds/agent_<a>``, ``tool_errors/<kind>`` for every kind of
    :data:`comlrl.core.TOOL_ERROR_KINDS` and ``tool_error_fraction`` (errors per call, 0
    without calls); empty when no agent had tools."""
    out: dict[str, float] = {}
    errors = dict.fromkeys(TOOL_ERROR_KINDS, 0.0)
    calls = 0.0
    for a, c in enumerate(per_agent):
        if c is None:
            continue
        n = max(c["completions"], 1.0)
        out[f"{prefix}tool_calls_mean/agent_{a}"] = c["calls"] / n
        out[f"{prefix}tool_result_tokens_mean/agent_{a}"] = c["result_tokens"] / n
        out[f"{prefix}tool_seconds/agent_{a}"] = c["seconds"]
        calls += c["calls"]
        for kind in TOOL_ERROR_KINDS:
            errors[kind] += c.get(kind, 0.0)
    if out:
        for kind, n in errors.items():
            out[f"{prefix}tool_errors/{kind}"] = n
        out[f"{prefix}tool_error_fraction"] = sum(errors.values()) / calls if calls else 0.0
    return out
