"""Rollouts as data: frozen records of what one training step sampled and scored.

A step's rollout is a tree per example (``docs/architecture.md``, one step). At turn ``t`` there are
``N_t`` *nodes*, each one state of one example in which every agent has a prompt. Each
agent samples ``G`` completions per node, which form ``K`` joint actions per node
(``align``: ``K = G``; ``cross``: ``K = G**A``); each joint action earns a reward and, when
its episode goes on, opens one child node at turn ``t + 1``. Turn 0 has one node per
example.

Named axes: ``P`` examples in the step, ``A`` agents, ``G`` completions per node per
agent, ``K`` joint actions per node, ``N_t`` nodes at turn ``t``, ``B = N_t * G``
sequences of one agent at turn ``t``, ``S`` padded prompt tokens, ``L`` completion tokens.

Nothing here computes (:func:`stack_batches` only re-pads):
:func:`comlrl.algos.rollout.tree.rollout` builds these records,
:func:`comlrl.estimators.returns.tree_returns` gives the returns, the recipes read them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from comlrl.core import Completion, Feedback

__all__ = ["PolicyBatch", "AgentSamples", "TurnRollout", "Rollout", "stack_batches"]


@dataclass(frozen=True)
class PolicyBatch:
    """The padded tensors behind one agent's ``N x G`` completions, ready for the update.

    Rows are node-major: row ``n * G + g`` is completion ``g`` of prompt ``n``.

    Attributes:
        input_ids: ``[B, S + L]`` int64, prompt (left-padded) followed by the completion.
        attention_mask: ``[B, S + L]`` int64, 1 on real prompt tokens and on completion
            tokens up to and including the first EOS, 0 elsewhere.
        completion_mask: ``[B, L]`` bool, the completion part of ``attention_mask``.
        behaviour_logprobs: ``[B, L]`` float32 log-probs (nats) of the sampled tokens under
            the tempered sampling policy, 0 on masked positions.
        group_size: ``G``; rows ``n * G`` to ``n * G + G - 1`` share prompt ``n``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    group_size: int = 1

    def __post_init__(self) -> None:
        b, length = self.completion_mask.shape
        if self.input_ids.shape[0] != b or self.input_ids.shape[1] < length:
            raise ValueError(
                f"input_ids {list(self.input_ids.shape)} do not fit completion_mask "
                f"{list(self.completion_mask.shape)}: need [B, S + L] with the same B"
            )
        if self.group_size < 1 or b % self.group_size:
            raise ValueError(f"{b} rows are not whole groups of group_size={self.group_size}")

    @property
    def prompt_length(self) -> int:
        """``S``, the padded prompt length."""
        return self.input_ids.shape[1] - self.completion_mask.shape[1]

    @property
    def num_prompts(self) -> int:
        """``N``, the number of prompts (groups)."""
        return self.completion_mask.shape[0] // self.group_size

    def to(self, device: torch.device | str) -> PolicyBatch:
        """A copy on ``device``."""
        return PolicyBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.completion_mask.to(device),
            self.behaviour_logprobs.to(device),
            self.group_size,
        )


def stack_batches(parts: Sequence[PolicyBatch]) -> PolicyBatch:
    """One batch holding ``parts``' rows one after another (same ``G``), re-padded to the
    longest prompt (more left padding) and the longest completion (more right padding).

    Real tokens keep their positions relative to their sequence (position ids come from
    the attention mask), so a row's log-probs are its own batch's to float rounding. The
    added padding holds token id 0 with attention 0, completion mask False and behaviour
    log-prob 0. Used to run the micro-batches of agents that share one base through one
    forward (:func:`comlrl.algos.training.update.policy.update_adapters`).

    Raises:
        ValueError: no parts, or parts of different group sizes or devices.
    """
    if not parts:
        raise ValueError("stack_batches needs at least one batch")
    g = parts[0].group_size
    if any(p.group_size != g for p in parts):
        raise ValueError(
            f"batches of group sizes {[p.group_size for p in parts]} cannot be stacked"
        )
    if len({p.input_ids.device for p in parts}) > 1:
        raise ValueError("batches on different devices cannot be stacked; move them first")
    s = max(p.prompt_length for p in parts)
    length = max(p.completion_mask.shape[1] for p in parts)

    def pad(x: torch.Tensor, left: int, right: int, value: float | bool) -> torch.Tensor:
        if not left and not right:
            return x
        return torch.nn.functional.pad(x, (left, right), value=value)

    ids, attn, cmask, logp = [], [], [], []
    for p in parts:
        left, right = s - p.prompt_length, length - p.completion_mask.shape[1]
        ids.append(pad(p.input_ids, left, right, 0))
        attn.append(pad(p.attention_mask, left, right, 0))
        cmask.append(pad(p.completion_mask, 0, right, False))
        logp.append(pad(p.behaviour_logprobs, 0, right, 0.0))
    return PolicyBatch(
        torch.cat(ids), torch.cat(attn), torch.cat(cmask), torch.cat(logp), group_size=g
    )


@dataclass(frozen=True)
class AgentSamples:
    """One agent's completions for ``N`` prompts, as text and as tensors.

    Attributes:
        prompts: ``N`` prompt strings.
        completions: ``N`` tuples of ``G`` :class:`~comlrl.core.Completion` records.
        batch: the same completions as a :class:`PolicyBatch`.
        with_tools: the agent had tools (its completions may hold tool calls, and the
            batch's ``completion_mask`` leaves their observations out).
    """

    prompts: tuple[str, ...]
    completions: tuple[tuple[Completion, ...], ...]
    batch: PolicyBatch
    with_tools: bool = False

    def texts(self) -> list[list[str]]:
        """``[N][G]`` completion texts."""
        return [[c.text for c in group] for group in self.completions]


@dataclass(frozen=True)
class TurnRollout:
    """Everything turn ``t`` of a step produced, for every node of every example.

    Attributes:
        turn: ``t``, 0-based.
        example_index: ``[N_t]`` int64, the example (index into :attr:`Rollout.examples`)
            each node belongs to.
        parent: ``[N_t]`` int64, the joint action at turn ``t - 1`` each node continues,
            as a flat index ``n * K + k`` into that turn's ``[N_{t-1}, K]`` tensors
            (``-1`` at turn 0).
        agents: ``A`` :class:`AgentSamples`, one per agent, over the ``N_t`` nodes.
        joint_index: ``[K, A]`` int64; joint action ``k`` of every node takes completion
            ``joint_index[k, a]`` of agent ``a``.
        rewards: ``[N_t, K]`` float32 joint rewards (task units).
        terminal: ``[N_t, K]`` bool; the episode ended with this joint action (the task
            said done, early termination, or the last turn).
        child: ``[N_t, K]`` int64, the node at turn ``t + 1`` this joint action opened, or
            ``-1`` (terminal, or not expanded under the branching limit).
        returns: ``[N_t, K]`` float32 discounted returns down the tree (see
            :func:`comlrl.estimators.returns.tree_returns`).
        infos: ``N_t * K`` reward-function diagnostics, node-major.
        feedback: ``N_t * K`` :class:`~comlrl.core.Feedback` given after each joint
            action (``None`` where no transition was made).
    """

    turn: int
    example_index: torch.Tensor
    parent: torch.Tensor
    agents: tuple[AgentSamples, ...]
    joint_index: torch.Tensor
    rewards: torch.Tensor
    terminal: torch.Tensor
    child: torch.Tensor
    returns: torch.Tensor
    infos: tuple[Mapping[str, Any], ...] = ()
    feedback: tuple[Feedback | None, ...] = ()

    @property
    def num_nodes(self) -> int:
        """``N_t``."""
        return int(self.rewards.shape[0])


@dataclass(frozen=True)
class Rollout:
    """One training step's rollout: the examples and every turn of their trees.

    Attributes:
        examples: the ``P`` task examples of the step.
        turns: one :class:`TurnRollout` per turn that had at least one node.
        gamma: the discount the returns were computed with.
        timings: seconds spent per stage (``generate_s``, ``reward_s``, ``transition_s``).
    """

    examples: tuple[Mapping[str, Any], ...]
    turns: tuple[TurnRollout, ...]
    gamma: float = 1.0
    timings: Mapping[str, float] = field(default_factory=dict)

    def agent_batches(self, agent: int) -> list[PolicyBatch]:
        """Agent ``agent``'s :class:`PolicyBatch` of every turn, in turn order."""
        return [turn.agents[agent].batch for turn in self.turns]

    @property
    def num_agents(self) -> int:
        """``A``."""
        return len(self.turns[0].agents) if self.turns else 0


def flat_texts(samples: Sequence[AgentSamples], joint_index: torch.Tensor) -> list[list[str]]:
    """Agent-major texts of every joint action: ``[A][N * K]``, node-major within an agent."""
    idx = joint_index.tolist()
    return [
        [s.completions[n][row[a]].text for n in range(len(s.completions)) for row in idx]
        for a, s in enumerate(samples)
    ]
