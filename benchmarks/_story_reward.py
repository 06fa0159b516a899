"""A cooperative two-agent story task for the multi-turn throughput benchmark.

Self-contained (standard library only; imports neither our ``comlrl.*`` packages nor the
published ``comlrl==1.4.3``), so both benchmark sides load the very same file: ours in the
dev venv, CoMLRL 1.4.3's in its own venv through ``_comlrl143_multiturn_side.py``.
That is why it is a copy and not the library's ``coop_story``
(``comlrl.envs.writing.story``): in 1.4.3's venv the ``comlrl`` name is CoMLRL 1.4.3's,
so our ``comlrl.envs`` cannot be imported there, and both sides must score one reward.

The task: agent 0 writes the **beginning** of a short TinyStories-style story, agent 1 the
**ending**. Each agent sees only its own prompt (the shared task line plus its own story
opener). The joint action (beginning, ending) earns one joint reward in ``[0, 2]``.
It is made for ``stories260k`` (a 260K-parameter TinyStories Llama, vocab 512, about two
tokens per English word): every part of the reward is something such a model already does
sometimes, so a few dozen policy-gradient steps at lr 1e-3 can move it.

Public pieces:

- ``story_examples(n, seed)`` -> ``n`` example dicts (JSON-serialisable), built from templates.
- ``agent_prompt(example, agent_idx)`` -> that agent's turn-1 prompt;
  ``make_formatter(agent_idx)`` wraps it in CoMLRL's formatter form
  ``fmt(item, external_prompts=None)`` (returns ``external_prompts`` verbatim when given).
- ``story_reward(beginnings, endings, example)`` -> one reward per joint action.
- ``transition(prompt=..., agent_completions=..., num_agents=..., prompt_history_per_agent=...,
  response_history_per_agent=...)`` -> the next turn's prompt per agent, in CoMLRL 1.4.3's
  ``external_transition`` contract (see ``comlrl143_multiturn_notes.md``).

Reward parts (all computed on lower-cased words, ``[a-z']+``; weights sum to 2.0):

==================  ======  =============================================================
part                weight  score in [0, 1]
==================  ======  =============================================================
name_beginning      0.25    1 if the example's name occurs in the beginning, else 0
object_beginning    0.25    1 if the example's object (or its plural ``+s``) occurs in it
name_ending         0.25    same, in the ending
object_ending       0.25    same, in the ending
length_beginning    0.25    1 inside ``[min_words, max_words]``; below: ``n / min_words``;
                            above: ``max(0, 1 - (n - max_words) / max_words)``
length_ending       0.25    same, for the ending
shared_vocabulary   0.25    ``min(1, s / 0.25)`` where ``s`` is the fraction of the
                            ending's distinct content words (length >= 3, not a stop word)
                            that also occur in the beginning: full credit at 25 %
novelty             0.25    ``1 - r`` where ``r`` is the fraction of the ending's word
                            4-grams that also occur in the beginning (copying the
                            beginning scores 0); 0 when the ending has fewer than 4 words
==================  ======  =============================================================

The name and the object are given in the shared task line of both prompts, and the
beginning's opener names the character, so a pretrained TinyStories model mentions them
some of the time but not always (the learnable part). The length band defaults to 20-60
words (about 40-120 stories260k tokens): with ``max_new_tokens`` >= 48 an unbroken
completion reaches the band, and the length terms mainly punish completions that stop
early. Empty or whitespace-only parts score 0 on every part that reads them.

Measured with stories260k (temperature 1, G=4, max_new_tokens=64, turn 1, ``story_examples(
200, 0)``): the frozen model scores about 1.09 (name 0.54 / 0.26 in beginning / ending, object
0.16 / 0.19, shared vocabulary 0.20, length and novelty about 1.0). A minimal GRPO loop
(group-mean baseline, token-mean log-prob loss, grad-norm clip 1.0, AdamW, 4 prompts per
step) raises it from about 1.1 to about 1.4 in 25 steps at lr 1e-4, but at lr 1e-3 it
*falls* to about 0.8 in the same 25 steps (the model stops repeating the name and object),
and so does CoMLRL 1.4.3's MAGRPO at lr 1e-3. For a learning-curve comparison use lr <= 1e-4;
for throughput the learning rate hardly matters (completions hit ``max_new_tokens`` either way).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "REWARD_WEIGHTS",
    "agent_prompt",
    "make_formatter",
    "reward_parts",
    "story_examples",
    "story_reward",
    "transition",
]

REWARD_WEIGHTS: dict[str, float] = {
    "name_beginning": 0.25,
    "object_beginning": 0.25,
    "name_ending": 0.25,
    "object_ending": 0.25,
    "length_beginning": 0.25,
    "length_ending": 0.25,
    "shared_vocabulary": 0.25,
    "novelty": 0.25,
}
SHARED_VOCAB_FULL_CREDIT = 0.25  # fraction of the ending's content words found in the beginning
NGRAM = 4  # word n-gram size of the novelty (anti-copy) term

NAMES = ("Lily", "Tim", "Sue", "Ben", "Mia", "Max", "Anna", "Tom", "Sara", "Jack", "Lucy", "Sam")
# Girls get "she", boys "he": the templates read naturally and the model's pronouns agree.
GIRLS = frozenset({"Lily", "Sue", "Mia", "Anna", "Sara", "Lucy"})
OBJECTS = (
    "ball",
    "kite",
    "doll",
    "hat",
    "book",
    "box",
    "cake",
    "boat",
    "car",
    "bird",
    "dog",
    "cat",
)
ADJECTIVES = ("red", "big", "shiny", "small", "blue", "soft", "green", "new")
PLACES = ("park", "garden", "beach", "forest", "house", "school", "lake", "farm")

BEGINNING_OPENERS = (
    "Once upon a time, there was a little {kind} named {name}.",
    "One day, a {kind} named {name} went to the {place}.",
    "Once upon a time, {name} lived near a {place}.",
)
ENDING_OPENERS = (
    "At the end of the day,",
    "In the end,",
    "After that,",
    "The next day,",
)
REVISE_INSTRUCTION = "Now tell your part of the story again, better."

_STOP = frozenset(
    "the and was were are for that with she her him his they them their then there this "
    "have had has but not you your all one day said very too who what when out can could "
    "would will from into onto off just also did does its it's".split()
)
_WORD = re.compile(r"[a-z']+")


def story_examples(
    n: int, seed: int, min_words: int = 20, max_words: int = 60
) -> list[dict[str, Any]]:
    """Build ``n`` story examples from templates, deterministically from ``seed``.

    Each example is a plain JSON-serialisable dict:
    ``id`` (``"story/<seed>/<i>"``), ``name``, ``object``, ``adjective``, ``place``,
    ``prompt`` (the shared task line, e.g. ``"A story about Lily and a red ball at the park."``;
    CoMLRL 1.4.3 passes ``item["prompt"]`` to ``external_transition``),
    ``openers`` (one story opener per agent: beginning, ending),
    ``min_words`` / ``max_words`` (the length band of each part).

    Raises ``ValueError`` when ``n < 0`` or the band is empty (``min_words > max_words``).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name = rng.choice(NAMES)
        obj = rng.choice(OBJECTS)
        adj = rng.choice(ADJECTIVES)
        place = rng.choice(PLACES)
        kind = "girl" if name in GIRLS else "boy"
        fields = {"name": name, "kind": kind, "place": place}
        out.append(
            {
                "id": f"story/{seed}/{i}",
                "name": name,
                "object": obj,
                "adjective": adj,
                "place": place,
                "prompt": f"A story about {name} and a {adj} {obj} at the {place}.",
                "openers": [
                    rng.choice(BEGINNING_OPENERS).format(**fields),
                    rng.choice(ENDING_OPENERS).format(**fields),
                ],
                "min_words": min_words,
                "max_words": max_words,
            }
        )
    return out


def agent_prompt(example: dict[str, Any], agent_idx: int) -> str:
    """Agent ``agent_idx``'s turn-1 prompt: ``example["prompt"] + "\\n" + its opener``."""
    openers = example["openers"]
    if not 0 <= agent_idx < len(openers):
        raise ValueError(f"agent_idx {agent_idx} out of range for {len(openers)} openers")
    return f"{example['prompt']}\n{openers[agent_idx]}"


def make_formatter(agent_idx: int) -> Callable[..., str]:
    """A CoMLRL formatter for agent ``agent_idx``: ``fmt(item, external_prompts=None) -> str``.

    Turn 1 (``external_prompts is None``): ``agent_prompt(item, agent_idx)``. Later turns:
    the ``external_transition`` output for this agent, verbatim.
    """

    def fmt(item: dict[str, Any], external_prompts: str | None = None) -> str:
        if external_prompts is not None:
            return external_prompts
        return agent_prompt(item, agent_idx)

    return fmt


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _content(words: Sequence[str]) -> set[str]:
    return {w for w in words if len(w) >= 3 and w not in _STOP}


def _mentions(words: Sequence[str], keyword: str) -> float:
    k = keyword.lower()
    return 1.0 if (k in words or k + "s" in words) else 0.0


def _length_score(n: int, lo: int, hi: int) -> float:
    if n < lo:
        return n / lo
    if n > hi:
        return max(0.0, 1.0 - (n - hi) / hi)
    return 1.0


def _ngrams(words: Sequence[str], k: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + k]) for i in range(len(words) - k + 1)]


def reward_parts(beginning: str, ending: str, example: dict[str, Any]) -> dict[str, float]:
    """Each part's score in [0, 1] (unweighted) for one joint action; see the module doc."""
    b, e = _words(beginning), _words(ending)
    lo, hi = int(example.get("min_words", 20)), int(example.get("max_words", 60))
    parts = {
        "name_beginning": _mentions(b, example["name"]),
        "object_beginning": _mentions(b, example["object"]),
        "name_ending": _mentions(e, example["name"]),
        "object_ending": _mentions(e, example["object"]),
        "length_beginning": _length_score(len(b), lo, hi),
        "length_ending": _length_score(len(e), lo, hi),
    }
    ce = _content(e)
    shared = len(ce & _content(b)) / len(ce) if ce else 0.0
    parts["shared_vocabulary"] = min(1.0, shared / SHARED_VOCAB_FULL_CREDIT)
    eg = _ngrams(e, NGRAM)
    if eg:
        seen = set(_ngrams(b, NGRAM))
        parts["novelty"] = 1.0 - sum(g in seen for g in eg) / len(eg)
    else:
        parts["novelty"] = 0.0
    return parts


def story_reward(beginnings: list[str], endings: list[str], example: dict[str, Any]) -> list[float]:
    """Joint reward in [0, 2] for each (beginning, ending) pair, scored against ``example``.

    ``beginnings[k]`` (agent 0) and ``endings[k]`` (agent 1) form joint action ``k``; the
    result has one float per joint action: ``sum(REWARD_WEIGHTS[p] * reward_parts(...)[p])``.
    Raises ``ValueError`` when the two lists differ in length.
    """
    if len(beginnings) != len(endings):
        raise ValueError(
            f"{len(beginnings)} beginnings but {len(endings)} endings; "
            "pass one of each per joint action"
        )
    out = []
    for b, e in zip(beginnings, endings):
        parts = reward_parts(b, e, example)
        out.append(float(sum(REWARD_WEIGHTS[k] * v for k, v in parts.items())))
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


def transition(
    prompt: str,
    agent_completions: Sequence[str],
    num_agents: int,
    prompt_history_per_agent: Sequence[Sequence[str]],
    response_history_per_agent: Sequence[Sequence[str]],
) -> list[str]:
    """CoMLRL 1.4.3 ``external_transition`` for the story task: next turn's prompt per agent.

    Args (all passed by keyword by CoMLRL 1.4.3):
        prompt: the example's ``"prompt"`` field (the shared task line), not a formatted prompt.
        agent_completions: this branch's joint action of the turn just played, one text per
            agent (agent 0 the beginning, agent 1 the ending).
        num_agents: number of agents (2 here).
        prompt_history_per_agent: per agent, the prompts it saw on this branch, turn 1 first
            (turn 1: ``agent_prompt(example, i)``; later: this function's earlier outputs).
        response_history_per_agent: per agent, its completions on this branch, turn 1 first
            (the last entry equals ``agent_completions[i]``). Unused here.

    Returns ``num_agents`` strings; agent ``i`` gets::

        {prompt}
        Beginning: {agent 0's text, whitespace collapsed}
        Ending: {agent 1's text, whitespace collapsed}
        Now tell your part of the story again, better.
        {agent i's turn-1 opener}

    (for more than two agents the parts are labelled ``Part 1:``, ``Part 2:``, ...). The
    opener is the turn-1 prompt with the leading ``prompt + "\\n"`` removed, so each prompt
    ends in story text that the model continues. Raises ``ValueError`` when the lengths of
    ``agent_completions`` or ``prompt_history_per_agent`` are not ``num_agents``.
    """
    del response_history_per_agent  # the latest joint action is agent_completions
    if len(agent_completions) != num_agents or len(prompt_history_per_agent) != num_agents:
        raise ValueError(
            f"expected {num_agents} completions and prompt histories, got "
            f"{len(agent_completions)} and {len(prompt_history_per_agent)}"
        )
    labels = (
        ["Beginning", "Ending"] if num_agents == 2 else [f"Part {i + 1}" for i in range(num_agents)]
    )
    shown = "\n".join(f"{lab}: {_one_line(c)}" for lab, c in zip(labels, agent_completions))
    out = []
    for i in range(num_agents):
        first = prompt_history_per_agent[i][0] if prompt_history_per_agent[i] else prompt
        opener = first[len(prompt) :].lstrip("\n") if first.startswith(prompt) else first
        out.append(f"{prompt}\n{shown}\n{REVISE_INSTRUCTION}\n{opener}".rstrip())
    return out
