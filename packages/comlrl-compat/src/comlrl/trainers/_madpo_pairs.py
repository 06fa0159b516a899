"""CoMLRL 1.4.3's MADPO preference data: every pair built once, before training, from the
initial policy's candidates.

For each training example the agents sample ``preference_num_candidates`` completions
(aligned: candidate ``k`` of every agent is joint action ``k``), the reward function
scores the joint actions, and :func:`select_within_pairs` orders the pairs ``(i, j)``
with ``r_i > r_j`` (ties give none). The pairs are then trained on for
``num_train_epochs`` epochs, shuffled each epoch, ``train_batch_size`` pairs per
optimizer step (1.4.3's ``MADPOTrainer.train``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from comlrl.trainers._iterative import IterPair, _row_tokens

__all__ = ["MADPO_PAIR_SELECTIONS", "rollout_pairs", "select_within_pairs"]

#: ``pair_selection`` values of CoMLRL 1.4.3's MADPOConfig
MADPO_PAIR_SELECTIONS = ("reward_gap", "random", "all")


def select_within_pairs(
    rewards: Sequence[float], mode: str, limit: int | None, rng: random.Random
) -> list[tuple[int, int]]:
    """The ``(winner, loser)`` index pairs of one prompt's ``K`` joint actions.

    Every ordered ``(i, j)`` with ``rewards[i] > rewards[j]`` is a candidate; ``mode``
    orders them: ``reward_gap`` (largest gap first, ties in index order), ``random``
    (shuffled with ``rng``), ``all`` (index order, ``limit`` ignored). ``limit`` (None:
    all) keeps the first ones.

    Raises:
        ValueError: an unknown ``mode`` or ``limit < 1``.
    """
    if mode not in MADPO_PAIR_SELECTIONS:
        raise ValueError(f"pair_selection={mode!r}; use one of {MADPO_PAIR_SELECTIONS}")
    if limit is not None and limit < 1:
        raise ValueError(f"preference_pairs_per_sample must be >= 1 or None, got {limit!r}")
    found = [
        (float(ri) - float(rj), i, j)
        for i, ri in enumerate(rewards)
        for j, rj in enumerate(rewards)
        if i != j and float(ri) > float(rj)
    ]
    if mode == "random":
        rng.shuffle(found)
    elif mode == "reward_gap":
        found.sort(key=lambda f: f[0], reverse=True)
    if mode != "all" and limit is not None:
        found = found[:limit]
    return [(i, j) for _, i, j in found]


def rollout_pairs(ro: Any, *, mode: str, limit: int | None, rng: random.Random) -> list[IterPair]:
    """The pairs within each prompt's joint actions of a single-turn rollout.

    Args:
        ro: a :class:`comlrl.algos.records.Rollout` (turn 0 is used).
        mode, limit, rng: as :func:`select_within_pairs`.

    Returns:
        :class:`~comlrl.trainers._iterative.IterPair` s (``round`` 0, both sources
        ``"current"``), prompt by prompt.
    """
    turn = ro.turns[0]
    agents = turn.agents
    groups = [s.batch.group_size for s in agents]
    pairs: list[IterPair] = []
    for n in range(turn.rewards.shape[0]):
        rewards = turn.rewards[n].tolist()
        for win, lose in select_within_pairs(rewards, mode, limit, rng):
            texts, tokens = [], []
            for k in (win, lose):
                picks = [int(turn.joint_index[k, a]) for a in range(len(agents))]
                texts.append(
                    tuple(s.completions[n][j].text for s, j in zip(agents, picks, strict=True))
                )
                tokens.append(
                    [_row_tokens(s.batch, n * groups[a] + picks[a]) for a, s in enumerate(agents)]
                )
            pairs.append(
                IterPair(
                    round=0,
                    example=ro.examples[int(turn.example_index[n])],
                    prompts=tuple(s.prompts[n] for s in agents),
                    chosen=texts[0],
                    rejected=texts[1],
                    prompt_ids=tuple(p for p, _ in tokens[0]),
                    chosen_ids=tuple(c for _, c in tokens[0]),
                    rejected_ids=tuple(c for _, c in tokens[1]),
                    chosen_reward=float(rewards[win]),
                    rejected_reward=float(rewards[lose]),
                    chosen_source="current",
                    rejected_source="current",
                )
            )
    return pairs
