"""CoMLRL 1.4.3's ``RolloutSample`` record and private IAC/MAAC helpers, as thin adapters.

1.4.3's test suite imports ``RolloutSample`` from :mod:`comlrl.trainers.actor_critic` and
calls a few private helpers directly: the reward expansion (one value, one per
generation, or one per agent), a response's log-probability from a forward pass, and the
value of a prompt. Each method here reproduces the 1.4.3 behaviour its docstring names;
the log-probs go through :func:`comlrl.kernels.token_logprobs`, the op our updates use.
Our recipe (:mod:`comlrl.algos.recipes.actor_critic.recipe`) does not go through them and
produces no ``RolloutSample``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["ActorCriticHooks143", "RolloutSample"]


@dataclass
class RolloutSample:
    """CoMLRL 1.4.3's per-completion actor-critic record (its fields and defaults).

    Attributes:
        agent_idx: the agent.
        prompt, completion: texts.
        full_input_ids, attention_mask: ``[S + L]`` prompt and response token ids, mask.
        prompt_len, response_len: ``S`` and ``L``.
        old_logprob, old_value: the behaviour log-prob and value estimate.
        reward, returns, advantage, normalized_advantage: ``[1]`` tensors.
        metadata: anything else (masks, value targets, the joint input of MAAC's critic).
    """

    agent_idx: int
    prompt: str
    completion: str
    full_input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    response_len: int
    old_logprob: torch.Tensor
    old_value: torch.Tensor
    reward: torch.Tensor
    returns: torch.Tensor
    advantage: torch.Tensor
    normalized_advantage: torch.Tensor | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class ActorCriticHooks143:
    """1.4.3's ``_expand_rewards``, ``_compute_sequence_stats``, ``_value_on_prompt_only``
    and ``_policy_eval`` (see the module docstring)."""

    args: Any

    def _expand_rewards(self, rewards: list[float], num_ret: int) -> list[list[float]]:
        """``[A][num_ret]`` rewards from a reward function's values, by 1.4.3's precedence:
        one value for everything; ``num_ret`` values, one per generation, for every agent;
        ``A`` values, one per agent. Each agent gets its own list.

        Raises:
            ValueError: any other count.
        """
        agents = int(self.args.num_agents)
        if len(rewards) == 1:
            return [[rewards[0]] * num_ret for _ in range(agents)]
        if len(rewards) == num_ret:
            return [list(rewards) for _ in range(agents)]
        if len(rewards) == agents:
            return [[r] * num_ret for r in rewards]
        raise ValueError(
            f"Reward function must return 1 value, num_generations values, or num_agents "
            f"values; got {len(rewards)} (num_generations={num_ret}, num_agents={agents})."
        )

    def _compute_sequence_stats(
        self,
        sequences: torch.Tensor,
        logits: torch.Tensor,
        prompt_len: int,
        response_len: int,
        completion_loss_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B]`` sum of the untempered log-probs of the ``response_len`` tokens after
        ``prompt_len`` (``sequences [B, S + L]``, ``logits [B, S + L, V]``), tokens where
        ``completion_loss_mask [L]`` is False counted 0; differentiable.

        Raises:
            ValueError: a mask that is not one-dimensional of length ``response_len``.
        """
        from comlrl.kernels import token_logprobs

        b, _, v = logits.shape
        start = max(int(prompt_len) - 1, 0)
        picked = logits[:, start : start + int(response_len)]
        targets = sequences[:, start + 1 : start + 1 + int(response_len)]
        if completion_loss_mask is not None and (
            completion_loss_mask.ndim != 1
            or completion_loss_mask.numel() != response_len
            or targets.shape[1] != response_len
        ):
            raise ValueError(
                f"completion_loss_mask must be one-dimensional and match response_len="
                f"{response_len}; got shape {tuple(completion_loss_mask.shape)}."
            )
        logp = token_logprobs(picked.reshape(-1, v), targets.reshape(-1).long(), temperature=1.0)
        logp = logp.reshape(b, -1).to(logits.dtype)
        if completion_loss_mask is not None:
            keep = completion_loss_mask.to(device=logp.device, dtype=torch.bool).clone()
            logp = logp.masked_fill(~keep, 0.0)
        return logp.sum(dim=-1)

    def _value_on_prompt_only(
        self, model: Any, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int
    ) -> torch.Tensor:
        """``[B]`` value of the prompt (history) alone: the model's value output at the last
        of the first ``prompt_len`` tokens (1.4.3's ``V(h)``).

        Raises:
            RuntimeError: the model returns no values.
        """
        mask = attention_mask[:, :prompt_len] if attention_mask is not None else None
        out = model(input_ids=sequences[:, :prompt_len], attention_mask=mask, output_values=True)
        if getattr(out, "values", None) is None:
            raise RuntimeError("the model returned no values (no value head); V(h) needs one")
        return out.values[:, prompt_len - 1]

    def _policy_eval(
        self,
        model: Any,
        sequences: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        response_len: int,
        output_values: bool = False,
        completion_loss_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """1.4.3's ``(log pi(response), V(h) or None)`` of a sequence: one forward pass for
        :meth:`_compute_sequence_stats` (``output_values`` passed on to a model that takes
        it), and :meth:`_value_on_prompt_only` when ``output_values``."""
        from comlrl.trainers.actor_critic._loop143 import forward_143

        out = forward_143(model, sequences, attention_mask, output_values)
        logp = self._compute_sequence_stats(
            sequences, out.logits, prompt_len, response_len, completion_loss_mask
        )
        value = (
            self._value_on_prompt_only(model, sequences, attention_mask, prompt_len)
            if output_values
            else None
        )
        return logp, value
