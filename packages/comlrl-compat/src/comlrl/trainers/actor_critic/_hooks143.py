"""CoMLRL 1.4.3's ``RolloutSample`` record and private IAC/MAAC helpers, as thin adapters.

1.4.3's test suite imports ``RolloutSample`` from :mod:`comlrl.trainers.actor_critic` and
calls a few private helpers directly: the reward expansion (one value, one per
generation, or one per agent), a response's log-probability from a forward pass, the
value of a prompt, and MAAC's single-turn ``_collect_rollouts`` over its own generation and
critic hooks (:class:`MAACRolloutHooks143`). Each method here reproduces the 1.4.3
behaviour its docstring names; the log-probs go through
:func:`comlrl.kernels.token_logprobs`, the op our updates use. Our recipe
(:mod:`comlrl.algos.recipes.actor_critic.recipe`) does not go through them and produces
no ``RolloutSample``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from comlrl.utils.reward_utils import call_reward_function, normalize_reward_lengths

__all__ = ["ActorCriticHooks143", "MAACRolloutHooks143", "RolloutSample"]


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


#: the hooks :meth:`MAACRolloutHooks143._collect_rollouts` calls that our trainers lack
#: (1.4.3's generation, prompt and critic plumbing; a subclass or script supplies them)
_MAAC_ROLLOUT_HOOKS = (
    "_generate",
    "_resolve_turn_prompt",
    "_get_tokenizer",
    "_critic_value_from_text",
)


class MAACRolloutHooks143:
    """1.4.3's single-turn MAAC rollout of one example, ``_collect_rollouts(item)``, over
    the hooks a 1.4.3-style subclass or script supplies (our ``train()`` samples through
    :mod:`comlrl.algos.recipes.actor_critic.recipe` and never calls it):

    - ``_resolve_turn_prompt(item, agent_idx) -> str``: each agent's prompt;
    - ``_generate(model, prompt, agent_idx) -> dict``: ``prompt_len``, ``sequences
      [G, S + L]``, ``attention_mask [G, S + L]``, ``response_lens`` (``G`` ints),
      ``reference_kls`` (``G`` floats or empty), ``completions`` (``G`` texts);
    - ``_critic_value_from_text(text) -> dict``: the centralised critic's ``input_ids``,
      ``attention_mask``, ``prompt_len`` and ``value`` for :meth:`_build_critic_input`'s text;
    - ``_get_tokenizer(agent_idx)``: decodes the response tokens;
    - ``_policy_eval`` (:class:`ActorCriticHooks143`): the behaviour log-prob.
    """

    args: Any
    agents: Any

    def _build_critic_input(
        self, prompts: list[str], action_completions: list[str] | None = None
    ) -> str:
        """The centralised critic's text: ``[Agent i] <prompt i>`` blocks joined by blank
        lines; with ``critic_type="q"`` followed by a ``[Joint Action]`` block with each
        agent's completion (1.4.3's layout)."""
        text = "\n\n".join(f"[Agent {i}] {p}" for i, p in enumerate(prompts))
        if str(getattr(self.args, "critic_type", None) or "v").lower() == "v":
            return text
        lines = ["[Joint Action]"]
        lines += [f"[Agent {i} action]\n{c}" for i, c in enumerate(action_completions or [])]
        return text + "\n\n" + "\n\n".join(lines)

    def _collect_rollouts(self, item: dict[str, Any]) -> list[RolloutSample]:
        """One :class:`RolloutSample` per completion per agent (agent-major, generation
        order) for ``item``, single turn: each agent samples ``num_generations`` completions
        (one in eval), the reward function scores the ``G`` joint actions and every agent
        gets the joint reward of its own completion (1.4.3's broadcast: always
        :meth:`ActorCriticHooks143._expand_rewards`, never a subclass's override, which
        only multi-turn rollouts dispatch to); ``old_value`` is the critic's value of the
        joint prompt (``"v"``) or of the joint action (``"q"``); ``returns``,
        ``metadata["adv_target"]`` and ``metadata["value_target"]`` the reward, less
        ``reference_kl_coef * KL`` when the reference KL is on.

        Raises:
            NotImplementedError: ``num_turns > 1`` (multi-turn MAAC rolls out in our
                recipe, through ``train()``), or a hook listed in the class docstring is
                missing.
            ValueError: a reward count :func:`normalize_reward_lengths` rejects.
        """
        args = self.args
        turns = max(1, int(getattr(args, "num_turns", 1) or 1))
        if turns > 1:
            raise NotImplementedError(
                f"_collect_rollouts covers 1.4.3's single-turn MAAC rollout; num_turns={turns} "
                "rolls out in our recipe (train())"
            )
        missing = [name for name in _MAAC_ROLLOUT_HOOKS if not callable(getattr(self, name, None))]
        if missing:
            raise NotImplementedError(
                f"_collect_rollouts needs 1.4.3's hooks {missing}; define them on a subclass "
                "(our train() does not use this path)"
            )
        hooks: Any = self
        agents = int(args.num_agents)
        num_ret = 1 if getattr(self, "_in_eval", False) else int(args.num_generations)
        prompts = [hooks._resolve_turn_prompt(item, a) for a in range(agents)]

        def generate(a: int) -> dict[str, Any]:
            return {
                "agent_idx": a,
                "prompt": prompts[a],
                **hooks._generate(self.agents[a], prompts[a], a),
            }

        gens: list[dict[str, Any]] = hooks._run_agent_tasks(generate)
        texts = [list(g["completions"]) for g in gens]
        raw = call_reward_function(
            hooks.reward_func, prompts, texts, num_agents=agents, batch_items=[item],
            signature=getattr(self, "_reward_signature", None),
        )  # fmt: skip
        rewards = normalize_reward_lengths(
            [float(hooks.reward_processor(r)) for r in raw],
            num_agents=agents, num_generations=num_ret, algorithm="MAAC",
        )  # fmt: skip
        matrix = ActorCriticHooks143._expand_rewards(hooks, rewards, num_ret)
        q = str(getattr(args, "critic_type", None) or "v").lower() != "v"
        with torch.no_grad():
            critic = (
                [
                    hooks._critic_value_from_text(
                        self._build_critic_input(prompts, [t[i] for t in texts])
                    )
                    for i in range(num_ret)
                ]
                if q
                else [hooks._critic_value_from_text(self._build_critic_input(prompts))]
            )
        samples = []
        for g in gens:
            a, start = int(g["agent_idx"]), int(g["prompt_len"])
            for i in range(num_ret):
                seq, mask = g["sequences"][i], g["attention_mask"][i]
                length, reward = int(g["response_lens"][i]), float(matrix[a][i])
                shaped, kl_meta = hooks._kl_shaped_reward(reward, g, i)
                logp, _ = hooks._policy_eval(
                    self.agents[a], seq[None], mask[None], start, length, output_values=False
                )
                pack = critic[i if q else 0]
                target = torch.tensor([shaped], dtype=torch.float32)
                reward_t = torch.tensor([reward], dtype=torch.float32)
                text = hooks._get_tokenizer(a).decode(
                    seq[start : start + length], skip_special_tokens=True
                )
                samples.append(
                    RolloutSample(
                        agent_idx=a, prompt=g["prompt"], completion=text,
                        full_input_ids=seq.detach().cpu(), attention_mask=mask.detach().cpu(),
                        prompt_len=start, response_len=length,
                        old_logprob=logp.detach().cpu(), old_value=pack["value"].detach().cpu(),
                        reward=reward_t, returns=target.clone(),
                        advantage=torch.zeros_like(reward_t),
                        metadata={
                            "joint_input_ids": pack["input_ids"].detach().cpu(),
                            "joint_attention_mask": pack["attention_mask"].detach().cpu(),
                            "joint_prompt_len": int(pack["prompt_len"]),
                            "turn_idx": 0, "generation_idx": i, "batch_item": item,
                            "adv_target": target, "value_target": target.clone(), **kl_meta,
                        },
                    )
                )  # fmt: skip
        return samples
