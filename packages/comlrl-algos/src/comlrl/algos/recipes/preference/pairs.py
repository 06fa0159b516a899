"""Preference pairs of joint actions: a single-turn rollout's joint actions paired by reward
gap (:func:`preference_pairs`), as text and per-agent tensors (:class:`JointPreferencePairs`).

Named axes: ``N`` prompts, ``A`` agents, ``K`` joint actions per prompt, ``P`` pairs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from comlrl.algos.functional.preference_losses import (
    select_preference_pairs,
)
from comlrl.algos.records import PolicyBatch, Rollout

__all__ = ["JointPreferencePairs", "preference_pairs"]


@dataclass(frozen=True)
class JointPreferencePairs:
    """``P`` (chosen, rejected) joint-action pairs of one rollout, as text and tensors.

    Attributes:
        examples: ``P`` task examples, the one each pair answers.
        prompts: ``[P][A]`` each agent's prompt.
        chosen: ``[P][A]`` each agent's completion text in the chosen joint action.
        rejected: ``[P][A]`` same, rejected joint action.
        chosen_reward: ``[P]`` float32 joint rewards of the chosen joint actions.
        rejected_reward: ``[P]`` float32, rejected.
        batches: per agent a :class:`PolicyBatch` of ``2P`` rows, group size 2: row ``2p``
            is the agent's part of pair ``p``'s chosen joint action, ``2p + 1`` rejected.
    """

    examples: tuple[Mapping[str, Any], ...]
    prompts: tuple[tuple[str, ...], ...]
    chosen: tuple[tuple[str, ...], ...]
    rejected: tuple[tuple[str, ...], ...]
    chosen_reward: torch.Tensor
    rejected_reward: torch.Tensor
    batches: tuple[PolicyBatch, ...] = field(repr=False)

    def __len__(self) -> int:
        return len(self.examples)


def preference_pairs(
    ro: Rollout, *, min_gap: float = 0.0, pairs_per_prompt: int = 1
) -> JointPreferencePairs:
    """Pair the joint actions of a single-turn rollout by reward gap
    (:func:`~comlrl.algos.functional.preference_losses.select_preference_pairs` on turn 0's
    ``[N, K]`` rewards) and gather each agent's rows of the pairs.

    Raises:
        ValueError: the rollout has more than one turn (MADPO pairs single-turn joint
            actions; multi-turn trees are not paired here).
    """
    if len(ro.turns) != 1:
        raise ValueError(f"preference_pairs needs a single-turn rollout, got {len(ro.turns)} turns")
    turn = ro.turns[0]
    prompt, chosen, rejected = select_preference_pairs(
        turn.rewards, min_gap=min_gap, pairs_per_prompt=pairs_per_prompt
    )
    batches, prompts, chosen_txt, rejected_txt = [], [], [], []
    for a, samples in enumerate(turn.agents):
        b = samples.batch
        g = b.group_size
        comp = turn.joint_index[:, a]
        rows = torch.stack([prompt * g + comp[chosen], prompt * g + comp[rejected]], dim=1).reshape(
            -1
        )
        rows = rows.to(b.input_ids.device)
        batches.append(
            PolicyBatch(
                b.input_ids[rows],
                b.attention_mask[rows],
                b.completion_mask[rows],
                b.behaviour_logprobs[rows],
                2,
            )
        )
    for n, kc, kr in zip(prompt.tolist(), chosen.tolist(), rejected.tolist(), strict=True):
        agents = turn.agents
        prompts.append(tuple(s.prompts[n] for s in agents))
        chosen_txt.append(
            tuple(s.completions[n][int(turn.joint_index[kc, a])].text for a, s in enumerate(agents))
        )
        rejected_txt.append(
            tuple(s.completions[n][int(turn.joint_index[kr, a])].text for a, s in enumerate(agents))
        )
    node_example = turn.example_index[prompt]
    return JointPreferencePairs(
        examples=tuple(ro.examples[int(p)] for p in node_example),
        prompts=tuple(prompts),
        chosen=tuple(chosen_txt),
        rejected=tuple(rejected_txt),
        chosen_reward=turn.rewards[prompt, chosen],
        rejected_reward=turn.rewards[prompt, rejected],
        batches=tuple(batches),
    )
