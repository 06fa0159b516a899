"""A cooperative story task for the pretrained stories260k model, shared by the integration tests.

Two authors continue the same story opening, which names a hero. The team earns, per joint
action (range [0, 2]):

- 0.5 per continuation that names the hero (the model knows the common TinyStories names);
- 0.25 per continuation that ends a sentence (``.``, ``!`` or ``?`` as its last character);
- 0.5 when the two continuations share between 20% and 60% of their word types (Jaccard):
  the same story, not a copy.

Multi-turn: the feedback tells each author what the team missed (the hero's name, an
unfinished sentence) and repeats the teammate's text; the next prompt is the opening, the
author's own first try, and that note.

Why this is not the library's ``coop_story`` (``comlrl.envs.writing.story``): it is a
different reward on purpose. The learning tests (``tests/test_*_learn.py``) measured their
thresholds on this one (range [0, 2]: hero names, sentence endings, word overlap), and it
is a task written outside ``comlrl.envs`` (a user's own :class:`comlrl.core.Task`), the
path those tests also cover. Runs of the built-in task use ``comlrl.envs`` directly
(``tests/test_cli_recipes.py``, ``benchmarks/real_llm_learning_run.py``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.core import Feedback, JointAction, RewardBatch, Task

NAMES = ["Lily", "Tim", "Sue", "Ben", "Anna", "Max", "Mia", "Sam"]
THINGS = ["ball", "cat", "dog", "kite", "box", "car", "tree", "cake"]
STARTS = [
    "Once upon a time, there was a {kind} named {name}.",
    "One day, {name} found a big {thing}.",
    "{name} liked to play with a {thing}.",
    "There was a little {kind} called {name}.",
]


def story_examples(n: int = 128, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` story openings, each naming a hero (a dict with ``id``, ``hero``, ``opening``)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        kind = "girl" if name in ("Lily", "Sue", "Anna", "Mia") else "boy"
        out.append(
            {
                "id": i,
                "hero": name,
                "opening": rng.choice(STARTS).format(kind=kind, name=name, thing=thing),
            }
        )
    return out


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def story_reward(
    c1: Sequence[str], c2: Sequence[str], *, example: Mapping[str, Any]
) -> list[float]:
    """The joint reward above, one float per joint action."""
    out = []
    for a, b in zip(c1, c2, strict=True):
        r = 0.5 * (example["hero"] in a) + 0.5 * (example["hero"] in b)
        r += 0.25 * a.rstrip().endswith((".", "!", "?")) + 0.25 * b.rstrip().endswith(
            (".", "!", "?")
        )
        wa, wb = _words(a), _words(b)
        jaccard = len(wa & wb) / max(1, len(wa | wb))
        r += 0.5 * (0.2 <= jaccard <= 0.6)
        out.append(float(r))
    return out


class CoopStoryTask(Task):
    """The two-author story task with feedback, as a :class:`comlrl.core.Task`."""

    name, num_agents, max_turns = "coop_story_test", 2, 3

    def __init__(self, n: int = 128, seed: int = 0) -> None:
        self.examples = story_examples(n, seed)

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        return self.examples

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[str]:
        if not history:
            return [example["opening"], example["opening"]]
        return [example["opening"] + " " + history[-1].texts[a] for a in range(2)]

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        rewards = []
        for a, b, ex in zip(completions[0], completions[1], examples, strict=True):
            rewards.extend(story_reward([a], [b], example=ex))
        return RewardBatch(rewards)

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        texts = []
        for a in range(2):
            own = joint_action.completions[a].strip()
            texts.append(f"{own[:200]} Then {example['hero']} was happy.")
        return Feedback(texts=tuple(texts))
