"""OpenMLRL's CoopHumanEval (``coop_humaneval_che``): HumanEval-format problems for teams.

CoopHumanEval (OpenMLRL, Apache-2.0 per its dataset card; the rows behind the Hugging Face
dataset ``OpenMLRL/CoopHumanEval``) holds 82 problems in HumanEval's format (``task_id``,
``prompt``, ``test``, ``entry_point``), chosen so that a helper function genuinely helps.
The task is :class:`~comlrl.envs.code.humaneval.CoopHumanEvalTask` with this file: the same
prompts, roles, reward in ``[0, 1]`` and multi-turn feedback.

The file ships no reference solutions; a row that carries ``canonical_solution`` (a body,
as in HumanEval) or ``reference_program`` (a whole program) is used by
:meth:`~comlrl.envs.code.humaneval.CoopHumanEvalTask.reference_jobs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from comlrl.envs.code.humaneval import CoopHumanEvalTask

__all__ = ["CoopHumanEvalCheTask"]


class CoopHumanEvalCheTask(CoopHumanEvalTask):
    """Two-agent CoopHumanEval: agent 1 writes ``aux``, agent 2 the entry point.

    Splits (disjoint, by row index, as for ``coop_humaneval``): the last fifth of the file's
    rows is ``test``, the rest ``train``: for the 82-problem file, train =
    ``CoopHumanEval/0``-``/65`` (66), test = ``CoopHumanEval/66``-``/81`` (16).
    ``train_range``/``test_range`` override.

    Args:
        path: ``CoopHumanEval_che_raw.json`` (a JSON list of rows) or any HumanEval-format
            ``.json``/``.jsonl``/``.jsonl.gz``. Required: the data is not bundled.
        **kwargs: as for :class:`~comlrl.envs.code.humaneval.CoopHumanEvalTask`.

    Raises:
        ValueError: when ``path`` is missing, or for invalid keyword arguments.
    """

    name = "coop_humaneval_che"
    #: Where the examples come from (``comlrl tasks`` prints it).
    data_source = (
        "no copy ships: task.kwargs.path=<CoopHumanEval rows .json (OpenMLRL/CoopHumanEval)>"
    )

    def __init__(self, path: str | Path | None = None, **kwargs: Any) -> None:
        if path is None:
            raise ValueError(
                "coop_humaneval_che needs its data file: pass path= to a local "
                "CoopHumanEval_che_raw.json (the rows of the Hugging Face dataset "
                "OpenMLRL/CoopHumanEval), e.g. task.kwargs.path=... on the CLI"
            )
        super().__init__(path, **kwargs)
