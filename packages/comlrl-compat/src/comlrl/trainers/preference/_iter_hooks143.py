"""CoMLRL 1.4.3's private hooks of ``MADPOIterTrainer``, as thin adapters over ours.

1.4.3's test suite calls them directly: the output folders (replay shards, reward
histograms, policy snapshots) and their precedence, one round's replay shard on disk, and
the reward histogram's bins and JSON records (the pair generation of one prompt against the
comparator: :mod:`comlrl.trainers.preference._iter_pairs143`). They are among ``MADPOIterTrainer``'s bases; our round loop
(:mod:`comlrl.trainers._iterative`) does not go through them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from comlrl.trainers.preference._iter_pairs143 import IterativePairHooks143, Pair143
from comlrl.trainers.preference._reward_chart import reward_chart_svg, tick_label
from comlrl.trainers.preference._reward_distribution import (
    bin_edges,
    finite,
    histogram,
    json_series,
)

__all__ = ["IterativeHooks143", "ReplayShard", "output_path"]


@dataclass(frozen=True)
class ReplayShard:
    """One round's preference pairs written to disk (1.4.3's replay shard record)."""

    iteration: int
    path: str
    num_pairs: int


def output_path(directory: str, configured: Any, wandb_config: Any) -> str:
    """Absolute folder ``directory`` goes to, by CoMLRL 1.4.3's precedence: the
    ``configured`` path itself; else ``<base>/<directory>`` with ``base`` the first
    non-empty of ``wandb_config["output_dir"]``,
    ``wandb_config["config_sections"]["output"]["base_dir"]`` and ``wandb_config["dir"]``;
    else ``<cwd>/<directory>``. ``~`` is not expanded (as 1.4.3)."""
    if configured:
        return os.path.abspath(str(configured))
    base: Any = None
    if isinstance(wandb_config, Mapping):
        sections = wandb_config.get("config_sections")
        output = sections.get("output") if isinstance(sections, Mapping) else None
        section_base = output.get("base_dir") if isinstance(output, Mapping) else None
        base = wandb_config.get("output_dir") or section_base or wandb_config.get("dir")
    return os.path.abspath(os.path.join(str(base) if base else os.getcwd(), directory))


def _pair_record(pair: Any) -> dict[str, Any]:
    """A pair (our :class:`~comlrl.trainers._iterative.IterPair` or a :class:`Pair143`)
    as 1.4.3's JSON record: prompts, winner/loser completions and rewards (a
    :class:`Pair143` also its raw rewards and candidate mean)."""
    if not isinstance(pair, Pair143):
        return {
            "prompts": list(pair.prompts),
            "winner_completions": list(pair.chosen),
            "loser_completions": list(pair.rejected),
            "winner_reward": float(pair.chosen_reward),
            "loser_reward": float(pair.rejected_reward),
        }
    return {
        "prompts": list(pair.prompts),
        "winner_completions": list(pair.winner_completions),
        "loser_completions": list(pair.loser_completions),
        "winner_reward": float(pair.winner_reward),
        "loser_reward": float(pair.loser_reward),
        "candidate_reward_mean": float(pair.candidate_reward_mean),
        "raw_rewards": [float(r) for r in pair.raw_rewards],
        "target_raw_reward": float(pair.target_raw_reward),
        "comparator_raw_reward": float(pair.comparator_raw_reward),
    }


class IterativeHooks143(IterativePairHooks143):
    """1.4.3's private ``MADPOIterTrainer`` methods (see the module docstring)."""

    args: Any
    wandb_config: Any
    reward_func: Any
    num_agents: int

    # --- output folders (1.4.3's iterative trainers) -----------------------------------
    def _resolve_output_dir(
        self, directory: str, *, cache_attribute: str, config_attribute: str | None = None
    ) -> str:
        """1.4.3's output folder: cached on ``cache_attribute`` after the first call (which
        creates it); see :func:`output_path` for the precedence."""
        cached = getattr(self, cache_attribute, None)
        if cached:
            return str(cached)
        configured = getattr(self.args, config_attribute, None) if config_attribute else None
        path = output_path(directory, configured, getattr(self, "wandb_config", None))
        os.makedirs(path, exist_ok=True)
        setattr(self, cache_attribute, path)
        return path

    def _preference_replay_dir(self) -> str:
        """1.4.3's replay-shard folder (``preference_replay_dir`` or ``<base>/preference_replay``)."""
        return self._resolve_output_dir(
            "preference_replay",
            cache_attribute="_preference_replay_dir_path",
            config_attribute="preference_replay_dir",
        )

    def _reward_distribution_dir(self) -> str:
        """1.4.3's reward-histogram folder (``<base>/reward_distributions``)."""
        return self._resolve_output_dir(
            "reward_distributions", cache_attribute="_reward_distribution_dir_path"
        )

    def _policy_checkpoint_dir(self) -> str:
        """1.4.3's policy-snapshot folder (``policy_checkpoint_dir`` or
        ``<base>/policy_checkpoints``)."""
        return self._resolve_output_dir(
            "policy_checkpoints",
            cache_attribute="_policy_checkpoint_dir_path",
            config_attribute="policy_checkpoint_dir",
        )

    def _write_iteration_preference_pairs(
        self, iteration_idx: int, pairs: Sequence[Any]
    ) -> ReplayShard | None:
        """1.4.3's replay shard: ``iteration_XXXX.json`` (1-based) in
        :meth:`_preference_replay_dir` with the round's pairs (``prompts``, chosen and
        rejected completions and rewards); ``None`` when there are no pairs."""
        iteration = int(iteration_idx) + 1
        path = os.path.join(self._preference_replay_dir(), f"iteration_{iteration:04d}.json")
        records = [_pair_record(p) for p in pairs]
        payload = {"iteration": iteration, "num_pairs": len(records), "pairs": records}
        with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
            json.dump(payload, handle, ensure_ascii=False)
        os.replace(f"{path}.tmp", path)
        return ReplayShard(iteration, path, len(records)) if records else None

    def _load_replay_shard(self, shard: ReplayShard | None) -> list[Pair143]:
        """1.4.3's pairs of a shard :meth:`_write_iteration_preference_pairs` wrote, each
        agent's tensors re-tokenized from the text (``[]`` for ``None``).

        Raises:
            ValueError: a record without ``A`` prompts and completions on each side.
        """
        if shard is None:
            return []
        with open(shard.path, encoding="utf-8") as handle:
            payload = json.load(handle)
        records = payload.get("pairs", []) if isinstance(payload, dict) else payload
        pairs = []
        for record in records:
            texts = [
                list(record[k]) for k in ("prompts", "winner_completions", "loser_completions")
            ]
            if any(len(t) != int(self.num_agents) for t in texts):
                raise ValueError(
                    f"replay record in {shard.path} holds {[len(t) for t in texts]} prompts/"
                    f"winners/losers for {self.num_agents} agents: {record!r}"
                )
            prompts, won, lost = texts
            raw = [float(r) for r in record.get("raw_rewards") or []]
            pairs.append(
                Pair143(
                    prompts=prompts,
                    winner_completions=won,
                    loser_completions=lost,
                    winner_reward=float(record.get("winner_reward", 0.0)),
                    loser_reward=float(record.get("loser_reward", 0.0)),
                    raw_rewards=raw,
                    target_raw_reward=float(record.get("target_raw_reward") or 0.0),
                    comparator_raw_reward=float(record.get("comparator_raw_reward") or 0.0),
                    candidate_reward_mean=float(record.get("candidate_reward_mean", 0.0)),
                    agent_tensors=[
                        self._preference_tensors_from_text(i, prompts[i], won[i], lost[i])
                        for i in range(int(self.num_agents))
                    ],
                )
            )
        return pairs

    # --- policy snapshots (1.4.3's ``policy_checkpoint_dir``) -------------------------
    def _save_policy_checkpoint(self, label: str) -> str:
        """Every agent's model and tokenizer in ``<policy dir>/<label>/agent_<i>``
        (Hugging Face format); returns ``<policy dir>/<label>``."""
        from comlrl.algos.training.saving import save_agent_checkpoint

        root = os.path.join(self._policy_checkpoint_dir(), str(label))
        for i, agent in enumerate(self._policy_agents()):  # type: ignore[attr-defined]
            save_agent_checkpoint(agent, os.path.join(root, f"agent_{i}"))
        return root

    def _save_initial_policy_checkpoint(self) -> str:
        """The policy before training, saved once as ``initial``."""
        if not getattr(self, "_initial_policy_checkpoint_saved", False):
            self._save_policy_checkpoint("initial")
            self._initial_policy_checkpoint_saved = True
        return os.path.join(self._policy_checkpoint_dir(), "initial")

    def _policy_checkpoints_enabled(self) -> bool:
        return bool(getattr(self.args, "policy_checkpoint_dir", None)) or (
            getattr(self.args, "comparator_policy", None) == "history"
        )

    def _maybe_save_initial_policy_checkpoint(self) -> str | None:
        """:meth:`_save_initial_policy_checkpoint` when snapshots are on (a
        ``policy_checkpoint_dir`` or the history comparator), else None."""
        return (
            self._save_initial_policy_checkpoint() if self._policy_checkpoints_enabled() else None
        )

    def _maybe_save_iteration_policy_checkpoint(self, iteration_idx: int) -> str | None:
        """The policy after round ``iteration_idx`` as ``iteration_XXXX`` (0-based) when
        snapshots are on, else None."""
        if not self._policy_checkpoints_enabled():
            return None
        return self._save_policy_checkpoint(f"iteration_{int(iteration_idx):04d}")

    def _load_single_policy_checkpoint_agent(self, checkpoint_dir: str, agent_idx: int) -> Any:
        """Agent ``agent_idx``'s saved model from ``checkpoint_dir/agent_<i>``, frozen
        (eval mode, no gradients) on that agent's device.

        Raises:
            ValueError: the folder is missing.
        """
        from comlrl.trainers._loading import _model_kwargs
        from transformers import AutoModelForCausalLM

        source = os.path.join(str(checkpoint_dir), f"agent_{int(agent_idx)}")
        if not os.path.isdir(source):
            raise ValueError(f"no saved policy for agent {agent_idx}: {source} is not a folder")
        kwargs = _model_kwargs(dict(getattr(self, "model_config", None) or {}))
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        device = next(self.agents[int(agent_idx)].parameters()).device  # type: ignore[attr-defined]
        return model.to(device).eval().requires_grad_(False)

    # --- reward histograms (1.4.3's ``log_reward_distribution``) ---------------------
    def _reward_distribution_bin_edges(self) -> np.ndarray:
        """``REWARD_BINS + 1`` edges over ``reward_func.reward_range`` (cached).

        Raises:
            ValueError: the reward function declares no ``reward_range``.
        """
        from comlrl.utils.reward_utils import resolve_reward_range

        span = getattr(self, "_reward_distribution_range", None)
        if span is None:
            span = resolve_reward_range(self.reward_func)
            if span is None:
                raise ValueError(
                    "log_reward_distribution=True requires reward_func.reward_range (the raw "
                    "reward's (minimum, maximum)); declare it with "
                    "comlrl.utils.set_reward_range(reward_func, low, high)."
                )
            self._reward_distribution_range = span
        return bin_edges(*span)

    def _reward_distribution_counts(
        self, rewards: Sequence[float], bin_edges: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Histogram counts of ``rewards`` clipped into the edges' range, and the edges
        (:func:`~comlrl.trainers.preference._reward_distribution.histogram`)."""
        return histogram(rewards, bin_edges), bin_edges

    def _reward_distribution_json_series(
        self, rewards: Sequence[float], bin_edges: np.ndarray
    ) -> dict[str, Any]:
        """1.4.3's JSON record of one reward series
        (:func:`~comlrl.trainers.preference._reward_distribution.json_series`)."""
        return json_series(rewards, bin_edges)

    def _record_iteration_reward_distribution(
        self, *, target_rewards: Sequence[float], comparator_rewards: Sequence[float]
    ) -> None:
        """Collect a round's raw rewards for its histogram (when ``log_reward_distribution``)."""
        if not getattr(self.args, "log_reward_distribution", False):
            return
        store = self.__dict__.setdefault(
            "_iteration_reward_distribution", {"target": [], "comparator": []}
        )
        store["target"].extend(finite(target_rewards))
        store["comparator"].extend(finite(comparator_rewards))

    @staticmethod
    def _reward_distribution_image(
        *, title: str, edges: np.ndarray, series: Sequence[tuple[str, np.ndarray]], kind: str
    ) -> Any:
        """1.4.3's W&B reward chart: :func:`~comlrl.trainers.preference._reward_chart.reward_chart_svg`
        wrapped in ``iterative.wandb.Html`` (1.4.3's module attribute); None when there is
        nothing to draw or wandb is not installed."""
        from comlrl.trainers.preference import iterative

        svg = reward_chart_svg(title=title, edges=edges, series=series, kind=kind)
        wandb = iterative.wandb
        return None if svg is None or wandb is None else wandb.Html(svg)

    @staticmethod
    def _format_axis_tick(value: float) -> str:
        """1.4.3's chart tick label (:func:`~comlrl.trainers.preference._reward_chart.tick_label`)."""
        return tick_label(value)
