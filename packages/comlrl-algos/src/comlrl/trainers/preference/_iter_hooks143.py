"""CoMLRL 1.4.3's private hooks of ``MADPOIterTrainer``, as thin adapters over ours.

1.4.3's test suite calls them directly: the output folders (replay shards, reward
histograms, policy snapshots) and their precedence, one round's replay shard on disk, the
reward histogram's bins and JSON records, and the pair generation of one prompt against the
comparator. ``MADPOIterTrainer`` reaches them through :class:`MADPOTrainer`; our round loop
(:mod:`comlrl.trainers._iterative`) does not go through them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["IterativeHooks143", "Pair143", "PairTensors", "ReplayShard", "output_path"]

#: bins of 1.4.3's reward histograms over the declared ``reward_range``
REWARD_BINS = 16


@dataclass(frozen=True)
class ReplayShard:
    """One round's preference pairs written to disk (1.4.3's replay shard record)."""

    iteration: int
    path: str
    num_pairs: int


@dataclass(frozen=True)
class PairTensors:
    """One agent's token ids of a preference pair (1.4.3's per-agent pair tensors)."""

    prompt_input_ids: torch.Tensor
    winner_completion_ids: torch.Tensor
    loser_completion_ids: torch.Tensor


@dataclass(frozen=True)
class Pair143:
    """A joint preference pair in 1.4.3's record layout.

    Attributes:
        prompts: ``A`` prompt texts.
        winner_completions, loser_completions: ``A`` completion texts each.
        winner_reward, loser_reward: processed joint rewards that ordered them.
        raw_rewards: ``[winner, loser]`` rewards before ``reward_processor``.
        target_raw_reward, comparator_raw_reward: the raw rewards of the current
            policy's and the comparator's joint action of the pair.
        candidate_reward_mean: mean processed reward of the prompt's candidates.
        agent_tensors: ``A`` :class:`PairTensors`.
    """

    prompts: tuple[str, ...]
    winner_completions: tuple[str, ...]
    loser_completions: tuple[str, ...]
    winner_reward: float
    loser_reward: float
    raw_rewards: list[float]
    target_raw_reward: float
    comparator_raw_reward: float
    candidate_reward_mean: float
    agent_tensors: list[Any] = field(default_factory=list)


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
    as a JSON record: prompts, winner/loser completions and rewards."""
    if isinstance(pair, Pair143):
        won, lost = pair.winner_completions, pair.loser_completions
        rewards = (pair.winner_reward, pair.loser_reward)
    else:
        won, lost = pair.chosen, pair.rejected
        rewards = (pair.chosen_reward, pair.rejected_reward)
    return {
        "prompts": list(pair.prompts),
        "winner_completions": list(won),
        "loser_completions": list(lost),
        "winner_reward": float(rewards[0]),
        "loser_reward": float(rewards[1]),
    }


def _finite(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if math.isfinite(float(v))]


class IterativeHooks143:
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
        return np.linspace(float(span[0]), float(span[1]), REWARD_BINS + 1)

    def _reward_distribution_counts(
        self, rewards: Sequence[float], bin_edges: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Histogram counts of ``rewards`` clipped into the edges' range, and the edges."""
        if len(rewards) == 0:
            return np.zeros(len(bin_edges) - 1, dtype=int), bin_edges
        clipped = np.clip(np.asarray(rewards, dtype=float), bin_edges[0], bin_edges[-1])
        counts, edges = np.histogram(clipped, bins=bin_edges)
        return counts, edges

    def _reward_distribution_json_series(
        self, rewards: Sequence[float], bin_edges: np.ndarray
    ) -> dict[str, Any]:
        """1.4.3's JSON record of one reward series: count, mean, bin counts, raw values
        (non-finite rewards dropped)."""
        values = _finite(rewards)
        counts, _ = self._reward_distribution_counts(values, bin_edges)
        return {
            "sample_count": len(values),
            "mean": float(np.mean(values)) if values else None,
            "counts": [int(c) for c in counts],
            "raw_rewards": values,
        }

    def _record_iteration_reward_distribution(
        self, *, target_rewards: Sequence[float], comparator_rewards: Sequence[float]
    ) -> None:
        """Collect a round's raw rewards for its histogram (when ``log_reward_distribution``)."""
        if not getattr(self.args, "log_reward_distribution", False):
            return
        store = self.__dict__.setdefault(
            "_iteration_reward_distribution", {"target": [], "comparator": []}
        )
        store["target"].extend(_finite(target_rewards))
        store["comparator"].extend(_finite(comparator_rewards))

    @staticmethod
    def _format_axis_tick(value: float) -> str:
        """1.4.3's chart tick label: integers bare, else 1/2/3 decimals for |v| >= 1 /
        >= 0.1 / below."""
        if abs(value - round(value)) < 1e-9:
            return str(int(round(value)))
        digits = 1 if abs(value) >= 1.0 else 2 if abs(value) >= 0.1 else 3
        return f"{value:.{digits}f}"

    # --- one prompt's pairs against the comparator -------------------------------------
    def _generate_policy_outputs_for_item(
        self, agents: Sequence[Any], batch_item: Mapping[str, Any], *, num_candidates: int, **_: Any
    ) -> list[dict[str, Any]]:
        """Per agent, ``num_candidates`` completions of its prompt for ``batch_item``
        (:meth:`_sample_outputs`)."""
        return [
            self._sample_outputs(i, model, [batch_item], num_candidates)  # type: ignore[attr-defined]
            for i, model in enumerate(agents)
        ]

    def _generate_comparator_outputs_for_item(
        self,
        batch_item: Mapping[str, Any],
        *,
        iteration_idx: int = 0,
        num_candidates: int,
        **_: Any,
    ) -> list[dict[str, Any]]:
        """The same from round ``iteration_idx``'s comparator policy."""
        comparator = self._comparator.agents_for(int(iteration_idx))  # type: ignore[attr-defined]
        models = [getattr(agent, "model", agent) for agent in comparator]
        return self._generate_policy_outputs_for_item(
            models, batch_item, num_candidates=num_candidates
        )

    def _compute_raw_and_processed_rewards(
        self,
        prompts: Sequence[str],
        agent_completions: Sequence[Sequence[str]],
        *,
        batch_items: Sequence[Mapping[str, Any]],
    ) -> tuple[list[float], list[float]]:
        """Raw and ``reward_processor``-ed rewards of the aligned joint actions
        ``k = 0..K-1`` (``agent_completions`` is ``[A][K]``), one call per joint action
        as the training reward (:func:`comlrl.utils.reward_utils.call_reward_function`)."""
        from comlrl.utils.reward_utils import call_reward_function

        processor = getattr(getattr(self, "env", None), "reward", None)
        processor = getattr(processor, "processor", None)
        raw = [
            call_reward_function(
                self.reward_func,
                list(prompts),
                [[texts[k]] for texts in agent_completions],
                num_agents=self.num_agents,
                batch_items=list(batch_items),
            )[0]
            for k in range(min(len(texts) for texts in agent_completions))
        ]
        return raw, [float(processor(r)) if processor else r for r in raw]

    def _select_policy_comparison_pairs(
        self, current_rewards: Sequence[float], comparator_rewards: Sequence[float]
    ) -> list[tuple[tuple[str, int], tuple[str, int]]]:
        """``pair_selection`` over current/comparator joint action ``k`` pairs
        (:func:`comlrl.trainers._iterative.select_comparison_pairs`)."""
        import random

        from comlrl.trainers._iterative import select_comparison_pairs

        rng = self.__dict__.setdefault("_pair_rng", random.Random(0))
        return select_comparison_pairs(
            current_rewards,
            comparator_rewards,
            self.args.pair_selection,
            self.args.preference_pairs_per_sample,
            rng,
        )

    def _preference_tensors_from_text(
        self, agent_idx: int, prompt: str, winner: str, loser: str
    ) -> PairTensors:
        """Agent ``agent_idx``'s pair tensors re-tokenized from text (a comparator's
        completion was sampled by other weights, maybe another tokenizer)."""
        tok = self.tokenizers[agent_idx]  # type: ignore[attr-defined]

        def ids(text: str, specials: bool) -> torch.Tensor:
            return torch.tensor(tok(text, add_special_tokens=specials)["input_ids"])

        eos = [] if tok.eos_token_id is None else [int(tok.eos_token_id)]
        return PairTensors(
            ids(prompt, True),
            torch.cat([ids(winner, False), torch.tensor(eos, dtype=torch.long)]),
            torch.cat([ids(loser, False), torch.tensor(eos, dtype=torch.long)]),
        )

    @staticmethod
    def _preference_tensors_from_generation(
        outputs: Mapping[str, Any], winner_idx: int, loser_idx: int
    ) -> PairTensors:
        """One agent's pair tensors from its own sampled ids (both current completions)."""
        sampled = outputs["completion_input_ids"][0]
        return PairTensors(
            outputs["prompt_input_ids"][0].clone(),
            sampled[winner_idx].clone(),
            sampled[loser_idx].clone(),
        )

    def _generate_preference_pairs_for_item(
        self, batch_item: Mapping[str, Any], **kwargs: Any
    ) -> list[Pair143]:
        """1.4.3's MADPOIter pairs of one prompt: ``preference_num_candidates`` current and
        ``comparator_num_candidates`` comparator joint actions (aligned), scored raw and
        processed; the raw rewards go to the histogram, the processed ones order the
        pairs (:meth:`_select_policy_comparison_pairs`).

        Raises:
            ValueError: ``joint_mode`` other than aligned.
        """
        r = int(kwargs.pop("iteration_idx", 0))
        a = self.args
        k = int(a.preference_num_candidates)
        if str(a.joint_mode).lower() not in ("align", "aligned"):
            raise ValueError(f"MADPOIter pairs need joint_mode='aligned', got {a.joint_mode!r}")
        outputs = {
            "current": self._generate_policy_outputs_for_item(
                self.agents,
                batch_item,
                num_candidates=k,
                **kwargs,  # type: ignore[attr-defined]
            ),
            "comparator": self._generate_comparator_outputs_for_item(
                batch_item,
                iteration_idx=r,
                num_candidates=int(a.comparator_num_candidates or k),
                **kwargs,
            ),
        }
        texts = {
            s: [o[i]["completions"][0] for i in range(self.num_agents)] for s, o in outputs.items()
        }
        prompts = [outputs["current"][i]["prompts"][0] for i in range(self.num_agents)]
        raw, processed = {}, {}
        for source in ("current", "comparator"):
            raw[source], processed[source] = self._compute_raw_and_processed_rewards(
                [prompts[0]], texts[source], batch_items=[batch_item]
            )
        self._record_iteration_reward_distribution(
            target_rewards=raw["current"], comparator_rewards=raw["comparator"]
        )
        everything = list(processed["current"]) + list(processed["comparator"])
        mean = float(np.mean(everything)) if everything else 0.0
        pairs = []
        for (ws, wi), (ls, li) in self._select_policy_comparison_pairs(
            processed["current"], processed["comparator"]
        ):
            if ws == ls == "current":
                tensors = [
                    self._preference_tensors_from_generation(outputs["current"][i], wi, li)
                    for i in range(self.num_agents)
                ]
            else:
                tensors = [
                    self._preference_tensors_from_text(
                        i, prompts[i], texts[ws][i][wi], texts[ls][i][li]
                    )
                    for i in range(self.num_agents)
                ]
            target = wi if ws == "current" else li
            other = wi if ws == "comparator" else li
            pairs.append(
                Pair143(
                    prompts=tuple(prompts),
                    winner_completions=tuple(texts[ws][i][wi] for i in range(self.num_agents)),
                    loser_completions=tuple(texts[ls][i][li] for i in range(self.num_agents)),
                    winner_reward=float(processed[ws][wi]),
                    loser_reward=float(processed[ls][li]),
                    raw_rewards=[float(raw[ws][wi]), float(raw[ls][li])],
                    target_raw_reward=float(raw["current"][target]),
                    comparator_raw_reward=float(raw["comparator"][other]),
                    candidate_reward_mean=mean,
                    agent_tensors=tensors,
                )
            )
        return pairs
