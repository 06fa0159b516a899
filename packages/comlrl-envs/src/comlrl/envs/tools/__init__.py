"""Tools an agent may call inside a turn (:mod:`comlrl.core.tools`): the sandboxed Python tool."""

from __future__ import annotations

from comlrl.envs.tools.python import (
    DEFAULT_MAX_OUTPUT_CHARS,
    PYTHON_TOOL_NAME,
    format_result,
    python_tool,
)

__all__ = ["DEFAULT_MAX_OUTPUT_CHARS", "PYTHON_TOOL_NAME", "format_result", "python_tool"]
