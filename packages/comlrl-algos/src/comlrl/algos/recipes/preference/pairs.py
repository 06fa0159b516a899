"""Preference pairs of joint actions: a single-turn rollout's joint actions paired by reward
gap (:func:`preference_pairs`), as text and per-agent tensors (:class:`JointPreferencePairs`);
one pair with its token ids as sampled (:class:`IterPair`: the unit of MADPO's pairs built
once and of the iterative rounds' replay) and ``P`` of them as tensors (:func:`joint_pairs`).

Named axes: ``N`` prompts, ``A`` agents, ``K`` joint actions per prompt, ``P`` pairs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from comlrl.algos.records import PolicyBatch, Rollout
from comlrl.algos.rollout.sampling.collate import pack_token_rows
from comlrl.estimators.preference_losses import (
    select_preference_pairs,
)

__all__ = ["IterPair", "JointPreferencePairs", "joint_pairs", "preference_pairs", "row_tokens"]


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
    (:func:`~comlrl.estimators.preference_losses.select_preference_pairs` on turn 0's
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


@dataclass(frozen=True)
class IterPair:
    """One (chosen, rejected) joint-action pair of one prompt, from one round.

    Attributes:
        round: the 0-based round that sampled it.
        example: the task example.
        prompts: ``A`` prompt texts.
        chosen, rejected: ``A`` completion texts each.
        prompt_ids: ``A`` lists of prompt token ids (as the agents saw them).
        chosen_ids, rejected_ids: ``A`` lists of completion token ids (as sampled,
            through the EOS token when one was emitted).
        chosen_reward, rejected_reward: the joint rewards that ordered them (task units,
            after ``reward_processor``; or reward-model scores).
        chosen_source, rejected_source: ``"current"`` or ``"comparator"``.
    """

    round: int
    example: Mapping[str, Any]
    prompts: tuple[str, ...]
    chosen: tuple[str, ...]
    rejected: tuple[str, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    chosen_ids: tuple[tuple[int, ...], ...]
    rejected_ids: tuple[tuple[int, ...], ...]
    chosen_reward: float
    rejected_reward: float
    chosen_source: str
    rejected_source: str

    def to_state(self) -> dict[str, Any]:
        """The pair as plain values (a step checkpoint holds the replay and the round's
        pairs; ``torch.load(weights_only=True)`` reads them back). The example must hold
        plain values too (strings, numbers, lists, dicts), as task examples do."""
        return {
            "round": self.round,
            "example": dict(self.example),
            "prompts": list(self.prompts),
            "chosen": list(self.chosen),
            "rejected": list(self.rejected),
            "prompt_ids": [list(ids) for ids in self.prompt_ids],
            "chosen_ids": [list(ids) for ids in self.chosen_ids],
            "rejected_ids": [list(ids) for ids in self.rejected_ids],
            "chosen_reward": self.chosen_reward,
            "rejected_reward": self.rejected_reward,
            "chosen_source": self.chosen_source,
            "rejected_source": self.rejected_source,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> IterPair:
        """The pair :meth:`to_state` gave (equal to the original)."""

        def ids(rows: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
            return tuple(tuple(int(t) for t in row) for row in rows)

        return cls(
            round=int(state["round"]),
            example=dict(state["example"]),
            prompts=tuple(state["prompts"]),
            chosen=tuple(state["chosen"]),
            rejected=tuple(state["rejected"]),
            prompt_ids=ids(state["prompt_ids"]),
            chosen_ids=ids(state["chosen_ids"]),
            rejected_ids=ids(state["rejected_ids"]),
            chosen_reward=float(state["chosen_reward"]),
            rejected_reward=float(state["rejected_reward"]),
            chosen_source=str(state["chosen_source"]),
            rejected_source=str(state["rejected_source"]),
        )


def row_tokens(batch: Any, row: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Row ``row`` of a :class:`~comlrl.algos.records.PolicyBatch` as ``(prompt ids,
    completion ids)``: the prompt without its left padding, the completion's own tokens
    (through EOS when one was sampled)."""
    width = batch.completion_mask.shape[1]
    start = batch.input_ids.shape[1] - width
    ids, attn = batch.input_ids[row].cpu(), batch.attention_mask[row].cpu()
    prompt = ids[:start][attn[:start].bool()]
    completion = ids[start:][batch.completion_mask[row].cpu()]
    return tuple(int(t) for t in prompt), tuple(int(t) for t in completion)


def joint_pairs(
    pairs: Sequence[IterPair], pad_ids: Sequence[int], device: Any = "cpu"
) -> JointPreferencePairs:
    """``P`` :class:`IterPair` s as one :class:`~comlrl.algos.recipes.preference.pairs.JointPreferencePairs`
    (per agent a :class:`~comlrl.algos.records.PolicyBatch` of ``2P`` rows, group size 2:
    chosen then rejected; prompts left-padded, completions right-padded with
    ``pad_ids[a]``), for :meth:`~comlrl.algos.recipes.preference.madpo.recipe.MADPORecipe.update` and the
    reward model's Bradley-Terry fit.

    Raises:
        ValueError: no pairs.
    """
    if not pairs:
        raise ValueError("joint_pairs needs at least one pair, got 0")
    batches = tuple(
        pack_token_rows(
            [p.prompt_ids[a] for p in pairs],
            [ids for p in pairs for ids in (p.chosen_ids[a], p.rejected_ids[a])],
            group_size=2,
            pad_token_id=int(pad),
            device=device,
        )
        for a, pad in enumerate(pad_ids)
    )
    return JointPreferencePairs(
        examples=tuple(p.example for p in pairs),
        prompts=tuple(p.prompts for p in pairs),
        chosen=tuple(p.chosen for p in pairs),
        rejected=tuple(p.rejected for p in pairs),
        chosen_reward=torch.tensor([p.chosen_reward for p in pairs], dtype=torch.float32),
        rejected_reward=torch.tensor([p.rejected_reward for p in pairs], dtype=torch.float32),
        batches=batches,
    )
