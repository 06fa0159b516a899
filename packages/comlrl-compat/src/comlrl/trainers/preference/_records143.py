"""CoMLRL 1.4.3's preference-pair records (importable from
``comlrl.trainers.preference.madpo``, as in 1.4.3): a 1.4.3-style trainer assembled by
hand may hold them, and a checkpoint of such a trainer stores them
(:mod:`comlrl.utils._trainer_snapshot`). Our MADPO keeps its pairs as
:class:`comlrl.trainers._madpo_pairs` values instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AgentPreferenceTensors", "PreferencePair"]


@dataclass
class AgentPreferenceTensors:
    """One agent's token ids of a pair: the prompt, the preferred and the other completion
    (1-D ``int64`` tensors)."""

    prompt_input_ids: torch.Tensor
    winner_completion_ids: torch.Tensor
    loser_completion_ids: torch.Tensor


@dataclass
class PreferencePair:
    """A preferred and a dispreferred joint action for one prompt.

    Attributes:
        prompts, winner_completions, loser_completions: one text per agent.
        agent_tensors: one :class:`AgentPreferenceTensors` per agent.
        winner_reward, loser_reward: the two joint actions' rewards (after the processor).
        candidate_reward_mean: the mean reward of the prompt's candidates.
        raw_rewards, target_raw_reward, comparator_raw_reward: rewards before the
            processor, when recorded.
    """

    prompts: list[str]
    winner_completions: list[str]
    loser_completions: list[str]
    agent_tensors: list[AgentPreferenceTensors]
    winner_reward: float
    loser_reward: float
    candidate_reward_mean: float
    raw_rewards: list[float] | None = None
    target_raw_reward: float | None = None
    comparator_raw_reward: float | None = None
