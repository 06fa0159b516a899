"""MADPO's preference pairs chosen within each prompt, and built once from the initial
policy (``MADPOConfig.pair_source="initial"``, the MADPO of CoMLRL 1.4.3).

With ``pair_source="initial"`` :func:`build_initial_pairs` runs before the first step:
the initial agents sample ``K`` candidates for every training prompt (``batch_size``
prompts per rollout, in dataset order), the reward function scores the ``K`` joint
actions of each prompt and :func:`rollout_pairs` pairs them within the prompt. The
training steps then take ``batch_size`` pairs at a time from a stream over these pairs,
reshuffled every pass (:meth:`~comlrl.algos.recipes.preference.madpo.recipe.MADPORecipe.step`).

:func:`within_prompt_pairs` is the choice of one prompt's pairs: every ordered
``(w, l)`` with ``r_w > r_l`` and ``r_w - r_l >= min_gap`` is a candidate;
``reward_gap`` keeps the ``limit`` largest gaps (ties: lower ``w``, then lower ``l``, as
:func:`~comlrl.estimators.preference_losses.select_preference_pairs`), ``random``
a uniform draw of ``limit`` of them.

Named axes: ``N`` prompts, ``A`` agents, ``K`` joint actions per prompt, ``P`` pairs.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.algos.recipes.preference.pairs import IterPair, row_tokens
from comlrl.algos.records import Rollout
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.core import SamplingParams

__all__ = ["PAIR_SELECTIONS", "within_prompt_pairs", "rollout_pairs", "build_initial_pairs"]

#: how the candidate pairs of one prompt are chosen (``MADPOConfig.pair_selection``)
PAIR_SELECTIONS = ("reward_gap", "random")


def within_prompt_pairs(
    rewards: Sequence[float],
    *,
    selection: str,
    limit: int,
    min_gap: float,
    rng: random.Random,
) -> list[tuple[int, int]]:
    """The ``(chosen, rejected)`` joint-action indices of one prompt (see the module
    docstring).

    Args:
        rewards: ``[K]`` joint rewards (task units).
        selection: one of :data:`PAIR_SELECTIONS`.
        limit: pairs kept (>= 1).
        min_gap: the smallest reward gap that makes a pair (>= 0).
        rng: the stream ``random`` draws with (untouched by ``reward_gap``).

    Raises:
        ValueError: an unknown ``selection`` or ``limit < 1``.
    """
    if selection not in PAIR_SELECTIONS:
        raise ValueError(f"pair selection {selection!r}; use one of {PAIR_SELECTIONS}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    found = [
        (float(rw) - float(rl), w, lo)
        for w, rw in enumerate(rewards)
        for lo, rl in enumerate(rewards)
        if float(rw) > float(rl) and float(rw) - float(rl) >= min_gap
    ]
    if selection == "random":
        rng.shuffle(found)
    else:
        found.sort(key=lambda c: (-c[0], c[1], c[2]))
    return [(w, lo) for _, w, lo in found[:limit]]


def rollout_pairs(
    ro: Rollout, *, selection: str, limit: int, min_gap: float, rng: random.Random
) -> list[IterPair]:
    """The pairs within each prompt's joint actions of a single-turn rollout
    (:func:`within_prompt_pairs` on turn 0's ``[N, K]`` rewards), prompt by prompt, as
    :class:`~comlrl.algos.recipes.preference.iterative.replay.IterPair` s (token ids as
    sampled; ``round`` 0, both sources ``"current"``).

    Raises:
        ValueError: the rollout has more than one turn, or as :func:`within_prompt_pairs`.
    """
    if len(ro.turns) != 1:
        raise ValueError(f"MADPO pairs single-turn rollouts, got {len(ro.turns)} turns")
    turn = ro.turns[0]
    agents = turn.agents
    groups = [s.batch.group_size for s in agents]
    pairs: list[IterPair] = []
    for n, rewards in enumerate(turn.rewards.tolist()):
        for win, lose in within_prompt_pairs(
            rewards, selection=selection, limit=limit, min_gap=min_gap, rng=rng
        ):
            texts, tokens = [], []
            for k in (win, lose):
                picks = [int(turn.joint_index[k, a]) for a in range(len(agents))]
                texts.append(tuple(s.completions[n][j].text for s, j in zip(agents, picks)))
                tokens.append(
                    [row_tokens(s.batch, n * groups[a] + picks[a]) for a, s in enumerate(agents)]
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


def build_initial_pairs(
    agents: Sequence[Any],
    env: Environment,
    dataset: Sequence[Mapping[str, Any]],
    sampling: SamplingParams,
    tree: TreeSettings,
    *,
    batch_size: int,
    selection: str,
    limit: int,
    min_gap: float,
    rng: random.Random,
) -> list[IterPair]:
    """Every training prompt's pairs from ``agents`` as they are now: one rollout per
    ``batch_size`` prompts of ``dataset`` in order, :func:`rollout_pairs` on each; ``rng``
    drives the sampling order and the ``random`` selection. Returns ``[]`` when every
    prompt's candidates tie (or no gap reaches ``min_gap``)."""
    pairs: list[IterPair] = []
    for start in range(0, len(dataset), batch_size):
        ro = rollout(
            agents, list(dataset[start : start + batch_size]), env, sampling, tree, rng=rng
        )
        pairs.extend(rollout_pairs(ro, selection=selection, limit=limit, min_gap=min_gap, rng=rng))
    return pairs
