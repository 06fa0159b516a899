"""Iterative preference refresh: each round compares the current policy's joint actions
with a *comparator policy*'s and keeps a replay of every round's pairs (CoMLRL's
MADPO-Iter / MARLHF-Iter, as CoMLRL 1.4.3 describes them).

A round, for a set of prompts:

1. **Candidates.** The current agents sample ``K`` completions each and the comparator
   (:mod:`.comparator`) ``K'``; the ``k``-th completions of all agents form joint action
   ``k`` (aligned), scored by the round's reward (the task's, or a learned reward model).
2. **Pairs** (:func:`round_pairs`). Current joint action ``k`` meets comparator joint
   action ``k`` (``k < min(K, K')``); a tie makes no pair, otherwise the higher-rewarded
   one is chosen. :func:`select_comparison_pairs` orders a prompt's pairs by
   ``pair_selection`` and keeps ``pairs_per_prompt``.
3. **Replay** (:class:`PreferenceReplay`). Every round's pairs are kept; the round trains
   on this round's (``current``) or on a draw from the last ``k`` rounds, all rounds, or
   all rounds weighted by a geometric ``lambda`` decay.
4. **Training**: DPO steps on the training pairs (MADPO-Iter), or a fresh reward model
   fitted on them and RL on its reward (MARLHF-Iter); :mod:`.rounds` runs the rounds.

Named axes: ``N`` prompts, ``A`` agents, ``K`` / ``K'`` current / comparator joint
actions per prompt, ``P`` pairs.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.algos.recipes.preference.iterative.replay_shards import (
    ReplayShard,
    read_shard,
    write_shard,
)
from comlrl.algos.recipes.preference.pairs import IterPair, row_tokens
from comlrl.algos.records import Rollout
from comlrl.algos.training.run.checkpoint import set_random_state

__all__ = [
    "PAIR_SELECTIONS",
    "REPLAY_MODES",
    "select_comparison_pairs",
    "lambda_decay_weights",
    "PreferenceReplay",
    "round_pairs",
]

#: how a prompt's current-vs-comparator pairs are ordered before ``pairs_per_prompt`` cuts
PAIR_SELECTIONS = ("reward_gap", "all", "random", "comparator_reward")
#: which rounds' pairs a round trains on
REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")


def select_comparison_pairs(
    current: Sequence[float],
    comparator: Sequence[float],
    mode: str,
    limit: int | None,
    rng: random.Random,
) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """Pair current joint action ``k`` with comparator joint action ``k`` for one prompt.

    Args:
        current: ``[K]`` rewards of the current policy's joint actions.
        comparator: ``[K']`` rewards of the comparator's.
        mode: ``comparator_reward`` (highest comparator reward first, then largest gap),
            ``reward_gap`` (largest ``|gap|`` first), ``random`` (shuffled with ``rng``),
            ``all`` (index order, no ``limit``).
        limit: pairs kept (``None``: all).
        rng: the stream ``random`` shuffles with.

    Returns:
        ``((winner_source, k), (loser_source, k))`` tuples; ties (equal rewards) give none.

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in PAIR_SELECTIONS:
        raise ValueError(f"pair_selection={mode!r}; use one of {PAIR_SELECTIONS}")
    found = []
    for k in range(min(len(current), len(comparator))):
        gap = float(current[k]) - float(comparator[k])
        if gap != 0:
            ends = (("current", k), ("comparator", k))
            win, lose = ends if gap > 0 else ends[::-1]
            found.append((abs(gap), float(comparator[k]), k, win, lose))
    if mode == "random":
        rng.shuffle(found)
    elif mode == "comparator_reward":
        found.sort(key=lambda f: (f[1], f[0]), reverse=True)
    elif mode == "reward_gap":
        found.sort(key=lambda f: f[0], reverse=True)
    if mode != "all" and limit is not None:
        found = found[:limit]
    return [(f[3], f[4]) for f in found]


def lambda_decay_weights(num_rounds: int, lam: float) -> list[float]:
    """Sampling weights of ``num_rounds`` stored rounds, oldest first: the newest round has
    weight proportional to ``(1 - lam)``, each older one ``lam`` times the next (finite
    TD(lambda)-style geometric weights, normalised to sum 1; ``lam = 1``: uniform;
    ``lam = 0``: the newest round only)."""
    if num_rounds < 1:
        return []
    if lam == 1.0:
        return [1.0 / num_rounds] * num_rounds
    newest_first = [(1.0 - lam) * lam**age for age in range(num_rounds)]
    total = sum(newest_first)
    return [w / total for w in reversed(newest_first)]


class PreferenceReplay:
    """Every round's pairs, and the choice of a round's training pairs
    (``preference_replay_mode``; 1.4.3's rules, kept in memory).

    - ``current``: this round's pairs, as generated.
    - ``nearest_k``: ``sample_size`` pairs drawn from the last ``k`` rounds (this one
      included), each draw picking a round uniformly among those with pairs.
    - ``all_history``: the same over every round so far.
    - ``lambda_decay``: the same over every round, rounds weighted by
      :func:`lambda_decay_weights`.

    ``sample_size`` defaults to this round's pair count (the last non-empty round's when
    this round has none). Within a round, ``c`` draws take ``c`` distinct pairs (whole
    shuffled passes first when ``c`` exceeds the round's pairs). The result is shuffled.

    Args:
        mode, k, lam, sample_size: the ``preference_replay_*`` fields.
        rng: the random stream of every draw.
        shard_dir: None keeps every round's pairs in memory; a folder writes each round's
            pairs there (``iteration_XXXX.json``, :mod:`.replay_shards`) and keeps only
            the file and its pair count, reading a round back when a draw picks it. The
            draws are the same either way.

    Attributes:
        rounds: per round, its pairs (in memory) or its
            :class:`~comlrl.algos.recipes.preference.iterative.replay_shards.ReplayShard`.
    """

    def __init__(
        self,
        mode: str,
        k: int | None,
        lam: float | None,
        sample_size: int | None,
        rng: random.Random,
        shard_dir: str | Path | None = None,
    ) -> None:
        self.mode, self.k, self.lam, self.sample_size, self.rng = mode, k, lam, sample_size, rng
        self.shard_dir = None if shard_dir is None else Path(shard_dir)
        self.rounds: list[list[IterPair] | ReplayShard] = []

    def _pairs(self, stored: list[IterPair] | ReplayShard) -> list[IterPair]:
        if isinstance(stored, ReplayShard):
            return [IterPair.from_state(r) for r in read_shard(stored)]
        return stored

    def add_and_select(self, pairs: Sequence[IterPair]) -> list[IterPair]:
        """Store this round's ``pairs`` (on disk with a ``shard_dir``) and return the
        round's training pairs.

        Raises:
            OSError: the shard cannot be written or read back.
        """
        if self.shard_dir is not None:
            self.rounds.append(
                write_shard(self.shard_dir, len(self.rounds) + 1, [p.to_state() for p in pairs])
            )
        else:
            self.rounds.append(list(pairs))
        if self.mode == "current":
            return list(pairs)
        pool = self.rounds[-int(self.k or 1) :] if self.mode == "nearest_k" else self.rounds
        weights = (
            lambda_decay_weights(len(pool), float(self.lam or 0.0))
            if self.mode == "lambda_decay"
            else [1.0] * len(pool)
        )
        size = self.sample_size
        if size is None:
            size = next((len(r) for r in reversed(self.rounds) if r), 0)
        eligible = [i for i, r in enumerate(pool) if r and weights[i] > 0]
        if size <= 0 or not eligible:
            return []
        draws = self.rng.choices(eligible, weights=[weights[i] for i in eligible], k=size)
        picked: list[IterPair] = []
        for i in eligible:
            count, rows = draws.count(i), self._pairs(pool[i])
            while count >= len(rows):
                picked.extend(self.rng.sample(rows, len(rows)))
                count -= len(rows)
            picked.extend(self.rng.sample(rows, count))
        self.rng.shuffle(picked)
        return picked

    def state_dict(self) -> dict[str, Any]:
        """Every stored round's pairs (a shard: its file and count) and the draw stream,
        as plain values."""
        return {
            "rounds": [
                r.to_state() if isinstance(r, ReplayShard) else [p.to_state() for p in r]
                for r in self.rounds
            ],
            "rng": self.rng.getstate(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next :meth:`add_and_select` draws what
        the saved replay's would have."""
        self.rounds = [
            ReplayShard.from_state(r)
            if isinstance(r, Mapping)
            else [IterPair.from_state(p) for p in r]
            for r in state["rounds"]
        ]
        set_random_state(self.rng, state["rng"])


def round_pairs(
    current: Rollout,
    comparator: Rollout,
    *,
    round_index: int,
    mode: str,
    limit: int | None,
    rng: random.Random,
) -> tuple[list[IterPair], dict[str, float]]:
    """The pairs of one batch of prompts: current rollout vs comparator rollout (both
    single-turn, aligned joint actions, the same ``N`` examples in the same order).

    Returns:
        ``(pairs, stats)``; ``stats``: ``current_reward_mean`` and
        ``comparator_reward_mean`` over the ``[N, K]`` / ``[N, K']`` rewards.
    """
    cur, cmp = current.turns[0], comparator.turns[0]
    sides = {"current": cur, "comparator": cmp}
    pairs: list[IterPair] = []
    for n in range(cur.rewards.shape[0]):
        chosen_rewards = {s: t.rewards[n].tolist() for s, t in sides.items()}
        for win, lose in select_comparison_pairs(
            chosen_rewards["current"], chosen_rewards["comparator"], mode, limit, rng
        ):
            texts, tokens = [], []
            for source, k in (win, lose):
                turn = sides[source]
                agents = turn.agents
                picks = [int(turn.joint_index[k, a]) for a in range(len(agents))]
                texts.append(
                    tuple(s.completions[n][j].text for s, j in zip(agents, picks, strict=True))
                )
                g = [s.batch.group_size for s in agents]
                tokens.append(
                    [row_tokens(s.batch, n * g[a] + picks[a]) for a, s in enumerate(agents)]
                )
            pairs.append(
                IterPair(
                    round=round_index,
                    example=current.examples[int(cur.example_index[n])],
                    prompts=tuple(s.prompts[n] for s in cur.agents),
                    chosen=texts[0],
                    rejected=texts[1],
                    prompt_ids=tuple(p for p, _ in tokens[0]),
                    chosen_ids=tuple(c for _, c in tokens[0]),
                    rejected_ids=tuple(c for _, c in tokens[1]),
                    chosen_reward=float(chosen_rewards[win[0]][win[1]]),
                    rejected_reward=float(chosen_rewards[lose[0]][lose[1]]),
                    chosen_source=win[0],
                    rejected_source=lose[0],
                )
            )
    stats = {
        "current_reward_mean": float(cur.rewards.mean()),
        "comparator_reward_mean": float(cmp.rewards.mean()),
    }
    return pairs, stats
