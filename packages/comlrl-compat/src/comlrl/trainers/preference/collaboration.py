"""CoMLRL 1.4.3's module path ``comlrl.trainers.preference.collaboration``.

- :func:`joint_sequence_log_prob`: the log-probability of one joint response (every
  role's text in one sequence) under one joint actor.
- :class:`CentralizedCollaboration`: 1.4.3's environment boundary of centralized
  MADPO/MARLHF (joint prompt in, joint response split into role outputs for the task
  reward and metrics), over :mod:`comlrl.algos.rollout.joint_policy`.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CentralizedCollaboration", "joint_sequence_log_prob"]


def _response_tokens(tokenizer: Any, completion_ids: torch.Tensor) -> list[int]:
    """The response's token ids through its first EOS; without an EOS, trailing padding
    dropped."""
    ids = [int(t) for t in completion_ids.reshape(-1).tolist()]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if eos is not None and int(eos) in ids:
        return ids[: ids.index(int(eos)) + 1]
    while ids and pad is not None and ids[-1] == int(pad):
        ids.pop()
    return ids


def joint_sequence_log_prob(
    model: Any, tokenizer: Any, prompt_input_ids: torch.Tensor, completion_ids: torch.Tensor
) -> torch.Tensor:
    """``sum_t log pi(y_t | x, y_<t)`` (nats, float32 scalar, temperature 1) of a joint
    response ``y`` (``completion_ids [L]``, through its first EOS; padding after it is not
    scored) after the prompt ``x`` (``prompt_input_ids [S]``), as CoMLRL 1.4.3 scores its
    joint actor: one forward pass of ``x + y[:-1]`` in the model's current mode (the
    caller chooses train or eval mode; with dropout the result depends on it), log-probs
    by :func:`comlrl.kernels.token_logprobs`. Differentiable; inference tensors (from
    generation) are accepted. An empty response gives 0 that ``backward()`` accepts.

    Raises:
        ValueError: an empty prompt.
    """
    from comlrl.kernels import token_logprobs

    prompt = [int(t) for t in prompt_input_ids.reshape(-1).tolist()]
    if not prompt:
        raise ValueError(
            "joint_sequence_log_prob needs a non-empty tokenized prompt (the first response "
            "token is predicted from the prompt's last position); got 0 prompt tokens."
        )
    response = _response_tokens(tokenizer, completion_ids)
    device = next(model.parameters()).device
    if not response:
        return torch.zeros((), device=device, requires_grad=True)
    inputs = torch.tensor([prompt + response[:-1]], device=device)
    logits = model(inputs, use_cache=False).logits[0, len(prompt) - 1 :]
    targets = torch.tensor(response, device=device)
    return token_logprobs(logits, targets, temperature=1.0).sum()


class CentralizedCollaboration:
    """1.4.3's ``CentralizedCollaboration``: one joint actor's text at the environment
    boundary, over :func:`comlrl.algos.rollout.joint_policy.split_roles` and
    :class:`comlrl.trainers._callbacks.CompatReward`.

    Args:
        adapter: ``build_prompt(item, agent_prompts)`` and ``parse_completion(completion,
            item, num_roles)`` (e.g. :class:`comlrl.trainers.preference.TaggedCentralizedComparatorAdapter`).
        formatters: the roles' formatters (None, one, or one per role).
        reward_func: the role-level reward function (any form CoMLRL 1.4.3 accepts).
        num_roles: ``A``.

    Raises:
        TypeError: an adapter without the two methods, or a reward function that is not
            callable.
    """

    def __init__(self, adapter: Any, formatters: Any, reward_func: Any, num_roles: int) -> None:
        from comlrl.trainers._callbacks import CompatReward, build_formatters
        from comlrl.trainers._centralized import check_adapter
        from comlrl.utils.reward_utils import resolve_reward_range

        check_adapter(adapter)
        self.adapter = adapter
        self.num_roles = int(num_roles)
        self.formatters = build_formatters(formatters, self.num_roles)
        self.reward_func = reward_func
        self.reward_range = resolve_reward_range(reward_func)
        self._reward = CompatReward(reward_func, self.num_roles, self.formatters[0])

    def build_prompt(self, item: dict[str, Any]) -> str:
        """The joint prompt of ``item``: the adapter's prompt of the roles' prompts.

        Raises:
            ValueError: the adapter built an empty or non-string prompt.
        """
        prompt = self.adapter.build_prompt(item, [f(item) for f in self.formatters])
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(
                f"centralized_comparator_adapter.build_prompt returned {prompt!r}; it must "
                "build a non-empty prompt."
            )
        return prompt

    def split(self, completion: str, item: dict[str, Any]) -> list[str]:
        """The ``A`` role outputs of one joint response (``""`` each when it cannot be
        parsed), as :func:`~comlrl.algos.rollout.joint_policy.split_roles`."""
        from comlrl.algos.rollout.joint_policy import split_roles

        return split_roles(self.adapter, completion, item, self.num_roles)

    def __call__(
        self,
        completions: list[str],
        *,
        prompts: Any = None,
        batch_items: list[dict[str, Any]] | None = None,
    ) -> list[float]:
        """One task reward per joint response: its role outputs scored as one joint
        action by ``reward_func``.

        Raises:
            ValueError: no ``batch_items``, or neither one nor one per response.
        """
        if not batch_items:
            raise ValueError("centralized task rewards need batch_items= (the examples)")
        if len(batch_items) not in (1, len(completions)):
            raise ValueError(
                f"{len(completions)} joint responses do not align with {len(batch_items)} "
                "batch_items; give one item, or one per response."
            )
        items = [
            batch_items[0] if len(batch_items) == 1 else batch_items[i]
            for i in range(len(completions))
        ]
        roles: list[list[str]] = [[] for _ in range(self.num_roles)]
        for text, item in zip(completions, items, strict=True):
            for r, output in enumerate(self.split(text, item)):
                roles[r].append(output)
        return [float(r) for r in self._reward(roles, items).rewards]

    def split_eval(
        self, joint_turns: list[list[list[str]]], items: list[dict[str, Any]]
    ) -> list[list[list[str]]]:
        """``[1][example][turn]`` joint responses -> ``[A][example][turn]`` role outputs.

        Raises:
            ValueError: the responses do not align with ``items``.
        """
        if len(joint_turns) != 1 or len(joint_turns[0]) != len(items):
            raise ValueError(
                "centralized evaluation outputs must be one actor's, one list per item; got "
                f"{len(joint_turns)} actors for {len(items)} items"
            )
        roles: list[list[list[str]]] = [[] for _ in range(self.num_roles)]
        for turns, item in zip(joint_turns[0], items, strict=True):
            parsed = [self.split(text, item) for text in turns]
            for r in range(self.num_roles):
                roles[r].append([p[r] for p in parsed])
        return roles

    def wrap_metrics_callback(self, callback: Any) -> Any:
        """``callback`` fed one shallow copy per role of each sample (``agent_idx`` the
        role, ``completion`` its output; ``metadata["batch_item"]`` the example)."""
        import copy

        def role_metrics(samples: list[Any]) -> Any:
            out = []
            for sample in samples:
                outputs = self.split(sample.completion, sample.metadata["batch_item"])
                for r, output in enumerate(outputs):
                    role = copy.copy(sample)
                    role.agent_idx, role.completion = r, output
                    out.append(role)
            return callback(out)

        return role_metrics
