"""Level-gated rewards for two-agent writing (TL;DR summaries, arXiv abstract expansion).

The structure and thresholds follow CoMLRL's writing experiments (OpenMLRL,
``LLM_Collab_Writing``: ``rewards/tldr_rewards.py`` ``tldr_combined_reward`` and
``rewards/arxiv_rewards.py`` ``arxiv_combined_reward``; Liu et al. 2025, "LLM
Collaboration With Multi-Agent Reinforcement Learning"). Four levels, each reached only
when the previous one's range was met; the sum (at most 3) is divided by 3, so the reward
is in ``[0, 1]``:

1. **structure** (0.5): both parts have ``word_range`` whitespace-separated words.
2. **length ratio** (up to 1.0): ``r = len(part2) / len(part1)`` in characters; 1.0 in
   the optimal band, linear ramps to 0 at the edges of the acceptable band; outside it the
   reward stops here.
3. **unique-word ratio** (up to 0.5): ``u = |words(part2)| / |words(part1)|`` (distinct
   lower-cased ``\\w+`` words); 0.5 in the optimal band, linear ramps over the acceptable
   band; outside it the reward stops here.
4. **style** (up to 1.0) = 0.4 x transitions + 0.6 x overlap: *transitions* is 0 without
   a transition word, else ``min(1, 0.4 + 0.05 x (categories - 1))`` for the number of
   transition-word categories used (in part 2 for TL;DR, in both parts for arXiv);
   *overlap* is the Jaccard similarity of the parts' content words (stopwords removed),
   capped at ``jaccard_cap`` and divided by it.

Our deliberate differences from that code: transition words and phrases are matched on
word boundaries (a plain substring test counts "so" inside "also"); the word lists
(:data:`STOPWORDS`, :data:`TRANSITIONS`) are our own, shorter ones with the same
categories' intent; and two empty parts have overlap 0 (not 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "WritingRewardSpec",
    "TLDR_SPEC",
    "ARXIV_SPEC",
    "writing_reward",
    "band_score",
    "transition_categories",
    "content_jaccard",
    "STOPWORDS",
    "TRANSITIONS",
]

STOPWORDS = frozenset(
    """a an the and or but nor so yet for of in on at to from by with as into onto about
    over under than then that this these those there here it its is are was were be been
    being am do does did done have has had having i me my we us our you your he him his she
    her they them their what which who whom whose when where why how all any both each few
    more most other some such no not only own same too very can could will would shall
    should may might must just also if because while until again further once up down out
    off""".split()
)
"""Stopwords removed before the content-word overlap (our own list)."""

TRANSITIONS: dict[str, tuple[str, ...]] = {
    "addition": ("furthermore", "moreover", "additionally", "in addition", "besides", "also"),
    "example": ("for example", "for instance", "such as", "in particular", "namely"),
    "clarification": ("in other words", "that is", "indeed", "in fact", "specifically"),
    "cause": ("therefore", "thus", "consequently", "as a result", "hence", "because"),
    "contrast": (
        "however",
        "nevertheless",
        "on the other hand",
        "in contrast",
        "whereas",
        "although",
        "instead",
        "yet",
    ),
    "sequence": ("first", "second", "next", "then", "finally", "subsequently", "meanwhile"),
    "emphasis": ("notably", "importantly", "clearly", "significantly", "certainly"),
    "summary": ("in summary", "in conclusion", "overall", "in short", "to sum up"),
    "comparison": ("similarly", "likewise", "in the same way", "compared to"),
    "condition": ("if", "unless", "provided that", "as long as"),
    "time": ("after", "before", "during", "since", "eventually", "recently", "currently"),
}
"""Transition words by category (our own list; phrases match on word boundaries)."""

_PATTERNS = {
    cat: re.compile(r"\b(?:" + "|".join(re.escape(w) for w in words) + r")\b")
    for cat, words in TRANSITIONS.items()
}
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class WritingRewardSpec:
    """Thresholds of :func:`writing_reward` (bands are inclusive ``(low, high)``).

    Attributes:
        word_range: words each part must have (level 1).
        ratio_optimal, ratio_acceptable: bands of ``len(part2) / len(part1)`` (level 2).
        unique_optimal, unique_acceptable: bands of the unique-word ratio (level 3); an
            upper bound of ``inf`` means "at least".
        transitions_in_both: count transition words in both parts (else part 2 only).
        jaccard_cap: content-word Jaccard similarity that earns the full overlap score.
    """

    word_range: tuple[int, int]
    ratio_optimal: tuple[float, float]
    ratio_acceptable: tuple[float, float]
    unique_optimal: tuple[float, float]
    unique_acceptable: tuple[float, float]
    transitions_in_both: bool
    jaccard_cap: float


TLDR_SPEC = WritingRewardSpec(
    word_range=(8, 256),
    ratio_optimal=(1.6, 3.2),
    ratio_acceptable=(1.1, 5.0),
    unique_optimal=(2.0, float("inf")),
    unique_acceptable=(1.3, float("inf")),
    transitions_in_both=False,
    jaccard_cap=0.03,
)
"""TL;DR: a concise summary (part 1) and a longer, richer one (part 2)."""

ARXIV_SPEC = WritingRewardSpec(
    word_range=(128, 256),
    ratio_optimal=(1.3, 1.6),
    ratio_acceptable=(0.8, 2.0),
    unique_optimal=(0.7, 1.3),
    unique_acceptable=(0.5, 1.7),
    transitions_in_both=True,
    jaccard_cap=0.23,
)
"""arXiv: background/motivation (part 1) and method/implications (part 2) of similar size."""


def band_score(x: float, optimal: tuple[float, float], acceptable: tuple[float, float]) -> float:
    """1 inside ``optimal``, linear down to 0 at the edges of ``acceptable``, 0 outside.

    Both bands are inclusive; ``acceptable`` must contain ``optimal``.
    """
    (o_lo, o_hi), (a_lo, a_hi) = optimal, acceptable
    if o_lo <= x <= o_hi:
        return 1.0
    if a_lo <= x < o_lo:
        return (x - a_lo) / (o_lo - a_lo)
    if o_hi < x <= a_hi:
        return 1.0 - (x - o_hi) / (a_hi - o_hi)
    return 0.0


def _in(x: float, band: tuple[float, float]) -> bool:
    return band[0] <= x <= band[1]


def transition_categories(text: str) -> set[str]:
    """Categories of :data:`TRANSITIONS` with at least one word or phrase in ``text``."""
    lower = text.lower()
    return {cat for cat, pattern in _PATTERNS.items() if pattern.search(lower)}


def content_jaccard(text1: str, text2: str) -> float:
    """Jaccard similarity of the two texts' distinct content words (0 when both are empty)."""
    a = {w for w in _WORD.findall(text1.lower()) if w not in STOPWORDS}
    b = {w for w in _WORD.findall(text2.lower()) if w not in STOPWORDS}
    union = a | b
    return len(a & b) / len(union) if union else 0.0


def writing_reward(part1: str, part2: str, spec: WritingRewardSpec) -> tuple[float, dict]:
    """The level-gated writing reward of one joint action (see the module docstring).

    Args:
        part1: agent 1's completion.
        part2: agent 2's completion.
        spec: thresholds (:data:`TLDR_SPEC` or :data:`ARXIV_SPEC`).

    Returns:
        ``(reward, info)``: reward in ``[0, 1]`` (level sum / 3); info has ``words``,
        ``length_ratio``, ``unique_ratio``, ``transition_categories``, ``jaccard``,
        ``level_reached`` (1-4, 0 when level 1 failed) and ``reward_parts`` (unscaled).
    """
    words = (len(part1.split()), len(part2.split()))
    parts = {"structure": 0.0, "length_ratio": 0.0, "unique_ratio": 0.0, "style": 0.0}
    info: dict = {"words": words, "level_reached": 0, "reward_parts": parts}

    def done() -> tuple[float, dict]:
        total = sum(parts.values()) / 3.0
        return round(min(1.0, max(0.0, total)), 6), info

    if not all(_in(w, spec.word_range) for w in words):
        return done()
    parts["structure"] = 0.5
    info["level_reached"] = 1
    ratio = len(part2) / len(part1) if part1 else 0.0
    info["length_ratio"] = ratio
    if not part1 or not _in(ratio, spec.ratio_acceptable):
        return done()
    parts["length_ratio"] = band_score(ratio, spec.ratio_optimal, spec.ratio_acceptable)
    info["level_reached"] = 2
    unique1 = len(set(_WORD.findall(part1.lower())))
    unique2 = len(set(_WORD.findall(part2.lower())))
    unique = unique2 / unique1 if unique1 else 0.0
    info["unique_ratio"] = unique
    if not unique1 or not _in(unique, spec.unique_acceptable):
        return done()
    parts["unique_ratio"] = 0.5 * band_score(unique, spec.unique_optimal, spec.unique_acceptable)
    info["level_reached"] = 3
    cats = transition_categories(part1 + "\n" + part2 if spec.transitions_in_both else part2)
    transitions = min(1.0, 0.4 + 0.05 * (len(cats) - 1)) if cats else 0.0
    jaccard = content_jaccard(part1, part2)
    overlap = min(jaccard, spec.jaccard_cap) / spec.jaccard_cap
    parts["style"] = 0.4 * transitions + 0.6 * overlap
    info.update(transition_categories=sorted(cats), jaccard=jaccard, level_reached=4)
    return done()
