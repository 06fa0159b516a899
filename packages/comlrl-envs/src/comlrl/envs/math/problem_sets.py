"""The train and test problem sets of ``tool_math`` and ``debate_math``.

:func:`load_problems` gives the examples (dataset rows) of one split:

- generated levels (:data:`comlrl.envs.math.arithmetic.LEVELS`): ``num_train`` /
  ``num_eval`` problems drawn from random sources seeded by ``(level, seed, split)``
  (string seeds, so the same on every machine and Python run). The test set is drawn
  first; the train set skips every problem whose question is in the test set, and each
  set skips repeats, so the two are disjoint by construction.
- ``"gsm8k"``: GSM8K rows from a local file or folder (``gsm8k_path``, read by
  :class:`comlrl.envs.math.gsm8k.Gsm8kTask`, whose splits are disjoint), shuffled with
  ``seed`` and cut to ``num_train`` / ``num_eval``.

Every row holds ``id``, ``level``, ``question`` and ``gold`` (the exact answer as text);
generated rows also hold ``parts`` (the two sub-questions), ``part_golds`` (their answers
as text) and ``expressions`` (the parts' Python arithmetic); GSM8K rows hold
``parts = None`` and GSM8K's own fields.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from comlrl.envs.math.arithmetic import LEVELS, make_problem
from comlrl.envs.math.gsm8k import Gsm8kTask

__all__ = ["ALL_LEVELS", "SPLITS", "load_problems", "check_digits"]

#: Every level: the generated ones and ``"gsm8k"``.
ALL_LEVELS = (*LEVELS, "gsm8k")
#: Split names; ``"eval"`` is read as ``"test"``.
SPLITS = ("train", "test", "eval")
_MAX_TRIES_PER_ROW = 200
#: a run of this many draws in a row that are all repeats means the space of distinct
#: problems is (nearly) used up: with a fraction f of it left, such a run has probability
#: (1 - f) ** 2000, under 1e-4 for f >= 0.5 %; the draw stops there with the error instead
#: of trying 200 times the rows asked for (which took 25 s for 10,000 one-digit problems)
_MAX_REPEATS_IN_A_ROW = 2000


def check_digits(digits: int | Sequence[int]) -> tuple[int, int]:
    """``digits`` as a ``(d1, d2)`` pair (an int ``d`` is ``(d, d)``).

    Raises:
        ValueError: for anything but an int or two ints in 1..12.
    """
    pair = (digits, digits) if isinstance(digits, int) else tuple(digits)
    if len(pair) != 2 or not all(isinstance(d, int) and 1 <= d <= 12 for d in pair):
        raise ValueError(f"digits must be an int or two ints in 1..12, got {digits!r}")
    return (int(pair[0]), int(pair[1]))


def _generated(
    level: str,
    split: str,
    n: int,
    seed: int,
    digits: tuple[int, int],
    ops: int,
    exclude: set[str],
) -> list[dict[str, Any]]:
    rng = random.Random(f"comlrl.tool_math/{level}/{seed}/{split}")
    rows: list[dict[str, Any]] = []
    seen = set(exclude)
    tries = repeats = 0
    while len(rows) < n:
        tries += 1
        if tries > _MAX_TRIES_PER_ROW * max(n, 1) or repeats >= _MAX_REPEATS_IN_A_ROW:
            raise ValueError(
                f"could not draw {n} distinct {level!r} problems for split {split!r} "
                f"(digits={digits}, ops={ops}): {len(rows)} drawn, then {repeats} draws in "
                "a row were all repeats; ask for fewer or use larger digits/ops"
            )
        p = make_problem(level, rng, digits=digits, ops=ops)
        if p.question in seen:
            repeats += 1
            continue
        repeats = 0
        seen.add(p.question)
        rows.append(
            {
                "id": f"{level}/{split}/{len(rows)}",
                "level": level,
                "question": p.question,
                "gold": str(p.answer),
                "parts": list(p.parts),
                "part_golds": [str(v) for v in p.part_answers],
                "expressions": list(p.expressions),
            }
        )
    return rows


def load_problems(
    level: str,
    split: str,
    *,
    seed: int = 0,
    num_train: int = 1000,
    num_eval: int = 200,
    digits: int | Sequence[int] = (3, 2),
    ops: int = 3,
    gsm8k_path: str | Path | None = None,
) -> list[dict[str, Any]]:
    """The examples of ``split`` (``"train"``, ``"test"`` or its alias ``"eval"``).

    Args:
        level: one of :data:`ALL_LEVELS`.
        split: which split.
        seed: seeds the generators (and the GSM8K shuffle); train and test differ.
        num_train, num_eval: problems in the train / test split (GSM8K: at most these).
        digits: digits per factor for ``"mul"`` (see :func:`check_digits`).
        ops: operators per part for ``"expr"``.
        gsm8k_path: GSM8K file or folder for ``"gsm8k"`` (``None``: the Hub, see
            :class:`~comlrl.envs.math.gsm8k.Gsm8kTask`).

    Raises:
        ValueError: an unknown level or split, a negative size, bad ``digits``/``ops``,
            or too few distinct problems.
        FileNotFoundError: ``gsm8k_path`` does not exist.
    """
    if level not in ALL_LEVELS:
        raise ValueError(f"unknown level {level!r}; use one of {ALL_LEVELS}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    if num_train < 0 or num_eval < 0:
        raise ValueError(f"num_train and num_eval must be >= 0, got {num_train}, {num_eval}")
    split = "test" if split == "eval" else split
    n = num_train if split == "train" else num_eval
    if level == "gsm8k":
        rows = list(Gsm8kTask(gsm8k_path).load(split))
        random.Random(f"comlrl.tool_math/gsm8k/{seed}/{split}").shuffle(rows)
        return [
            {**row, "id": f"gsm8k/{split}/{i}", "level": "gsm8k", "parts": None}
            for i, row in enumerate(rows[:n])
        ]
    pair = check_digits(digits)
    test = _generated(level, "test", num_eval, seed, pair, ops, set())
    if split == "test":
        return test
    return _generated(level, "train", n, seed, pair, ops, {r["question"] for r in test})
