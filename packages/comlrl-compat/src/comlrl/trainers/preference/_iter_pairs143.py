"""CoMLRL 1.4.3's ``MADPOIterTrainer._generate_preference_pairs_for_item`` and the hooks it
calls, as thin adapters over ours: one prompt's current and comparator joint actions
(:meth:`~comlrl.trainers.preference._hooks143.PreferenceHooks143._sample_outputs`), their
raw and processed rewards (:func:`comlrl.utils.reward_utils.call_reward_function`), the
pairs chosen by :func:`comlrl.trainers._iterative.select_comparison_pairs`, as 1.4.3's pair
records (:class:`Pair143`). Our round loop (:mod:`comlrl.trainers._iterative`) does not go
through them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["IterativePairHooks143", "Pair143", "PairTensors"]


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

    prompts: list[str]
    winner_completions: list[str]
    loser_completions: list[str]
    winner_reward: float
    loser_reward: float
    raw_rewards: list[float]
    target_raw_reward: float
    comparator_raw_reward: float
    candidate_reward_mean: float
    agent_tensors: list[Any] = field(default_factory=list)


class IterativePairHooks143:
    """1.4.3's per-prompt pair generation of ``MADPOIterTrainer`` (see the module docstring)."""

    args: Any
    reward_func: Any
    num_agents: int

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
        """The same from round ``iteration_idx``'s comparator policy: the current agents
        for ``comparator_policy="current"``, else the comparator's agents
        (``self.rounds.comparator``, a
        :class:`comlrl.algos.recipes.preference.iterative.comparator.Comparator`);
        ``comparator_generation_mode="centralized"`` goes to
        :meth:`_generate_centralized_comparator_outputs_for_item`."""
        a = self.args
        if str(getattr(a, "comparator_generation_mode", "decentralized")) == "centralized":
            return self._generate_centralized_comparator_outputs_for_item(
                batch_item, iteration_idx=iteration_idx, num_candidates=num_candidates
            )
        if str(a.comparator_policy) == "api":  # each agent's prompt to the API
            outputs = []
            for i in range(int(self.num_agents)):
                prompt = self.formatters[i](dict(batch_item))  # type: ignore[attr-defined]
                texts = self._call_comparator_api(
                    prompt=prompt, agent_idx=i, batch_item=batch_item, num_candidates=num_candidates
                )
                outputs.append(
                    {"prompts": [prompt], "batch_items": [batch_item], "completions": [texts]}
                )
            return outputs
        return self._generate_policy_outputs_for_item(
            self._comparator_models(iteration_idx), batch_item, num_candidates=num_candidates
        )

    def _call_comparator_api(
        self,
        *,
        prompt: str,
        agent_idx: int,
        batch_item: Mapping[str, Any],
        num_candidates: int,
    ) -> list[str]:
        """``num_candidates`` completions of ``prompt`` from the HTTP comparator
        (``comparator_api_*``; :class:`comlrl.algos.recipes.preference.iterative.api_comparator.ApiComparatorClient`),
        sampled with the trainer's ``max_new_tokens`` / ``temperature`` / ``top_p`` /
        ``top_k``.

        Raises:
            ApiComparatorError: the request failed or returned no completion.
        """
        from comlrl.algos.recipes.preference.iterative.api_comparator import ApiComparatorClient
        from comlrl.core import SamplingParams
        from comlrl.trainers._iterative import api_config

        client = self.__dict__.get("_api_client")
        if client is None:
            client = self.__dict__["_api_client"] = ApiComparatorClient(api_config(self.args))
        params = SamplingParams.from_config(self.args, int(num_candidates))
        return client.complete(
            prompt, int(num_candidates), params, agent_idx=int(agent_idx), example=batch_item
        )

    def _comparator_models(self, iteration_idx: int) -> list[Any]:
        """Round ``iteration_idx``'s comparator models: the current agents for
        ``comparator_policy="current"``, else the comparator's (``self.rounds.comparator``,
        a :class:`comlrl.algos.recipes.preference.iterative.comparator.Comparator`)."""
        if str(getattr(self.args, "comparator_policy", "current")) == "current":
            return list(self.agents)  # type: ignore[attr-defined]
        comparator = self.rounds.comparator.agents_for(int(iteration_idx))  # type: ignore[attr-defined]
        return [getattr(agent, "model", agent) for agent in comparator]

    def _generate_centralized_comparator_outputs_for_item(
        self,
        batch_item: Mapping[str, Any],
        *,
        iteration_idx: int = 0,
        num_candidates: int,
        **_: Any,
    ) -> list[dict[str, Any]]:
        """1.4.3's centralized comparator of the one joint actor
        (``collaboration_mode="centralized"``): ``num_candidates`` joint responses to the
        joint prompt from round ``iteration_idx``'s comparator model (or the HTTP
        comparator, ``_call_comparator_api``), kept as joint text: one output
        (``prompts``, ``batch_items``, ``completions`` as ``[1][K]``).

        Raises:
            UnsupportedFieldError: decentralized agents (a comparator that writes every
                role's text for agents that each write one is not built here).
        """
        from comlrl.trainers._fields import UnsupportedFieldError

        collaboration = getattr(self, "centralized_collaboration", None)
        if collaboration is None:
            raise UnsupportedFieldError(
                "comparator_generation_mode='centralized' with decentralized agents is not "
                "supported by comlrl.trainers; set comparator_generation_mode='decentralized'."
            )
        prompt = collaboration.build_prompt(dict(batch_item))
        if str(self.args.comparator_policy) == "api":
            texts = self._call_comparator_api(  # type: ignore[attr-defined]
                prompt=prompt, agent_idx=0, batch_item=batch_item, num_candidates=num_candidates
            )
        else:
            out = self._generate_completions(  # type: ignore[attr-defined]
                self._comparator_models(iteration_idx)[0],
                [batch_item],
                agent_idx=0,
                num_return_sequences=num_candidates,
                max_new_tokens=self.args.max_new_tokens,
                prompts_override=[prompt],
            )
            texts = out["completions"][0]
        return self._split_centralized_comparator_outputs(
            texts, batch_item=batch_item, prompt=prompt
        )

    def _split_centralized_comparator_outputs(
        self, completions: Sequence[str], *, batch_item: Mapping[str, Any], prompt: str
    ) -> list[dict[str, Any]]:
        """1.4.3's split of a centralized comparator's joint completions into one output
        per agent (``prompts``, ``batch_items``, ``completions`` as ``[1][K]``) with
        ``centralized_comparator_adapter.parse_completion``; a centralized trainer's one
        joint actor keeps the joint text whole (one output).

        Raises:
            ValueError: no completions, or a parse that does not give ``A`` outputs.
            TypeError: a parse that is one string or holds a non-string.
        """
        if not completions:
            raise ValueError("the centralized comparator produced no candidates")
        if getattr(self, "centralized_collaboration", None) is not None:
            whole = [str(text) for text in completions]
            return [{"prompts": [prompt], "batch_items": [batch_item], "completions": [whole]}]
        adapter = self.centralized_comparator_adapter  # type: ignore[attr-defined]
        per_agent: list[list[str]] = [[] for _ in range(int(self.num_agents))]
        for text in completions:
            parsed = adapter.parse_completion(str(text), batch_item, int(self.num_agents))
            if isinstance(parsed, (str, bytes)):
                raise TypeError(
                    "centralized_comparator_adapter.parse_completion must return a sequence "
                    f"of strings, not one string: {parsed!r}"
                )
            parsed = list(parsed)
            if len(parsed) != int(self.num_agents):
                raise ValueError(
                    "centralized_comparator_adapter.parse_completion must return exactly "
                    f"{self.num_agents} outputs; got {len(parsed)}: {parsed!r}"
                )
            if not all(isinstance(p, str) for p in parsed):
                raise TypeError(f"parse_completion outputs must all be strings: {parsed!r}")
            for agent, output in enumerate(parsed):
                per_agent[agent].append(output)
        return [
            {"prompts": [prompt], "batch_items": [batch_item], "completions": [texts]}
            for texts in per_agent
        ]

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
        collaboration = getattr(self, "centralized_collaboration", None)
        if collaboration is not None:  # one joint actor: its joint texts' task reward
            processor = getattr(self, "reward_processor", None)
            raw = collaboration(list(agent_completions[0]), batch_items=list(batch_items))
            return raw, [float(processor(r)) if processor else r for r in raw]
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
                self.agents,  # type: ignore[attr-defined]
                batch_item,
                num_candidates=k,
                **kwargs,
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
        self._record_iteration_reward_distribution(  # type: ignore[attr-defined]
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
                    prompts=list(prompts),
                    winner_completions=[texts[ws][i][wi] for i in range(self.num_agents)],
                    loser_completions=[texts[ls][i][li] for i in range(self.num_agents)],
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

    def _build_preference_dataset(self, **kwargs: Any) -> list[Pair143]:
        """1.4.3's pairs of one round on every training example, in order
        (:meth:`_generate_preference_pairs_for_item`; ``iteration_idx`` picks the round's
        comparator)."""
        pairs: list[Pair143] = []
        for item in self._train_rows:  # type: ignore[attr-defined]
            pairs.extend(self._generate_preference_pairs_for_item(item, **kwargs))
        return pairs
