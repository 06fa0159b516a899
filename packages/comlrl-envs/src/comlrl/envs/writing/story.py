"""Cooperative story writing for tiny story models (``coop_story``), with built-in seeds.

Made for the 260K-parameter ``stories260k`` Llama (TinyStories; context 512 tokens, vocab
512): the prompts are one or two short TinyStories-style sentences, and every reward part
is something such a model already does sometimes, so a few dozen training steps can move it.

Each example is a *seed*: a name (with its pronoun), a place and an object, drawn from
built-in lists (:data:`NAMES`, :data:`PLACES`, :data:`OBJECTS`); :func:`story_seeds` makes
the fixed list of 320 seeds (a seeded shuffle of all combinations), so no data file is
needed.

- agent 1 writes the beginning: its prompt is ``"Once upon a time, a little girl named
  Lily went to the park. She had a red ball."``-style;
- agent 2 writes the ending: its prompt is ``"Lily played with the red ball at the park.
  In the end,"``-style.

Reward of one joint action, in ``[0, 1]`` (:func:`story_reward`): a weighted sum of six
parts, each scored in ``[0, 1]``; the weights (:data:`DEFAULT_WEIGHTS`, overridable with
``weights=``) add up to 1:

======  ==================  ==========================================================
weight  part                score
======  ==================  ==========================================================
0.30    ``keywords1``       fraction of the seed's keywords (the name, the object's noun,
                            the place) in part 1
0.30    ``keywords2``       the same for part 2
0.05    ``length1``         part 1's length in words: 1 inside ``[min_words, max_words]``,
                            linear to 0 at ``min_words / 4`` and ``2 * max_words``
0.05    ``length2``         the same for part 2
0.20    ``shared_vocabulary``  Jaccard similarity ``j`` of the parts' content words: 1 for
                            ``0.1 <= j <= 0.5``, linear to 0 at ``j = 0`` and ``j = 0.8``
                            (the parts should tell one story, not repeat each other)
0.10    ``no_repetition``   distinct word trigrams / all word trigrams of part 1 + part 2
                            (0 with fewer than 3 words)
======  ==================  ==========================================================

Why these weights: the pretrained stories260k model already writes stories of the right
length without loops from its first step (length and no-repetition parts near 1), so
those parts carry little weight; it names about a third of the given keywords and rarely
shares content words between the two parts, which training can change, so those carry
most of the weight and the reward visibly rises (measured numbers in the README).

Words are lower-cased ``[a-z']+`` runs. Splits (disjoint, by seed): ``test`` is every 8th
seed (40), ``train`` the other 280.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from comlrl.core import ChatPrompt, Feedback, Prompt, RewardBatch, Task
from comlrl.envs.writing.rewards import STOPWORDS, band_score

__all__ = [
    "CoopStoryTask",
    "story_seeds",
    "story_reward",
    "check_weights",
    "DEFAULT_WEIGHTS",
    "NAMES",
    "PLACES",
    "OBJECTS",
]

NAMES: tuple[tuple[str, str, str], ...] = (
    ("Lily", "girl", "She"),
    ("Tom", "boy", "He"),
    ("Ben", "boy", "He"),
    ("Mia", "girl", "She"),
    ("Sam", "boy", "He"),
    ("Anna", "girl", "She"),
    ("Max", "boy", "He"),
    ("Lucy", "girl", "She"),
    ("Tim", "boy", "He"),
    ("Sue", "girl", "She"),
    ("Jack", "boy", "He"),
    ("Emma", "girl", "She"),
    ("Bob", "boy", "He"),
    ("Amy", "girl", "She"),
    ("Joe", "boy", "He"),
    ("Sara", "girl", "She"),
)
"""``(name, kind, pronoun)`` of the stories' heroes."""

PLACES: tuple[str, ...] = (
    "park",
    "garden",
    "forest",
    "beach",
    "farm",
    "house",
    "school",
    "lake",
    "hill",
    "zoo",
)
"""Where the story happens."""

OBJECTS: tuple[str, ...] = (
    "red ball",
    "big kite",
    "toy car",
    "teddy bear",
    "blue hat",
    "little boat",
    "doll",
    "book",
    "cake",
    "flower",
    "balloon",
    "shiny box",
)
"""What the hero has; the last word is the keyword."""

NUM_SEEDS = 320

DEFAULT_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {
        "keywords1": 0.30,
        "keywords2": 0.30,
        "length1": 0.05,
        "length2": 0.05,
        "shared_vocabulary": 0.20,
        "no_repetition": 0.10,
    }
)
"""Weight of each reward part (they add up to 1); see the module docstring."""

_WORD = re.compile(r"[a-z']+")


def story_seeds() -> list[dict[str, Any]]:
    """The 320 built-in seeds, in a fixed order (a ``random.Random(0)`` shuffle of all
    name x place x object combinations, first 320), each ``{"task_id", "seed_id", "name",
    "kind", "pronoun", "place", "object", "keywords"}`` (``task_id`` is
    ``"coop_story/<seed_id>"``)."""
    combos = list(itertools.product(NAMES, PLACES, OBJECTS))
    random.Random(0).shuffle(combos)
    seeds = []
    for i, ((name, kind, pronoun), place, obj) in enumerate(combos[:NUM_SEEDS]):
        seeds.append(
            {
                "task_id": f"coop_story/{i}",
                "seed_id": i,
                "name": name,
                "kind": kind,
                "pronoun": pronoun,
                "place": place,
                "object": obj,
                "keywords": [name.lower(), obj.split()[-1], place],
            }
        )
    return seeds


def check_weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    """:data:`DEFAULT_WEIGHTS` updated with ``weights``, checked.

    ``weights`` may name some of the parts; the others keep their default weight. The
    result must be non-negative and add up to 1 (so the reward stays in ``[0, 1]``).

    Raises:
        ValueError: an unknown part name, a negative or non-numeric weight, or weights
            that do not add up to 1 (within 1e-6).
    """
    out = dict(DEFAULT_WEIGHTS)
    for name, value in (weights or {}).items():
        if name not in out:
            raise ValueError(
                f"unknown coop_story reward part {name!r}; the parts are {sorted(out)}"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"weight of {name!r} must be a number >= 0, got {value!r}")
        out[name] = float(value)
    total = sum(out.values())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(
            f"coop_story weights must add up to 1, got {total:g} for {out}; "
            "lower or raise some of them."
        )
    return out


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def story_reward(
    part1: str,
    part2: str,
    keywords: Sequence[str],
    *,
    min_words: int = 10,
    max_words: int = 40,
    weights: Mapping[str, float] | None = None,
) -> tuple[float, dict[str, Any]]:
    """The ``coop_story`` reward of one joint action (parts in the module docstring).

    Args:
        part1: agent 1's completion (the beginning).
        part2: agent 2's completion (the ending).
        keywords: the seed's lower-case keywords.
        min_words, max_words: the target length band of each part, in words.
        weights: weight per reward part (default :data:`DEFAULT_WEIGHTS`; see
            :func:`check_weights`).

    Returns:
        ``(reward, info)``: reward in ``[0, 1]``; info has ``words`` (per part),
        ``keywords_found`` (per part), ``jaccard``, ``distinct_trigrams``,
        ``reward_parts`` (each part's weighted contribution) and ``scores`` (each part's
        unweighted score in ``[0, 1]``).

    Raises:
        ValueError: bad ``weights`` (see :func:`check_weights`).
    """
    weight = check_weights(weights) if weights is not None else DEFAULT_WEIGHTS
    words = [_words(part1), _words(part2)]
    found = [[k for k in keywords if k in set(w)] for w in words]
    n_kw = max(1, len(keywords))
    scores: dict[str, float] = {}
    for a in range(2):
        scores[f"keywords{a + 1}"] = len(found[a]) / n_kw
    for a in range(2):
        score = band_score(
            float(len(words[a])), (min_words, max_words), (min_words / 4, 2 * max_words)
        )
        scores[f"length{a + 1}"] = score if words[a] else 0.0
    content = [{w for w in ws if w not in STOPWORDS} for ws in words]
    union = content[0] | content[1]
    jaccard = len(content[0] & content[1]) / len(union) if union else 0.0
    scores["shared_vocabulary"] = (
        band_score(jaccard, (0.1, 0.5), (0.0, 0.8)) if content[0] and content[1] else 0.0
    )
    joined = words[0] + words[1]
    trigrams = list(zip(joined, joined[1:], joined[2:]))
    distinct = len(set(trigrams)) / len(trigrams) if trigrams else 0.0
    scores["no_repetition"] = distinct
    parts = {name: weight[name] * value for name, value in scores.items()}
    reward = round(min(1.0, max(0.0, sum(parts.values()))), 6)
    info = {
        "words": [len(w) for w in words],
        "keywords_found": found,
        "jaccard": jaccard,
        "distinct_trigrams": distinct,
        "reward_parts": parts,
        "scores": scores,
    }
    return reward, info


class CoopStoryTask(Task):
    """Two agents write one short story: agent 1 the beginning, agent 2 the ending.

    See :mod:`comlrl.envs.writing.story` for the seeds, prompts and reward. Needs no data
    file. The built-in default that shows learning with ``stories260k``.

    Args:
        limit: keep at most this many seeds per split.
        min_words, max_words: target length band of each part, in words (defaults fit
            completions of about 32-64 tokens of the stories260k tokenizer).
        weights: weight per reward part, e.g. ``{"keywords1": 0.2, "keywords2": 0.2,
            "no_repetition": 0.3}`` (unnamed parts keep :data:`DEFAULT_WEIGHTS`; the
            result must add up to 1).

    Raises:
        ValueError: for a negative ``limit``, a bad length band or bad ``weights``.
    """

    name = "coop_story"
    #: Where the examples come from (``comlrl tasks`` prints it).
    data_source = "built in: generated from names, places and objects (nothing to download)"
    num_agents = 2
    max_turns = 1
    #: New tokens per completion a run on a pretrained LLM gets unless it sets
    #: ``max_new_tokens`` (:mod:`comlrl.algos.training.config.model_defaults`): one story half
    #: (SmolLM2-135M's halves fit; docs/real-models.md's CPU run used 48).
    max_new_tokens = 48

    def __init__(
        self,
        *,
        limit: int | None = None,
        min_words: int = 10,
        max_words: int = 40,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        if not 1 <= min_words <= max_words:
            raise ValueError(
                f"need 1 <= min_words <= max_words, got min_words={min_words}, "
                f"max_words={max_words}"
            )
        self.limit = limit
        self.min_words = int(min_words)
        self.max_words = int(max_words)
        self.weights = check_weights(weights)

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        """Seeds of ``split``: ``test`` = every 8th seed (40), ``train`` = the rest (280).

        Raises:
            ValueError: for another split name.
        """
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; coop_story has 'train' and 'test'")
        rows = [s for s in story_seeds() if (s["seed_id"] % 8 == 7) == (split == "test")]
        return rows[: self.limit] if self.limit is not None else rows

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """``[beginning_prompt, ending_prompt]`` (single-turn: ``history`` unused).

        ``raw`` (what base models such as stories260k see, unchanged): the story's first
        sentences for agent 1, ``"<name> played with the <object> at the <place>. In the
        end,"`` for agent 2. Chat form: a system message with the agent's part of the
        story and a user message asking for that part (a few simple sentences, about
        ``min_words``-``max_words`` words, naming the seed's name, object and place), with
        the raw text as its first words.
        """
        name, obj, place = example["name"], example["object"], example["place"]
        begin = (
            f"Once upon a time, a little {example['kind']} named {name} went to the {place}. "
            f"{example['pronoun']} had a {obj}."
        )
        end = f"{name} played with the {obj} at the {place}. In the end,"
        words = f"{self.min_words} to {self.max_words} words"
        system = (
            "You and a teammate write one short, simple story for young children together. "
            "You write the {part}; your teammate writes the {other}."
        )
        user = (
            "Write the {part} of the story in {words}, about {name}, the {obj} and the "
            '{place}. Start with: "{start}"\nWrite only the story text.'
        )
        out: list[Prompt] = []
        for part, other, start in (("beginning", "ending", begin), ("ending", "beginning", end)):
            fmt = {"part": part, "other": other, "words": words, "name": name, "obj": obj}
            out.append(
                ChatPrompt(
                    (
                        {"role": "system", "content": system.format(**fmt)},
                        {"role": "user", "content": user.format(**fmt, place=place, start=start)},
                    ),
                    raw=start,
                )
            )
        return out

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions with :func:`story_reward` (reward in ``[0, 1]``).

        Raises:
            ValueError: when the shapes disagree.
        """
        self.check_joint_batch(completions, examples)
        rewards, infos = [], []
        for i, ex in enumerate(examples):
            value, info = story_reward(
                completions[0][i],
                completions[1][i],
                ex["keywords"],
                min_words=self.min_words,
                max_words=self.max_words,
                weights=self.weights,
            )
            rewards.append(value)
            infos.append(info)
        return RewardBatch(rewards, infos)
