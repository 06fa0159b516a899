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
    "kl_penalty": "comlrl.estimators.losses",
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
    "UpdateSettings": "training.update",
    "update_policy": "training.update",
    "HFAgent": "rollout.agent",
    "ConfigError": "training.config",
    "TaskConfig": "training.task_config",
    "TrainConfig": "training.config",
    "load_config": "training.config",
    "DEFAULT_MODEL": "models.loading",
    "build_default_model": "models.loading",
    "build_default_tokenizer": "models.loading",
    "load_model_and_tokenizer": "models.loading",
    "MultiAgentTrainer": "recipes.group_baseline.trainer",
    "MAGRPOTrainer": "recipes.group_baseline.trainer",
    "MARLOOTrainer": "recipes.group_baseline.trainer",
    "MAReMaxTrainer": "recipes.group_baseline.trainer",
    "MAREINFORCETrainer": "recipes.group_baseline.trainer",
    "save_agent_checkpoint": "training.saving",
    "dpo_loss": "comlrl.estimators.preference_losses",
    "multi_agent_dpo_loss": "comlrl.estimators.preference_losses",
    "bradley_terry_loss": "comlrl.estimators.preference_losses",
    "sft_nll": "comlrl.estimators.preference_losses",
    "select_preference_pairs": "comlrl.estimators.preference_losses",
    "SFTConfig": "recipes.preference.config",
    "DPOConfig": "recipes.preference.config",
    "MADPOConfig": "recipes.preference.config",
    "RewardModelConfig": "recipes.preference.config",
    "JointRewardModel": "recipes.preference.marlhf.reward_model",
    "RewardModelReward": "recipes.preference.marlhf.reward_model",
    "SFTTrainer": "recipes.preference.supervised.trainer",
    "DPOTrainer": "recipes.preference.supervised.trainer",
    "MADPOTrainer": "recipes.preference.madpo.trainer",
    "MARLHFTrainer": "recipes.preference.marlhf.trainer",
    "discounted_returns": "comlrl.estimators.gae",
    "gae": "comlrl.estimators.gae",
    "tree_gae": "comlrl.estimators.gae",
    "q_advantages": "comlrl.estimators.gae",
    "value_loss": "comlrl.estimators.gae",
    "ValueHead": "models.value",
    "Critic": "models.value",
    "save_value_head": "models.value",
    "load_value_head": "models.value",
    "IACTrainer": "recipes.actor_critic.trainer",
    "MAACTrainer": "recipes.actor_critic.trainer",
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
    "IterativeMADPOConfig": "recipes.preference.config",
    "MADPOIterRun": "recipes.preference.iterative.recipe",
    "build_rounds": "recipes.preference.iterative.recipe",
    "train_madpo_iter": "recipes.preference.iterative.recipe",
    "madpo_iter_resume": "recipes.preference.iterative.checkpoint",
    "IterativeSection": "recipes.preference.config",
    "MARLHFIterRun": "recipes.preference.iterative.recipe",
    "train_marlhf_iter": "recipes.preference.iterative.recipe",
    "marlhf_iter_resume": "recipes.preference.iterative.checkpoint",
    "DataStream": "training.data",
    # the recipes' end-to-end runs (config to final checkpoint, resumable): what `comlrl train` runs
    "RunOutputs": "recipes.run_steps",
    "RunResult": "recipes.run_steps",
    "run_group_baseline": "recipes.group_baseline.run",
    "run_iac": "recipes.actor_critic.run",
    "run_maac": "recipes.actor_critic.run",
    "SFTRunConfig": "recipes.preference.supervised.run",
    "run_sft": "recipes.preference.supervised.run",
    "DPORunConfig": "recipes.preference.supervised.run",
    "run_dpo": "recipes.preference.supervised.run",
    "MADPORunConfig": "recipes.preference.madpo.run",
    "run_madpo": "recipes.preference.madpo.run",
    "MARLHFRunConfig": "recipes.preference.marlhf.run",
    "run_marlhf": "recipes.preference.marlhf.run",
    "MADPOIterRunConfig": "recipes.preference.iterative.run",
    "run_madpo_iter": "recipes.preference.iterative.run",
    "MARLHFIterRunConfig": "recipes.preference.iterative.run",
    "run_marlhf_iter": "recipes.preference.iterative.run",
    "CentralizedRunConfig": "recipes.centralized.run",
    "run_centralized_magrpo": "recipes.centralized.run",
    "CentralizedMADPORunConfig": "recipes.centralized.run",
    "run_centralized_madpo": "recipes.centralized.run",
    "CentralizedMARLHFRunConfig": "recipes.centralized.run",
    "run_centralized_marlhf": "recipes.centralized.run",
    "CentralizedMADPOIterRunConfig": "recipes.centralized.run",
    "run_centralized_madpo_iter": "recipes.centralized.run",
    "CentralizedMARLHFIterRunConfig": "recipes.centralized.run",
    "run_centralized_marlhf_iter": "recipes.centralized.run",
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
    "IterativeMADPOConfig",
    "MADPOIterRun",
    "build_rounds",
    "train_madpo_iter",
    "madpo_iter_resume",
    "IterativeSection",
    "MARLHFIterRun",
    "train_marlhf_iter",
    "marlhf_iter_resume",
    "DataStream",
    "RunOutputs",
    "RunResult",
    "run_group_baseline",
    "run_iac",
    "run_maac",
    "SFTRunConfig",
    "run_sft",
    "DPORunConfig",
    "run_dpo",
    "MADPORunConfig",
    "run_madpo",
    "MARLHFRunConfig",
    "run_marlhf",
    "MADPOIterRunConfig",
    "run_madpo_iter",
    "MARLHFIterRunConfig",
    "run_marlhf_iter",
    "CentralizedRunConfig",
    "run_centralized_magrpo",
    "CentralizedMADPORunConfig",
    "run_centralized_madpo",
    "CentralizedMARLHFRunConfig",
    "run_centralized_marlhf",
    "CentralizedMADPOIterRunConfig",
    "run_centralized_madpo_iter",
    "CentralizedMARLHFIterRunConfig",
    "run_centralized_marlhf_iter",
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
    from comlrl.algos.recipes.actor_critic.run import run_iac, run_maac
    from comlrl.algos.recipes.actor_critic.trainer import IACTrainer, MAACTrainer
    from comlrl.algos.recipes.centralized.run import (
        CentralizedMADPOIterRunConfig,
        CentralizedMADPORunConfig,
        CentralizedMARLHFIterRunConfig,
        CentralizedMARLHFRunConfig,
        CentralizedRunConfig,
        run_centralized_madpo,
        run_centralized_madpo_iter,
        run_centralized_magrpo,
        run_centralized_marlhf,
        run_centralized_marlhf_iter,
    )
    from comlrl.algos.recipes.group_baseline.run import run_group_baseline
    from comlrl.algos.recipes.group_baseline.trainer import (
        MAGRPOTrainer,
        MAREINFORCETrainer,
        MAReMaxTrainer,
        MARLOOTrainer,
        MultiAgentTrainer,
    )
    from comlrl.algos.recipes.preference.config import (
        DPOConfig,
        IterativeMADPOConfig,
        IterativeSection,
        MADPOConfig,
        RewardModelConfig,
        SFTConfig,
    )
    from comlrl.algos.recipes.preference.iterative.checkpoint import (
        madpo_iter_resume,
        marlhf_iter_resume,
    )
    from comlrl.algos.recipes.preference.iterative.recipe import (
        MADPOIterRun,
        MARLHFIterRun,
        build_rounds,
        train_madpo_iter,
        train_marlhf_iter,
    )
    from comlrl.algos.recipes.preference.iterative.run import (
        MADPOIterRunConfig,
        MARLHFIterRunConfig,
        run_madpo_iter,
        run_marlhf_iter,
    )
    from comlrl.algos.recipes.preference.madpo.run import MADPORunConfig, run_madpo
    from comlrl.algos.recipes.preference.madpo.trainer import MADPOTrainer
    from comlrl.algos.recipes.preference.marlhf.reward_model import (
        JointRewardModel,
        RewardModelReward,
    )
    from comlrl.algos.recipes.preference.marlhf.run import MARLHFRunConfig, run_marlhf
    from comlrl.algos.recipes.preference.marlhf.trainer import MARLHFTrainer
    from comlrl.algos.recipes.preference.supervised.run import (
        DPORunConfig,
        SFTRunConfig,
        run_dpo,
        run_sft,
    )
    from comlrl.algos.recipes.preference.supervised.trainer import DPOTrainer, SFTTrainer
    from comlrl.algos.recipes.run_steps import RunOutputs, RunResult
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
    from comlrl.algos.training.config import ConfigError, TrainConfig, load_config
    from comlrl.algos.training.data import DataStream
    from comlrl.algos.training.saving import save_agent_checkpoint
    from comlrl.algos.training.task_config import TaskConfig
    from comlrl.algos.training.update import UpdateSettings, update_policy
    from comlrl.estimators.advantages import compute_advantages
    from comlrl.estimators.gae import (
        discounted_returns,
        gae,
        q_advantages,
        tree_gae,
        value_loss,
    )
    from comlrl.estimators.joint import credit_completions, joint_action_indices
    from comlrl.estimators.losses import completion_mask, kl_penalty, policy_loss
    from comlrl.estimators.preference_losses import (
        bradley_terry_loss,
        dpo_loss,
        multi_agent_dpo_loss,
        select_preference_pairs,
        sft_nll,
    )
    from comlrl.estimators.registry import ESTIMATORS, register_estimator
    from comlrl.estimators.returns import tree_returns
