"""comlrl.algos: advantage estimators, policy-gradient losses, rollouts and training recipes.

Names are exported lazily (PEP 562): ``import comlrl.estimators.advantages`` (or ``losses``,
``joint``, ``returns``) loads torch and ``comlrl.kernels`` only, never ``transformers``;
``from comlrl.algos import HFAgent`` imports the sampling stack when it is first used.
The rollout stage is :func:`comlrl.algos.rollout.tree.rollout`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> module that defines it (relative to comlrl.algos, or a whole module path:
#: the estimators and losses of comlrl-estimators are exported here too).
_EXPORTS: dict[str, str] = {
    "ESTIMATORS": "comlrl.estimators.registry",
    "compute_advantages": "comlrl.estimators.advantages",
    "register_estimator": "comlrl.estimators.registry",
    "completion_mask": "comlrl.estimators.losses",
    "kl_penalty": "comlrl.estimators.kl",
    "policy_loss": "comlrl.estimators.losses",
    "credit_completions": "comlrl.estimators.joint",
    "joint_action_indices": "comlrl.estimators.joint",
    "tree_returns": "comlrl.estimators.returns",
    "PolicyBatch": "records",
    "AgentSamples": "records",
    "TurnRollout": "records",
    "Rollout": "records",
    "Branch": "rollout.environment",
    "TaskEnvironment": "rollout.environment",
    "CallbackEnvironment": "rollout.environment",
    "TreeSettings": "rollout.tree",
    "UpdateSettings": "training.update.settings",
    "update_policy": "training.update.policy",
    "HFAgent": "rollout.agent",
    "ConfigError": "training.config.rl",
    "TaskConfig": "training.config.task",
    "TrainConfig": "training.config.rl",
    "load_config": "training.config.rl",
    "DEFAULT_MODEL": "models.loading",
    "build_default_model": "models.loading",
    "build_default_tokenizer": "models.loading",
    "load_model_and_tokenizer": "models.loading",
    "MultiAgentTrainer": "recipes.group_baseline.recipe",
    "MAGRPOTrainer": "recipes.group_baseline.recipe",
    "MARLOOTrainer": "recipes.group_baseline.recipe",
    "MAReMaxTrainer": "recipes.group_baseline.recipe",
    "MAREINFORCETrainer": "recipes.group_baseline.recipe",
    "save_agent_checkpoint": "training.run.saving",
    "dpo_loss": "comlrl.estimators.preference_losses",
    "multi_agent_dpo_loss": "comlrl.estimators.preference_losses",
    "bradley_terry_loss": "comlrl.estimators.preference_losses",
    "sft_nll": "comlrl.estimators.preference_losses",
    "select_preference_pairs": "comlrl.estimators.preference_losses",
    "SFTConfig": "recipes.preference.supervised.config",
    "DPOConfig": "recipes.preference.supervised.config",
    "MADPOConfig": "recipes.preference.madpo.config",
    "RewardModelConfig": "recipes.preference.marlhf.config",
    "JointRewardModel": "recipes.preference.marlhf.reward_model",
    "RewardModelReward": "recipes.preference.marlhf.reward_model",
    "SFTTrainer": "recipes.preference.supervised.recipe",
    "DPOTrainer": "recipes.preference.supervised.recipe",
    "MADPOTrainer": "recipes.preference.madpo.recipe",
    "MARLHFTrainer": "recipes.preference.marlhf.recipe",
    "MARLHFConfig": "recipes.preference.marlhf.config",
    "SFTRecipe": "recipes.preference.supervised.recipe",
    "DPORecipe": "recipes.preference.supervised.recipe",
    "MADPORecipe": "recipes.preference.madpo.recipe",
    "MARLHFRecipe": "recipes.preference.marlhf.recipe",
    "MADPOIterRecipe": "recipes.preference.iterative.recipe",
    "MARLHFIterRecipe": "recipes.preference.iterative.recipe",
    "discounted_returns": "comlrl.estimators.gae",
    "gae": "comlrl.estimators.gae",
    "tree_gae": "comlrl.estimators.gae",
    "q_advantages": "comlrl.estimators.gae",
    "value_loss": "comlrl.estimators.gae",
    "ValueHead": "models.value",
    "Critic": "models.value",
    "save_value_head": "models.value",
    "load_value_head": "models.value",
    "IACTrainer": "recipes.actor_critic.recipe",
    "MAACTrainer": "recipes.actor_critic.recipe",
    # the names comlrl-compat (comlrl.trainers) uses beside the ones above
    "ActorCriticConfig": "recipes.actor_critic.config",
    "AGENT_REWARDS_KEY": "recipes.actor_critic.critic",
    "RoleFormat": "rollout.joint_policy",
    "RoleParseError": "rollout.joint_policy",
    "TaggedRoles": "rollout.joint_policy",
    "CentralizedReward": "rollout.joint_policy",
    "check_role_format": "rollout.joint_policy",
    "centralized_callbacks": "rollout.joint_policy",
    # the preference names comlrl-compat (comlrl.trainers.preference) uses
    "build_rounds": "recipes.preference.iterative.recipe",
    "IterativeSection": "recipes.preference.config",
    "DataStream": "training.run.data",
    # the recipes' end-to-end runs (config to final checkpoint, resumable): what `comlrl train` runs
    "RunOutputs": "training.run.outputs",
    "launch": "recipes.launch",
    "run_recipe": "recipes.registry",
    "GroupBaselineRecipe": "recipes.group_baseline.recipe",
    "ActorCriticRecipe": "recipes.actor_critic.recipe",
    "RunResult": "recipes.launch",
}

__all__ = [
    "ESTIMATORS",
    "compute_advantages",
    "register_estimator",
    "completion_mask",
    "kl_penalty",
    "policy_loss",
    "credit_completions",
    "joint_action_indices",
    "tree_returns",
    "PolicyBatch",
    "AgentSamples",
    "TurnRollout",
    "Rollout",
    "Branch",
    "TaskEnvironment",
    "CallbackEnvironment",
    "TreeSettings",
    "UpdateSettings",
    "update_policy",
    "HFAgent",
    "ConfigError",
    "TaskConfig",
    "TrainConfig",
    "load_config",
    "DEFAULT_MODEL",
    "build_default_model",
    "build_default_tokenizer",
    "load_model_and_tokenizer",
    "MultiAgentTrainer",
    "MAGRPOTrainer",
    "MARLOOTrainer",
    "MAReMaxTrainer",
    "MAREINFORCETrainer",
    "save_agent_checkpoint",
    "dpo_loss",
    "multi_agent_dpo_loss",
    "bradley_terry_loss",
    "sft_nll",
    "select_preference_pairs",
    "SFTConfig",
    "DPOConfig",
    "MADPOConfig",
    "RewardModelConfig",
    "JointRewardModel",
    "RewardModelReward",
    "SFTTrainer",
    "DPOTrainer",
    "MADPOTrainer",
    "MARLHFTrainer",
    "MARLHFConfig",
    "SFTRecipe",
    "DPORecipe",
    "MADPORecipe",
    "MARLHFRecipe",
    "MADPOIterRecipe",
    "MARLHFIterRecipe",
    "discounted_returns",
    "gae",
    "tree_gae",
    "q_advantages",
    "value_loss",
    "ValueHead",
    "Critic",
    "save_value_head",
    "load_value_head",
    "IACTrainer",
    "MAACTrainer",
    "ActorCriticConfig",
    "AGENT_REWARDS_KEY",
    "RoleFormat",
    "RoleParseError",
    "TaggedRoles",
    "CentralizedReward",
    "check_role_format",
    "centralized_callbacks",
    "build_rounds",
    "IterativeSection",
    "DataStream",
    "RunOutputs",
    "RunResult",
    "launch",
    "run_recipe",
    "GroupBaselineRecipe",
    "ActorCriticRecipe",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'comlrl.algos' has no attribute {name!r}")
    # a path under comlrl.algos, or a whole one (the estimators live in comlrl.estimators)
    path = module if module.startswith("comlrl.") else f"comlrl.algos.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs; never executed
    from comlrl.algos.models.loading import (
        DEFAULT_MODEL,
        build_default_model,
        build_default_tokenizer,
        load_model_and_tokenizer,
    )
    from comlrl.algos.models.value import Critic, ValueHead, load_value_head, save_value_head
    from comlrl.algos.recipes.actor_critic.config import ActorCriticConfig
    from comlrl.algos.recipes.actor_critic.critic import AGENT_REWARDS_KEY
    from comlrl.algos.recipes.actor_critic.recipe import ActorCriticRecipe, IACTrainer, MAACTrainer
    from comlrl.algos.recipes.group_baseline.recipe import (
        GroupBaselineRecipe,
        MAGRPOTrainer,
        MAREINFORCETrainer,
        MAReMaxTrainer,
        MARLOOTrainer,
        MultiAgentTrainer,
    )
    from comlrl.algos.recipes.launch import RunResult, launch
    from comlrl.algos.recipes.preference.config import IterativeSection
    from comlrl.algos.recipes.preference.iterative.recipe import (
        MADPOIterRecipe,
        MARLHFIterRecipe,
        build_rounds,
    )
    from comlrl.algos.recipes.preference.madpo.config import MADPOConfig
    from comlrl.algos.recipes.preference.madpo.recipe import MADPORecipe, MADPOTrainer
    from comlrl.algos.recipes.preference.marlhf.config import MARLHFConfig, RewardModelConfig
    from comlrl.algos.recipes.preference.marlhf.recipe import MARLHFRecipe, MARLHFTrainer
    from comlrl.algos.recipes.preference.marlhf.reward_model import (
        JointRewardModel,
        RewardModelReward,
    )
    from comlrl.algos.recipes.preference.supervised.config import DPOConfig, SFTConfig
    from comlrl.algos.recipes.preference.supervised.recipe import (
        DPORecipe,
        DPOTrainer,
        SFTRecipe,
        SFTTrainer,
    )
    from comlrl.algos.recipes.registry import run_recipe
    from comlrl.algos.records import AgentSamples, PolicyBatch, Rollout, TurnRollout
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.rollout.environment import Branch, CallbackEnvironment, TaskEnvironment
    from comlrl.algos.rollout.joint_policy import (
        CentralizedReward,
        RoleFormat,
        RoleParseError,
        TaggedRoles,
        centralized_callbacks,
        check_role_format,
    )
    from comlrl.algos.rollout.tree import TreeSettings
    from comlrl.algos.training.config.rl import ConfigError, TrainConfig, load_config
    from comlrl.algos.training.config.task import TaskConfig
    from comlrl.algos.training.run.data import DataStream
    from comlrl.algos.training.run.outputs import RunOutputs
    from comlrl.algos.training.run.saving import save_agent_checkpoint
    from comlrl.algos.training.update.policy import update_policy
    from comlrl.algos.training.update.settings import UpdateSettings
    from comlrl.estimators.advantages import compute_advantages
    from comlrl.estimators.gae import discounted_returns, gae, q_advantages, tree_gae, value_loss
    from comlrl.estimators.joint import credit_completions, joint_action_indices
    from comlrl.estimators.kl import kl_penalty
    from comlrl.estimators.losses import completion_mask, policy_loss
    from comlrl.estimators.preference_losses import (
        bradley_terry_loss,
        dpo_loss,
        multi_agent_dpo_loss,
        select_preference_pairs,
        sft_nll,
    )
    from comlrl.estimators.registry import ESTIMATORS, register_estimator
    from comlrl.estimators.returns import tree_returns
