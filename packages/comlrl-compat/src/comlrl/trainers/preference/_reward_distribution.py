"""CoMLRL 1.4.3's ``log_reward_distribution=True`` for the iterative preference trainers:
each round's reward histograms, as a JSON file and as W&B charts.

A round's *candidate* rewards are those of every joint action the current agents
("target") and the comparator sampled; its *selected* rewards are those of the round's
training pairs (after replay), by the side each completion came from. Both are binned into
:data:`REWARD_BINS` bins over the reward function's declared ``reward_range`` (values
outside are clipped into the end bins; NaN/inf are dropped). :class:`RewardDistributionLog`
collects them (:meth:`~RewardDistributionLog.observe`, given to
:class:`~comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds` as its ``observe``) and,
once the round's training pairs are chosen (:class:`ChartedRounds`), writes
``reward_distributions/iteration_XXXX.json`` (1.4.3's payload) and returns the W&B
metrics (counts, means, and line and bar charts: :mod:`._reward_chart`).

Unlike 1.4.3, the rewards are those that ordered the pairs, i.e. after
``reward_processor`` (1.4.3 charts the raw reward); without a processor they are the same.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from comlrl.algos.recipes.preference.iterative.rounds import IterativeRounds
from comlrl.algos.records import Rollout

__all__ = [
    "REWARD_BINS",
    "ChartedRounds",
    "RewardDistributionLog",
    "bin_edges",
    "distribution_log",
    "finite",
    "histogram",
    "json_series",
]

#: bins of 1.4.3's reward histograms over the declared ``reward_range``
REWARD_BINS = 16


def finite(values: Sequence[Any]) -> list[float]:
    """``values`` as floats, NaN and infinities dropped."""
    return [float(v) for v in values if math.isfinite(float(v))]


def bin_edges(low: float, high: float) -> np.ndarray:
    """``REWARD_BINS + 1`` evenly spaced edges from ``low`` to ``high`` (float64)."""
    return np.linspace(float(low), float(high), REWARD_BINS + 1)


def histogram(rewards: Sequence[float], edges: np.ndarray) -> np.ndarray:
    """Counts (int, ``[B]``) of ``rewards`` clipped into ``[edges[0], edges[-1]]``."""
    if len(rewards) == 0:
        return np.zeros(len(edges) - 1, dtype=int)
    clipped = np.clip(np.asarray(rewards, dtype=float), edges[0], edges[-1])
    return np.histogram(clipped, bins=edges)[0]


def json_series(rewards: Sequence[float], edges: np.ndarray) -> dict[str, Any]:
    """1.4.3's JSON record of one reward series: ``sample_count``, ``mean`` (None when
    empty), bin ``counts`` and the ``raw_rewards`` (finite values only)."""
    values = finite(rewards)
    return {
        "sample_count": len(values),
        "mean": float(np.mean(values)) if values else None,
        "counts": [int(c) for c in histogram(values, edges)],
        "raw_rewards": values,
    }


def _selected(pairs: Sequence[Any]) -> tuple[list[float], list[float]]:
    """The (target, comparator) rewards of training pairs (our ``IterPair``: each side's
    reward by the policy that sampled it)."""
    sides: dict[str, list[float]] = {"current": [], "comparator": []}
    for pair in pairs:
        sides[pair.chosen_source].append(float(pair.chosen_reward))
        sides[pair.rejected_source].append(float(pair.rejected_reward))
    return finite(sides["current"]), finite(sides["comparator"])


class RewardDistributionLog:
    """One run's reward histograms (see the module docstring).

    Args:
        reward_range: the raw reward's ``(minimum, maximum)`` (the bins' span).
        directory: returns the folder of the JSON files (created on first use).
        image: draws one chart, ``image(title=, edges=, series=, kind=)`` (None: none).
    """

    def __init__(
        self,
        reward_range: tuple[float, float],
        directory: Callable[[], str],
        image: Callable[..., Any],
    ) -> None:
        self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        self.edges = bin_edges(*reward_range)
        self.directory = directory
        self.image = image
        self.candidates: dict[str, list[float]] = {"target": [], "comparator": []}

    def observe(self, round_index: int, current: Rollout, comparator: Rollout) -> None:
        """Add one batch's candidate rewards (every sampled joint action of each side)."""
        self.candidates["target"] += finite(current.turns[0].rewards.flatten().tolist())
        self.candidates["comparator"] += finite(comparator.turns[0].rewards.flatten().tolist())

    def finish(self, round_index: int, train_pairs: Sequence[Any]) -> dict[str, Any]:
        """Write round ``round_index``'s JSON file and return its W&B metrics (nothing
        when the round had no rewards at all); the candidates start afresh."""
        target, comparator = self.candidates["target"], self.candidates["comparator"]
        self.candidates = {"target": [], "comparator": []}
        chosen = _selected(train_pairs)
        if not (target or comparator or chosen[0] or chosen[1]):
            return {}
        iteration = int(round_index) + 1
        edges = self.edges
        payload = {
            "iteration": iteration,
            "reward_min": float(edges[0]),
            "reward_max": float(edges[-1]),
            "num_bins": REWARD_BINS,
            "bin_edges": [float(e) for e in edges],
            "bin_centers": [float(c) for c in (edges[:-1] + edges[1:]) / 2.0],
            "candidate": {"target": json_series(target, edges),
                          "comparator": json_series(comparator, edges)},
            "selected": {"target": json_series(chosen[0], edges),
                         "comparator": json_series(chosen[1], edges)},
        }  # fmt: skip
        path = os.path.join(self.directory(), f"iteration_{iteration:04d}.json")
        with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
            json.dump(payload, handle, ensure_ascii=False, indent=2)
        os.replace(f"{path}.tmp", path)
        metrics = self.metrics(
            "iter/reward_distribution", "Candidate Reward Distribution", iteration,
            target, comparator,
        )  # fmt: skip
        if train_pairs:
            metrics.update(
                self.metrics(
                    "iter/selected_reward_distribution",
                    "Selected Preference Reward Distribution",
                    iteration,
                    *chosen,
                    pair_count=len(train_pairs),
                )  # fmt: skip
            )
        return metrics

    def metrics(
        self,
        namespace: str,
        title: str,
        iteration: int,
        target: Sequence[float],
        comparator: Sequence[float],
        pair_count: int | None = None,
    ) -> dict[str, Any]:
        """1.4.3's W&B keys of one histogram under ``namespace``: ``current_iteration``,
        ``pair_count`` (selected pairs), sample counts, means, and the
        ``iteration_XXXX/line_plot`` and ``bar_plot`` charts."""
        if not target and not comparator:
            return {}
        out: dict[str, Any] = {f"{namespace}/current_iteration": float(iteration)}
        if pair_count is not None:
            out[f"{namespace}/pair_count"] = float(pair_count)
        out[f"{namespace}/target_sample_count"] = float(len(target))
        out[f"{namespace}/comparator_sample_count"] = float(len(comparator))
        series = [
            ("target", histogram(target, self.edges)),
            ("comparator", histogram(comparator, self.edges)),
        ]
        for kind in ("line", "bar"):
            chart = self.image(title=title, edges=self.edges, series=series, kind=kind)
            if chart is not None:
                out[f"{namespace}/iteration_{iteration:04d}/{kind}_plot"] = chart
        for name, values in (("target", target), ("comparator", comparator)):
            if values:
                out[f"{namespace}/{name}_mean"] = float(np.mean(values))
        return out


class ChartedRounds(IterativeRounds):
    """:class:`~comlrl.algos.recipes.preference.iterative.rounds.IterativeRounds` whose round row
    also carries :meth:`RewardDistributionLog.finish`'s metrics (1.4.3 logs them with the
    round's ``iter/*`` numbers); :attr:`history` keeps the numeric row only."""

    def __init__(self, *args: Any, distribution: RewardDistributionLog, **kwargs: Any) -> None:
        super().__init__(*args, observe=distribution.observe, **kwargs)
        self.distribution = distribution

    def begin(
        self, round_index: int, *args: Any, **kwargs: Any
    ) -> tuple[list[Any], dict[str, Any]]:
        train_pairs, row = super().begin(round_index, *args, **kwargs)
        return train_pairs, {**row, **self.distribution.finish(round_index, train_pairs)}


def distribution_log(
    args: Any, reward_func: Any, wandb_config: Any
) -> RewardDistributionLog | None:
    """1.4.3's ``log_reward_distribution=True`` for an iterative config ``args``: a
    :class:`RewardDistributionLog` over ``reward_func.reward_range`` writing to
    ``<base>/reward_distributions`` (:func:`~._iter_hooks143.output_path`'s precedence,
    fixed at construction), charts as ``iterative.wandb.Html``; None when the option is off.

    Raises:
        ValueError: the reward function declares no ``reward_range`` (as 1.4.3, when the
            trainer is built).
    """
    from comlrl.trainers.preference._iter_hooks143 import IterativeHooks143, output_path
    from comlrl.utils.reward_utils import resolve_reward_range

    if not args.log_reward_distribution:
        return None
    span = resolve_reward_range(reward_func)
    if span is None:
        raise ValueError(
            "log_reward_distribution=True requires reward_func.reward_range (the raw reward's "
            "(minimum, maximum)); declare it with comlrl.utils.set_reward_range(reward_func, "
            "low, high)."
        )
    folder = output_path("reward_distributions", None, wandb_config)

    def directory() -> str:
        os.makedirs(folder, exist_ok=True)
        return folder

    return RewardDistributionLog(span, directory, IterativeHooks143._reward_distribution_image)
