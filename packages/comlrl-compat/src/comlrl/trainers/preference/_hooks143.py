"""CoMLRL 1.4.3's private hooks of its preference trainers, as thin adapters over ours.

CoMLRL 1.4.3's own test suite (run by ``nox -s compat``) calls private methods of
``MADPOTrainer`` / ``MADPOIterTrainer`` directly: sequence log-probs, one preference
update, the iterative trainers' output folders, replay shards and reward histograms. Each
method here reproduces the 1.4.3 behaviour its docstring names on top of our own pieces
(:func:`comlrl.algos.recipes.preference.encoding.sequence_logprobs`,
:class:`comlrl.algos.rollout.agent.HFAgent`, :func:`comlrl.utils.reward_utils.resolve_reward_range`).
The training loops do not go through them; they exist for scripts and tests written
against 1.4.3's internals. The iterative trainers' hooks are in
:mod:`comlrl.trainers.preference._iter_hooks143`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["PreferenceHooks143"]


class PreferenceHooks143:
    """1.4.3's private ``MADPOTrainer`` methods (see the module docstring)."""

    args: Any
    num_agents: int
    tokenizers: list[Any]
    formatters: list[Any]

    # --- log-probs and one update (1.4.3's MADPOTrainer) ------------------------------
    def _agent_index(self, agent: Any) -> int:
        for i, model in enumerate(self.agents):  # type: ignore[attr-defined]
            if model is agent:
                return i
        raise ValueError(f"{type(agent).__name__} object is not one of this trainer's agents")

    def _generate_completions(
        self,
        agent: Any,
        batch_items: Sequence[Mapping[str, Any]],
        num_return_sequences: int = 1,
        max_new_tokens: int | None = None,
        *,
        agent_idx: int | None = None,
        prompts_override: Sequence[str] | None = None,
        **_ignored: Any,
    ) -> dict[str, Any]:
        """1.4.3's sampling of one agent: its formatter's prompt per item (or
        ``prompts_override``, one per item), ``num_return_sequences`` completions each,
        through our :class:`~comlrl.algos.rollout.agent.HFAgent` sampler under
        ``torch.inference_mode`` (as 1.4.3's ``generate``). ``agent`` is one of
        :attr:`agents`, or any model (a comparator) when ``agent_idx`` names whose
        tokenizer and formatter it uses. ``min_new_tokens`` and other ``generate``
        options are accepted and ignored (our sampler stops at EOS).

        Returns:
            ``prompts``, ``batch_items``, ``completions`` (``[item][G]`` texts),
            ``prompt_input_ids`` (a tensor per item) and ``completion_input_ids``
            (``[item][G]`` tensors, through the EOS when one was sampled).

        Raises:
            ValueError: no ``agent_idx`` and ``agent`` is not one of the trainer's agents,
                or ``prompts_override`` does not give one prompt per item.
        """
        idx = self._agent_index(agent) if agent_idx is None else int(agent_idx)
        return self._sample_outputs(
            idx, agent, batch_items, num_return_sequences, max_new_tokens, prompts_override
        )

    def _sample_outputs(
        self,
        idx: int,
        model: Any,
        batch_items: Sequence[Mapping[str, Any]],
        num: int,
        max_new_tokens: int | None = None,
        prompts_override: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        from comlrl.algos.rollout.agent import HFAgent
        from comlrl.core import SamplingParams

        a = self.args
        if prompts_override is None:
            prompts = [self.formatters[idx](dict(item)) for item in batch_items]
        elif len(prompts_override) == len(batch_items):
            prompts = [str(p) for p in prompts_override]
        else:
            raise ValueError(
                f"prompts_override gives {len(prompts_override)} prompts for "
                f"{len(batch_items)} batch_items; give one per item"
            )
        params = SamplingParams.from_config(a, num, max_new_tokens=max_new_tokens)
        sampler = HFAgent(
            model,
            self.tokenizers[idx],
            name=f"agent_{idx}",
            prompt_format="raw",
            backend="hf" if "generate" in vars(model) else "native",  # as the trainers' agents
        )
        g = params.num_generations
        with torch.inference_mode():
            samples = sampler.sample(prompts, params)
            ids, mask = samples.batch.input_ids, samples.batch.completion_mask
            s = ids.shape[1] - mask.shape[1]  # prompt width (left-padded)
            attention = samples.batch.attention_mask.bool()
            prompt_ids = [ids[n * g, :s][attention[n * g, :s]] for n in range(len(prompts))]
            completion_ids = [
                [ids[n * g + k, s:][mask[n * g + k]] for k in range(g)] for n in range(len(prompts))
            ]
        return {
            "prompts": prompts,
            "batch_items": list(batch_items),
            "completions": samples.texts(),
            "prompt_input_ids": prompt_ids,
            "completion_input_ids": completion_ids,
        }

    def _sequence_log_prob(
        self, agent_idx: int, prompt_input_ids: torch.Tensor, completion_ids: torch.Tensor
    ) -> torch.Tensor:
        """Sum of agent ``agent_idx``'s log-probs (nats, float32, temperature 1, eval
        mode: no dropout) of ``completion_ids`` after ``prompt_input_ids``, up to and
        including the first EOS; differentiable. Inference tensors (from generation) are
        accepted: the ids are copied. 1.4.3 cuts at the first pad token instead.

        Raises:
            ValueError: an empty completion.
        """
        from comlrl.algos.models.logprobs import sampling_mode
        from comlrl.algos.recipes.preference.encoding import sequence_logprobs
        from comlrl.algos.rollout.sampling.collate import pack_token_rows

        model = self.agents[agent_idx]  # type: ignore[attr-defined]
        tokenizer = self.tokenizers[agent_idx]
        completion = [int(t) for t in completion_ids.reshape(-1).tolist()]
        eos = tokenizer.eos_token_id
        if eos is not None and int(eos) in completion:
            completion = completion[: completion.index(int(eos)) + 1]
        if not completion:
            raise ValueError(f"agent {agent_idx}: empty completion; nothing to score")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        batch = pack_token_rows(
            [[int(t) for t in prompt_input_ids.reshape(-1).tolist()]],
            [completion],
            group_size=1,
            pad_token_id=int(pad if pad is not None else 0),
            device=next(model.parameters()).device,
        )
        with sampling_mode(model):
            seq, _ = sequence_logprobs(model, batch)
        return seq[0]

    def _agent_logprob_delta(self, agent_idx: int, pair: Any) -> torch.Tensor:
        """``log pi(winner) - log pi(loser)`` of agent ``agent_idx`` on ``pair`` (1.4.3's
        record with ``agent_tensors``, or our :class:`~comlrl.trainers._iterative.IterPair`)."""
        if hasattr(pair, "agent_tensors"):
            t = pair.agent_tensors[agent_idx]
            prompt, won, lost = t.prompt_input_ids, t.winner_completion_ids, t.loser_completion_ids
        else:
            prompt = torch.tensor(pair.prompt_ids[agent_idx])
            won = torch.tensor(pair.chosen_ids[agent_idx])
            lost = torch.tensor(pair.rejected_ids[agent_idx])
        return self._sequence_log_prob(agent_idx, prompt, won) - self._sequence_log_prob(
            agent_idx, prompt, lost
        )

    def _detached_agent_deltas(self, batch: Sequence[Any]) -> list[list[float]]:
        """``[pair][agent]`` log-ratio deltas without gradients (the other agents' share
        of the joint margin, 1.4.3's routing)."""
        with torch.no_grad():
            return [
                [float(self._agent_logprob_delta(a, pair)) for a in range(self.num_agents)]
                for pair in batch
            ]

    def _agent_preference_loss(
        self, agent_idx: int, batch: Sequence[Any], detached_deltas: Sequence[Sequence[float]]
    ) -> torch.Tensor:
        """Agent ``agent_idx``'s reference-free joint DPO loss on ``batch``:
        ``mean -log sigmoid(beta * (own delta + the others' detached deltas))``
        (Rafailov et al. 2023, eq. 7, with ``log pi_ref = 0`` as 1.4.3's MADPO)."""
        beta = float(self.args.dpo_beta)
        terms = []
        for p, pair in enumerate(batch):
            own = self._agent_logprob_delta(agent_idx, pair)
            others = float(sum(detached_deltas[p])) - float(detached_deltas[p][agent_idx])
            terms.append(-torch.nn.functional.logsigmoid(beta * (own + others)))
        return torch.stack(terms).mean()

    def _update_from_preference_batch(self, batch: Sequence[Any]) -> dict[str, float]:
        """1.4.3's MADPO step on ``batch``: the detached deltas first, then per agent in
        order zero_grad, loss, backward, step; returns the mean candidate reward as
        ``turn_1/reward_mean`` and ``turn_1/expected_return`` (``{}`` for no pairs)."""
        if not batch:
            return {}
        deltas = self._detached_agent_deltas(batch)
        for a in range(self.num_agents):
            optimizer = self.optimizers[a]  # type: ignore[attr-defined]
            optimizer.zero_grad()
            self._agent_preference_loss(a, batch, deltas).backward()
            optimizer.step()
        mean = float(np.mean([float(p.candidate_reward_mean) for p in batch]))
        return {"turn_1/reward_mean": mean, "turn_1/expected_return": mean}
