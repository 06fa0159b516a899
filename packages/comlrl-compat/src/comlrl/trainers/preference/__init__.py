"""CoMLRL 1.4.3's preference trainers (``comlrl.trainers.preference``).

:class:`MADPOTrainer` is CoMLRL 1.4.3's MADPO: before training, per training prompt,
``preference_num_candidates`` joint actions are sampled from the initial policy and scored
by the reward, and pairs are formed within the prompt (``pair_selection``,
``preference_pairs_per_sample`` kept; :mod:`comlrl.trainers._madpo_pairs`); then
``num_train_epochs`` epochs over those pairs, ``train_batch_size`` pairs per step, every
agent on its own term of the joint DPO loss (Rafailov et al. 2023, eq. 7, joint log-ratio
summed over agents) without a reference model (``log pi_ref = 0``), as 1.4.3
(:func:`comlrl.algos.recipes.preference.madpo.recipe.madpo_update`).

:class:`MARLHFTrainer` fits a joint reward model on pairs labelled by the task reward
(Bradley-Terry), then trains the agents with the MAGRPO family or IAC/MAAC on that model's
scores (:class:`comlrl.algos.MARLHFTrainer` for the pairs and the reward model, the
trainers of :mod:`comlrl.trainers.reinforce` / :mod:`comlrl.trainers.actor_critic` for
the RL stage).
"""

from __future__ import annotations

from comlrl.algos.recipes.preference.marlhf.reward_model import JointRewardModel
from comlrl.trainers._centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl.trainers.preference.iterative import (
    MADPOIterConfig,
    MADPOIterTrainer,
    MARLHFIterConfig,
    MARLHFIterTrainer,
)
from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer
from comlrl.trainers.preference.marlhf import MARLHFConfig, MARLHFTrainer

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "JointRewardModel",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "TaggedCentralizedComparatorAdapter",
]
