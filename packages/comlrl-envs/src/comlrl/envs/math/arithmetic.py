"""Arithmetic problems with exact integer answers, generated from a random source.

Every problem is a *pair of sub-problems* whose answers add up to the whole problem's
answer, so that two agents can split it (``tool_math``) or one agent can solve it all
(``tool_math`` with one agent, ``debate_math``). Levels (:data:`LEVELS`):

- ``"mul"``: multi-digit multiplication; parts ``a * b`` and ``c * d``, whole
  ``a * b + c * d`` (``digits`` digits per factor, or a ``(d1, d2)`` pair).
- ``"expr"``: multi-step expressions over ``+ - *`` with parentheses; parts ``E1`` and
  ``E2`` (``ops`` operators each, operands 2..50, parentheses in each when ``ops >= 2``),
  whole ``(E1) + (E2)``. Expressions are
  written in Python syntax, so ``eval`` reads them as the generator computed them.
- ``"word"``: templated word problems; each part is a person with boxes of items
  (``a * b``, ``a * b + c`` or ``a * b - c``), the whole asks how many items the two
  people have together.

Answers are computed with Python integers alongside the text, never by evaluating it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["LEVELS", "Problem", "make_problem", "make_mul", "make_expr", "make_word"]

#: The generated levels (``tool_math`` and ``debate_math`` add ``"gsm8k"``, read from a file).
LEVELS = ("mul", "expr", "word")


@dataclass(frozen=True)
class Problem:
    """One generated problem: a whole question and its split into two parts.

    Attributes:
        level: one of :data:`LEVELS`.
        question: the whole problem as one question.
        parts: the two sub-problems, each a self-contained question.
        part_answers: the exact answers of the two parts.
        answer: the whole problem's exact answer, ``sum(part_answers)``.
        expressions: the Python expressions of the two parts (``a * b``; for ``"word"``
            the arithmetic the story describes), for checking the answers with ``eval``.
    """

    level: str
    question: str
    parts: tuple[str, str]
    part_answers: tuple[int, int]
    answer: int
    expressions: tuple[str, str]


def _factor(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1) if digits > 1 else rng.randint(2, 9)


def make_mul(rng: random.Random, digits: tuple[int, int] = (3, 2)) -> Problem:
    """A ``"mul"`` problem: ``a * b + c * d`` with ``digits[0]``-digit ``a, c`` and
    ``digits[1]``-digit ``b, d`` (1-digit factors are 2..9)."""
    exprs, answers = [], []
    for _ in range(2):
        a, b = _factor(rng, digits[0]), _factor(rng, digits[1])
        exprs.append(f"{a} * {b}")
        answers.append(a * b)
    return Problem(
        "mul",
        f"Compute {exprs[0]} + {exprs[1]}.",
        (f"Compute {exprs[0]}.", f"Compute {exprs[1]}."),
        (answers[0], answers[1]),
        answers[0] + answers[1],
        (exprs[0], exprs[1]),
    )


_PREC = {"+": 1, "-": 1, "*": 2}


def _expr(rng: random.Random, ops: int) -> tuple[str, int, str]:
    """``(text, value, top operator or "")`` of a random expression with ``ops`` operators."""
    if ops == 0:
        n = rng.randint(2, 50)
        return str(n), n, ""
    left_ops = rng.randint(0, ops - 1)
    op = rng.choice("+-*")
    lt, lv, lop = _expr(rng, left_ops)
    rt, rv, rop = _expr(rng, ops - 1 - left_ops)
    if lop and _PREC[lop] < _PREC[op]:
        lt = f"({lt})"
    if rop and (_PREC[rop] < _PREC[op] or (_PREC[rop] == _PREC[op] and op == "-")):
        rt = f"({rt})"
    value = lv + rv if op == "+" else lv - rv if op == "-" else lv * rv
    return f"{lt} {op} {rt}", value, op


def make_expr(rng: random.Random, ops: int = 3) -> Problem:
    """An ``"expr"`` problem: parts ``E1``, ``E2`` (``ops`` operators each; with
    ``ops >= 2`` at least one pair of parentheses each), whole ``(E1) + (E2)``."""
    exprs, answers = [], []
    for _ in range(2):
        while True:
            text, value, _ = _expr(rng, ops)
            if "(" in text or ops < 2:
                break
        exprs.append(text)
        answers.append(value)
    return Problem(
        "expr",
        f"Compute ({exprs[0]}) + ({exprs[1]}).",
        (f"Compute {exprs[0]}.", f"Compute {exprs[1]}."),
        (answers[0], answers[1]),
        answers[0] + answers[1],
        (exprs[0], exprs[1]),
    )


_NAMES = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal")
_ITEMS = (
    ("pencils", "boxes"),
    ("apples", "crates"),
    ("eggs", "cartons"),
    ("books", "shelves"),
    ("marbles", "bags"),
    ("stickers", "sheets"),
    ("cookies", "trays"),
    ("bottles", "packs"),
)


def _word_part(rng: random.Random, name: str, items: str, boxes: str) -> tuple[str, str, int]:
    """``(sentence, python expression, value)`` of one person's count."""
    a, b = rng.randint(2, 30), rng.randint(3, 60)
    kind = rng.randrange(3)
    base = f"{name} has {a} {boxes} with {b} {items} in each"
    if kind == 0:
        return f"{base}.", f"{a} * {b}", a * b
    c = rng.randint(1, min(99, a * b - 1))
    if kind == 1:
        return f"{base} and buys {c} more {items}.", f"{a} * {b} + {c}", a * b + c
    return f"{base} and gives away {c} {items}.", f"{a} * {b} - {c}", a * b - c


def make_word(rng: random.Random) -> Problem:
    """A ``"word"`` problem: two people's counts of items (each ``a * b``, ``a * b + c``
    or ``a * b - c``); the whole asks for their total."""
    n0, n1 = rng.sample(_NAMES, 2)
    items, boxes = rng.choice(_ITEMS)
    s0, e0, v0 = _word_part(rng, n0, items, boxes)
    s1, e1, v1 = _word_part(rng, n1, items, boxes)
    ask = f"How many {items} does {{name}} have now?"
    return Problem(
        "word",
        f"{s0} {s1} How many {items} do {n0} and {n1} have together now?",
        (f"{s0} {ask.format(name=n0)}", f"{s1} {ask.format(name=n1)}"),
        (v0, v1),
        v0 + v1,
        (e0, e1),
    )


def make_problem(
    level: str, rng: random.Random, *, digits: tuple[int, int] = (3, 2), ops: int = 3
) -> Problem:
    """One problem of ``level`` drawn from ``rng``.

    Raises:
        ValueError: for a level not in :data:`LEVELS`, ``digits`` outside 1..12 or
            ``ops`` outside 1..8.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; generated levels are {LEVELS}")
    if len(digits) != 2 or not all(1 <= d <= 12 for d in digits):
        raise ValueError(f"digits must be two ints in 1..12, got {digits!r}")
    if not 1 <= ops <= 8:
        raise ValueError(f"ops must be in 1..8, got {ops!r}")
    if level == "mul":
        return make_mul(rng, digits)
    if level == "expr":
        return make_expr(rng, ops)
    return make_word(rng)
