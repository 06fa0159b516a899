"""Show :class:`~comlrl.algos.training.run.diagnostics.TrainingWarning` on the command line as one plain line."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["show_training_warnings_plainly"]


def show_training_warnings_plainly() -> None:
    """Print training warnings as ``comlrl: warning: ...`` (no file and line of the source);
    other warnings keep Python's format. Meant for the ``comlrl`` process only."""
    from comlrl.algos.training.run.diagnostics import TrainingWarning

    default = warnings.formatwarning

    def formatwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        line: str | None = None,
    ) -> str:
        if issubclass(category, TrainingWarning):
            return f"comlrl: warning: {message}\n"
        return default(message, category, filename, lineno, line)

    formatter: Any = formatwarning
    warnings.formatwarning = formatter
