"""What the sandboxed code suites (HumanEval, MBPP, ClassEval) share.

Reading a row file, the default ``train``/``test`` slices, the checks of the arguments
every suite takes, the compile check that keeps broken programs out of the sandbox, the
feedback record of one turn, and the state every suite keeps (:class:`SandboxedSuite`). The suites themselves
(:mod:`comlrl.envs.code.humaneval`, :mod:`comlrl.envs.code.classeval`) hold only what
differs between them.
"""

from __future__ import annotations

import gzip
import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.core import Feedback, JointAction, Task
from comlrl.envs.code.feedback import check_feedback_mode
from comlrl.envs.sandbox import CheckJob, SandboxLimits, SandboxPool, Verdict

__all__ = [
    "SandboxedSuite",
    "check_suite_args",
    "clipped_reward",
    "compile_error",
    "default_split_ranges",
    "read_rows",
    "turn_feedback",
]


def read_rows(
    file: Path, required: Sequence[str], suite: str, endings: Sequence[str]
) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl`` (optionally ``.jsonl.gz``) or ``.json`` file, checked for fields.

    A ``.json`` file holds a list of rows, or a mapping whose values are rows.

    Args:
        file: an existing file.
        required: the fields every row must have.
        suite: the suite's name for messages (``"HumanEval"``).
        endings: the file endings this suite accepts, in the order the message lists
            them (a subset of ``.jsonl``, ``.jsonl.gz``, ``.json``).

    Raises:
        ValueError: for an ending not in ``endings`` or a row missing a required field.
    """
    name = file.name.lower()
    ending = next((e for e in (".jsonl.gz", ".jsonl", ".json") if name.endswith(e)), None)
    if ending not in endings:
        listed = ", ".join(endings[:-1]) + " or " + endings[-1] if len(endings) > 1 else endings[0]
        raise ValueError(f"unsupported {suite} file {file}: use {listed}")
    if ending == ".json":
        data = json.loads(file.read_text(encoding="utf-8"))
        rows = list(data.values()) if isinstance(data, dict) else list(data)
    else:
        opener = gzip.open if ending == ".jsonl.gz" else open
        with opener(file, "rt", encoding="utf-8") as fh:  # type: ignore[operator]
            rows = [json.loads(line) for line in fh if line.strip()]
    for i, row in enumerate(rows):
        missing = [k for k in required if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError(f"{file}: row {i} lacks field(s) {missing}; need {list(required)}")
    return rows


def default_split_ranges(num_rows: int) -> dict[str, tuple[int, int]]:
    """The default disjoint ``train``/``test`` row slices of a file with ``num_rows`` rows.

    The last fifth of the rows (``num_rows // 5``, at least one row when there are two or
    more) is ``test``, the rest ``train``: HumanEval's 164 problems give train = rows 0-131
    (``HumanEval/0``-``HumanEval/131``) and test = rows 132-163; CoopHumanEval's 82 give
    66 / 16.
    """
    test_size = max(1, num_rows // 5) if num_rows > 1 else 0
    cut = num_rows - test_size
    return {"train": (0, cut), "test": (cut, num_rows)}


def check_suite_args(
    limit: int | None,
    max_turns: int,
    train_range: tuple[int, int] | None,
    test_range: tuple[int, int] | None,
) -> None:
    """Check the arguments every code suite takes.

    Raises:
        ValueError: for ``max_turns`` < 1, a negative ``limit``, or a range that is not
            ``(start, stop)`` with ``start <= stop``; the message names the bad value.
    """
    if int(max_turns) < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    for label, rng in (("train_range", train_range), ("test_range", test_range)):
        if rng is not None and (len(rng) != 2 or rng[0] > rng[1]):
            raise ValueError(f"{label} must be (start, stop) with start <= stop, got {rng}")


def compile_error(program: str) -> str | None:
    """Why ``program`` would fail the sandbox's own ``compile()``, or ``None``.

    Compiling is not running: it is safe in the trainer and catches everything the
    sandbox would report as a syntax error before running anything (including the
    compile-time errors ``ast.parse`` lets through: ``return`` outside a function,
    ``nonlocal`` at module level, ...), so those programs skip the sandbox with the
    same verdict. ``dont_inherit`` keeps this module's ``__future__`` flags out, as in
    the sandbox; compile warnings are not shown (the sandbox would show them in the
    program's stderr, which the reward does not use).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(program, "<program>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as exc:
        return str(exc)
    return None


def clipped_reward(parts: Mapping[str, float]) -> float:
    """The reward of one joint action: the sum of its ``parts``, clipped to ``[0, 1]`` and
    rounded to 6 decimals."""
    return round(min(1.0, max(0.0, sum(parts.values()))), 6)


def turn_feedback(
    texts: Sequence[str], joint_action: JointAction, info: Mapping[str, Any], turn: int
) -> Feedback:
    """The :class:`~comlrl.core.Feedback` of one scored joint action.

    ``done`` when every test passed (``info["status"] == "passed"``); its ``info`` holds
    ``status``, ``passed``, ``total``, ``turn`` and ``completions`` (the joint action's
    texts, which the next chat prompts show as the agents' own earlier answers).
    """
    return Feedback(
        tuple(texts),
        done=info.get("status") == "passed",
        info={
            "status": info.get("status"),
            "passed": info.get("passed"),
            "total": info.get("total"),
            "turn": turn,
            "completions": tuple(joint_action.completions),
        },
    )


class SandboxedSuite(Task):
    """A code suite's common state: its data file, splits, sandbox limits and pool.

    Checks and keeps the arguments every code suite takes (see
    :func:`check_suite_args`); the pool of ``max_workers`` sandboxes starts on first use
    (:meth:`_get_pool`) and shuts down in :meth:`close`.

    ``feedback``: ``"tester"`` (default) or ``"verbatim"`` (warns), see
    :mod:`comlrl.envs.code.feedback`.

    Raises:
        ValueError: for an invalid ``limit``, ``max_turns``, range, ``executor`` or
            ``feedback``.
    """

    def __init__(
        self,
        path: str | Path | None,
        *,
        limit: int | None,
        timeout_s: float,
        assert_timeout_s: float | None,
        max_workers: int | None,
        memory_mb: int | None,
        train_range: tuple[int, int] | None,
        test_range: tuple[int, int] | None,
        executor: str,
        max_turns: int,
        feedback: str = "tester",
    ) -> None:
        check_suite_args(limit, max_turns, train_range, test_range)
        self.feedback_mode = check_feedback_mode(feedback, type(self).__name__)
        self.path = path
        self.limit = limit
        self.max_turns = int(max_turns)
        self.limits = SandboxLimits(
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            executor=executor,  # type: ignore[arg-type]  # validated by SandboxLimits
        )
        self.assert_timeout_s = assert_timeout_s
        self.max_workers = max_workers
        self.ranges = {"train": train_range, "test": test_range}
        self._rows: list[dict[str, Any]] | None = None
        self._pool: SandboxPool | None = None

    def _run_jobs(
        self, verdicts: Sequence[Verdict | None], jobs: Sequence[CheckJob], index: Sequence[int]
    ) -> list[Verdict]:
        """Run ``jobs`` in the pool (all at once) and put each job's verdict at its joint
        action's position ``index[j]`` of ``verdicts`` (``None`` where a job runs).

        Returns:
            one verdict per joint action.
        """
        out = list(verdicts)
        if jobs:
            ran = self._get_pool().check_many(
                list(jobs), self.limits, assert_timeout_s=self.assert_timeout_s
            )
            for i, verdict in zip(index, ran, strict=True):
                out[i] = verdict
        assert all(v is not None for v in out)  # every joint action got a verdict
        return [v for v in out if v is not None]

    def _get_pool(self) -> SandboxPool:
        if self._pool is None:
            self._pool = SandboxPool(self.max_workers)
        return self._pool

    def close(self) -> None:
        """Shut the sandbox pool down. Safe to call twice; the task stays usable."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
