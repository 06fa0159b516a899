"""Preference and supervised recipes: SFT, DPO, MADPO, and MARLHF's joint reward model.

Every recipe reads its log-probs through the shared path
(:func:`comlrl.algos.models.logprobs.completion_logprobs`, which reduces logits with
:func:`comlrl.kernels.token_logprobs`) and its losses from
:mod:`comlrl.algos.functional.preference_losses`. Each loop reads top to bottom:

- :func:`train_sft`: supervised fine-tuning on ``prompt``/``completion`` rows (token-mean
  NLL of the completion tokens only); evaluation is the held-out NLL.
- :func:`train_dpo`: DPO (Rafailov et al. 2023) on ``prompt``/``chosen``/``rejected`` rows
  against a frozen reference model; evaluation is the held-out chosen-vs-rejected margin
  and accuracy.
- :func:`madpo_setup` / :func:`madpo_step` / :func:`train_madpo`: multi-agent DPO. Per
  prompt each agent samples ``K`` candidates with :func:`comlrl.algos.rollout.tree.rollout`,
  the reward function scores the joint actions, :func:`preference_pairs` pairs them by
  reward gap, and every agent takes a step on
  :func:`~comlrl.algos.functional.preference_losses.multi_agent_dpo_loss` against its own frozen
  reference model.
- :class:`JointRewardModel` / :func:`train_reward_model` / :class:`RewardModelReward`:
  MARLHF's joint reward model (LM backbone + linear head on the last token of the joint
  response), trained with the Bradley-Terry loss on the same pairs, then used as the
  reward function of any RL recipe.

The code lives in one module per job, gathered here: :mod:`.config` (the configs),
:mod:`.encoding` (rows as tensors, log-probs), :mod:`.outputs` (loop settings and step
checkpoints), :mod:`.supervised` (SFT, DPO), :mod:`.pairs` (joint-action preference pairs),
:mod:`.madpo` and :mod:`.marlhf.reward_model`. Iterative preference refresh (MADPO-Iter,
MARLHF-Iter) has its own subpackage: :mod:`.iterative.replay` (pairs against a comparator,
replay), :mod:`.iterative.comparator`, :mod:`.iterative.rounds` and :mod:`.iterative.recipe`
(the recipes under the loop driver); the trainer objects are in :mod:`.trainers` and
:mod:`.marlhf.trainer`.

Named axes: ``N`` prompts, ``A`` agents, ``K`` candidates (joint actions) per prompt,
``P`` pairs, ``B`` sequences, ``S`` padded prompt tokens, ``L`` completion tokens, ``H``
hidden size.
"""

from __future__ import annotations

from comlrl.algos.recipes.preference.config import (
    DPOConfig,
    MADPOConfig,
    PreferenceTrainConfig,
    RewardModelConfig,
    SFTConfig,
)
from comlrl.algos.recipes.preference.encoding import _rows as _rows  # the trainers' row check
from comlrl.algos.recipes.preference.encoding import (
    encode_completions,
    sequence_logprobs,
)
from comlrl.algos.recipes.preference.madpo.recipe import (
    MADPORun,
    madpo_checkpoint,
    madpo_evaluate,
    madpo_pair_metrics,
    madpo_resume,
    madpo_setup,
    madpo_step,
    madpo_update,
    train_madpo,
)
from comlrl.algos.recipes.preference.marlhf.reward_model import (
    JointRewardModel,
    RewardModelReward,
    evaluate_reward_model,
    format_joint_text,
    train_reward_model,
)
from comlrl.algos.recipes.preference.outputs import (
    loop_settings,
)
from comlrl.algos.recipes.preference.pairs import JointPreferencePairs, preference_pairs
from comlrl.algos.recipes.preference.supervised.recipe import (
    evaluate_dpo,
    evaluate_sft,
    train_dpo,
    train_sft,
)

__all__ = [
    "PreferenceTrainConfig",
    "SFTConfig",
    "DPOConfig",
    "MADPOConfig",
    "RewardModelConfig",
    "loop_settings",
    "encode_completions",
    "sequence_logprobs",
    "train_sft",
    "evaluate_sft",
    "train_dpo",
    "evaluate_dpo",
    "JointPreferencePairs",
    "preference_pairs",
    "MADPORun",
    "madpo_setup",
    "madpo_step",
    "madpo_update",
    "madpo_pair_metrics",
    "madpo_evaluate",
    "madpo_checkpoint",
    "madpo_resume",
    "train_madpo",
    "format_joint_text",
    "JointRewardModel",
    "train_reward_model",
    "evaluate_reward_model",
    "RewardModelReward",
]
