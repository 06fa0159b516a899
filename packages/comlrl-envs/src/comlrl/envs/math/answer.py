"""Final-answer parsing and exact-match comparison for math word problems.

:func:`extract_answer` finds the final answer in free text, trying in order:

1. the last LaTeX ``\\boxed{...}`` (or ``\\fbox{...}``; nested braces allowed);
2. the last GSM8K-style ``#### <answer>`` line;
3. the last "answer is / answer: <answer>" phrase;
4. the last number in the text.

:func:`answer_line` is the strict reader of tasks that ask for a final ``Answer: <n>``
line (``tool_math``, ``debate_math``): it reads only such lines, outside fenced blocks.

:func:`normalize_number` turns the answer text into an exact number: it drops ``$``,
thousands separators (``1,234``), units and words around the number (``18 dollars``,
``5 km/h``), a trailing ``%`` or ``.``, and reads integers, decimals, signed numbers,
simple fractions (``3/4``) and ``\\frac{a}{b}`` / ``\\dfrac{a}{b}``. Values compare as exact
fractions (:class:`fractions.Fraction`), so ``18``, ``18.0``, ``$18.00`` and
``\\boxed{18}`` are the same answer and ``0.1 + 0.2``-style float error cannot occur.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["extract_answer", "answer_line", "normalize_number", "answers_match", "gold_answer"]

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_SLASH_RE = re.compile(rf"({_NUMBER})\s*/\s*({_NUMBER})")
_LAST_RE = re.compile(rf"(?:-\s*\$\s*)?(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?")
_HASHES_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS_RE = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|:|=)\s*:?\s*([^\n]*)", re.IGNORECASE
)


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces)."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start : i - 1]
    return None


def extract_answer(text: str) -> str | None:
    """The final-answer text of a solution, or ``None`` when there is no number in it.

    See the module docstring for the order of the rules. The result is the raw answer
    text (e.g. ``"$1,234"``); compare answers with :func:`answers_match`.
    """
    if not text:
        return None
    boxed = _last_boxed(text)
    if boxed is not None and normalize_number(boxed) is not None:
        return boxed.strip()
    hashes = _HASHES_RE.findall(text)
    for candidate in reversed(hashes):
        if normalize_number(candidate) is not None:
            return candidate.strip()
    phrases = _ANSWER_IS_RE.findall(text)
    for candidate in reversed(phrases):
        if normalize_number(candidate) is not None:
            return candidate.strip()
    numbers = _LAST_RE.findall(text)
    return numbers[-1].strip() if numbers else None


# A fenced block (closed, or open up to the end of the text): code and any ```output
# block the model wrote itself are not its answer.
_FENCE_RE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_ANSWER_LINE_RE = re.compile(
    r"^[ \t>*_#-]*(?:final[ \t]+)?answer[ \t*_]*[:=](.*)$", re.IGNORECASE | re.MULTILINE
)


def answer_line(text: str) -> str | None:
    """The answer of the last ``Answer: <n>`` line of ``text`` that holds a number, or
    ``None``.

    Only lines that start with ``Answer:`` (any case, ``Final Answer:``, Markdown marks
    such as ``**Answer:**`` allowed) count, and only outside fenced blocks (`````): a
    number the text merely mentions, the code of a tool call, or an ``output`` block the
    model wrote itself is never its answer. When the line holds ``=``, the text after the
    last ``=`` is the answer (``Answer: 964 * 59 = 56876`` reads ``56876``).

    Examples:
        >>> answer_line("I think 3.\nAnswer: 56,876")
        '56,876'
    """
    if not text:
        return None
    body = _FENCE_RE.sub("\n", text)
    for found in reversed(_ANSWER_LINE_RE.findall(body)):
        candidate = found.rsplit("=", 1)[-1].strip(" \t*_`")
        if normalize_number(candidate) is not None:
            return candidate
    return None


def _to_fraction(token: str) -> Fraction | None:
    try:
        return Fraction(token.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def normalize_number(answer: str | None) -> Fraction | None:
    """The exact value of an answer text (``None`` when it holds no number).

    ``"$1,234.50"`` -> 2469/2, ``"\\frac{3}{4}"`` -> 3/4, ``"18 apples."`` -> 18,
    ``"-5"`` -> -5, ``"50%"`` -> 50 (the percent sign is dropped, as GSM8K answers are
    written without it). When the text holds several numbers the first one counts,
    except that ``a/b`` and ``\\frac{a}{b}`` are read as one fraction.

    Examples:
        >>> normalize_number("$1,234")
        Fraction(1234, 1)
    """
    if answer is None:
        return None
    text = answer.strip().replace("\\!", "").replace("\\,", "").replace("{,}", ",")
    text = text.replace("\\$", "$").replace("−", "-")
    frac = _FRAC_RE.search(text)
    if frac:
        num, den = _to_fraction(frac.group(1)), _to_fraction(frac.group(2))
        if num is not None and den:
            ratio = num / den
            sign = text[: frac.start()].strip().endswith("-")
            return -ratio if sign else ratio
    slash = _SLASH_RE.search(text)
    first = _NUMBER_RE.search(text)
    if slash and first and slash.start() == first.start():
        num, den = _to_fraction(slash.group(1)), _to_fraction(slash.group(2))
        if num is not None and den:
            return num / den
    if first is None:
        return None
    value = _to_fraction(first.group(0))
    if value is not None and re.match(r"\s*-\s*\$", text) and value > 0:
        value = -value  # "-$5"
    return value


def answers_match(predicted: str | None, gold: str | None) -> bool:
    """``True`` when both answers parse (:func:`normalize_number`) to the same exact value."""
    a, b = normalize_number(predicted), normalize_number(gold)
    return a is not None and b is not None and a == b


def gold_answer(solution: str) -> str:
    """The reference answer of a GSM8K ``answer`` field (the text after ``####``).

    Raises:
        ValueError: when the field has no ``#### <number>`` line.
    """
    found = _HASHES_RE.findall(solution)
    if not found or normalize_number(found[-1]) is None:
        raise ValueError(f"GSM8K answer field has no '#### <number>' line: {solution[-80:]!r}")
    return found[-1].strip()
