"""The rounds of iterative preference refresh (pairs and replay: :mod:`.replay`): what
every round of MADPO-Iter and MARLHF-Iter does before its training.

:class:`IterativeRounds` holds the comparator (:mod:`.comparator`), the replay and the
random streams of pairing and ordering; :meth:`IterativeRounds.begin` samples a round's
current and comparator candidates on a list of prompts, pairs them and picks the round's
training pairs; :meth:`IterativeRounds.finish` lets the comparator snapshot the policy.
The step-driven recipes of :mod:`.recipe` call :meth:`~IterativeRounds.begin`
under the loop driver; CoMLRL 1.4.3's iterative trainers (``comlrl.trainers.preference``)
call it once per round on every training prompt.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.algos.recipes.preference.iterative.comparator import Comparator
from comlrl.algos.recipes.preference.iterative.replay import PreferenceReplay, round_pairs
from comlrl.algos.recipes.preference.pairs import IterPair
from comlrl.algos.records import Rollout
from comlrl.algos.rollout.environment import Environment
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.run.checkpoint import set_random_state
from comlrl.core import SamplingParams

__all__ = ["IterativeRounds"]


class IterativeRounds:
    """The round machinery of one iterative run.

    Args:
        comparator: the comparator policy (its ``agents`` are the current agents).
        replay: every round's pairs and the choice of a round's training pairs.
        sampling: the current agents' sampling (``num_generations`` = ``K``).
        comparator_sampling: the comparator's (``num_generations`` = ``K'``).
        pair_selection: :data:`~comlrl.algos.recipes.preference.iterative.replay.PAIR_SELECTIONS`.
        pairs_per_prompt: pairs kept per prompt (``None``: all).
        seed: seeds the pairing (``seed + 2``) and ordering (``seed + 3``) streams.
        observe: called as ``observe(round_index, current, comparator)`` with each batch's
            current and comparator :class:`~comlrl.algos.records.Rollout` once they are
            scored (e.g. to chart the round's candidate rewards); None: nothing.

    Attributes:
        history: one row per round begun (``iter/*`` keys, see :meth:`begin`).
        total_pairs: pairs generated so far.
    """

    def __init__(
        self,
        comparator: Comparator,
        replay: PreferenceReplay,
        *,
        sampling: SamplingParams,
        comparator_sampling: SamplingParams,
        pair_selection: str,
        pairs_per_prompt: int | None,
        seed: int,
        observe: Callable[[int, Rollout, Rollout], Any] | None = None,
    ) -> None:
        self.comparator = comparator
        self.observe = observe
        self.replay = replay
        self.sampling, self.comparator_sampling = sampling, comparator_sampling
        self.pair_selection, self.pairs_per_prompt = pair_selection, pairs_per_prompt
        self.pair_rng = random.Random(seed + 2)
        self.order_rng = random.Random(seed + 3)
        self.history: list[dict[str, float]] = []
        self.total_pairs = 0
        self.started = False

    @property
    def agents(self) -> list[Any]:
        """The current (trained) agents."""
        return self.comparator.agents

    def collect(
        self,
        round_index: int,
        env: Environment,
        examples: Sequence[Mapping[str, Any]],
        batch_size: int,
    ) -> tuple[list[IterPair], dict[str, float]]:
        """Round ``round_index``'s pairs on ``examples`` (in batches of ``batch_size``
        prompts), scored by ``env``'s reward.

        Returns:
            ``(pairs, stats)``: ``stats`` holds ``current_reward_mean`` and
            ``comparator_reward_mean`` over every sampled joint action.
        """
        if not self.started:
            self.comparator.start()
            self.started = True
        tree = TreeSettings(num_turns=1, joint_mode="align")
        comparator = self.comparator.agents_for(round_index)
        pairs: list[IterPair] = []
        sums = {"current_reward_mean": 0.0, "comparator_reward_mean": 0.0}
        for start in range(0, len(examples), batch_size):
            chunk = list(examples[start : start + batch_size])
            ro_cur = rollout(self.agents, chunk, env, self.sampling, tree)
            ro_cmp = rollout(comparator, chunk, env, self.comparator_sampling, tree)
            if self.observe is not None:
                self.observe(round_index, ro_cur, ro_cmp)
            found, stats = round_pairs(
                ro_cur,
                ro_cmp,
                round_index=round_index,
                mode=self.pair_selection,
                limit=self.pairs_per_prompt,
                rng=self.pair_rng,
            )
            pairs.extend(found)
            for key in sums:
                sums[key] += stats[key] * len(chunk)
        return pairs, {key: v / max(1, len(examples)) for key, v in sums.items()}

    def begin(
        self,
        round_index: int,
        env: Environment,
        examples: Sequence[Mapping[str, Any]],
        batch_size: int,
    ) -> tuple[list[IterPair], dict[str, float]]:
        """Start round ``round_index``: :meth:`collect`, store its pairs in the replay and
        pick the round's training pairs.

        Returns:
            ``(training pairs, round row)``; the row (also appended to :attr:`history`):
            ``iter/current_iteration`` (1-based), ``iter/current_preference_pairs``,
            ``iter/total_preference_pairs``, ``iter/train_preference_pairs``,
            ``iter/current_reward_mean``, ``iter/comparator_reward_mean``.
        """
        pairs, stats = self.collect(round_index, env, examples, batch_size)
        train_pairs = self.replay.add_and_select(pairs)
        self.total_pairs += len(pairs)
        row = {
            "iter/current_iteration": float(round_index + 1),
            "iter/current_preference_pairs": float(len(pairs)),
            "iter/total_preference_pairs": float(self.total_pairs),
            "iter/train_preference_pairs": float(len(train_pairs)),
            **{f"iter/{k}": v for k, v in stats.items()},
        }
        self.history.append(row)
        return train_pairs, row

    def finish(self, round_index: int) -> None:
        """After round ``round_index``'s training (the history comparator's snapshot)."""
        self.comparator.finish_round(round_index)

    def state_dict(self) -> dict[str, Any]:
        """Where the rounds stand, as plain values and CPU tensors (a step checkpoint's
        part): the pairing and ordering streams, the round rows, the pair count, the
        replay (:meth:`PreferenceReplay.state_dict`) and the comparator
        (:meth:`Comparator.state_dict`)."""
        return {
            "pair_rng": self.pair_rng.getstate(),
            "order_rng": self.order_rng.getstate(),
            "history": [dict(row) for row in self.history],
            "total_pairs": self.total_pairs,
            "started": self.started,
            "replay": self.replay.state_dict(),
            "comparator": self.comparator.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (rounds built with the same settings, and the
        current agents already at the saved weights): the next round samples, pairs and
        draws what the saved run's next round would have.

        Raises:
            ValueError: the saved comparator does not fit this one.
        """
        set_random_state(self.pair_rng, state["pair_rng"])
        set_random_state(self.order_rng, state["order_rng"])
        self.history = [dict(row) for row in state["history"]]
        self.total_pairs = int(state["total_pairs"])
        self.started = bool(state["started"])
        self.replay.load_state_dict(state["replay"])
        self.comparator.load_state_dict(state["comparator"])

    def pair_batches(
        self, pairs: Sequence[IterPair], epochs: int, batch: int
    ) -> list[list[IterPair]]:
        """``epochs`` passes over ``pairs``, each shuffled by the ordering stream, in
        batches of ``batch``."""
        out: list[list[IterPair]] = []
        for _ in range(epochs):
            order = list(pairs)
            self.order_rng.shuffle(order)
            out.extend(order[i : i + batch] for i in range(0, len(order), batch))
        return out

    def split(self, pairs: Sequence[IterPair], parts: int) -> list[list[IterPair]]:
        """One shuffled pass over ``pairs`` in ``parts`` consecutive chunks whose sizes
        differ by at most one (the earlier chunks larger; empty ones when
        ``len(pairs) < parts``)."""
        order = list(pairs)
        self.order_rng.shuffle(order)
        base, extra = divmod(len(order), parts)
        out, start = [], 0
        for i in range(parts):
            size = base + (1 if i < extra else 0)
            out.append(order[start : start + size])
            start += size
        return out
