"""comlrl.algos: advantage estimators, policy-gradient losses, rollouts and training recipes.

Names are exported lazily (PEP 562): ``import comlrl.algos.advantages`` (or ``losses``,
``joint``, ``returns``) loads torch and ``comlrl.kernels`` only, never ``transformers``;
``from comlrl.algos import HFAgent`` imports the sampling stack when it is first used.
The rollout stage is ``comlrl.algos.rollout.rollout`` (the module shares its name).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> module that defines it.
_EXPORTS: dict[str, str] = {
    "ESTIMATORS": "advantages",
    "compute_advantages": "advantages",
    "register_estimator": "advantages",
    "completion_mask": "losses",
    "kl_penalty": "losses",
    "policy_loss": "losses",
    "credit_completions": "joint",
    "joint_action_indices": "joint",
    "tree_returns": "returns",
    "PolicyBatch": "records",
    "AgentSamples": "records",
    "TurnRollout": "records",
    "Rollout": "records",
    "Branch": "env",
    "TaskEnvironment": "env",
    "CallbackEnvironment": "env",
    "TreeSettings": "rollout",
    "UpdateSettings": "update",
    "update_policy": "update",
    "HFAgent": "agent",
    "ConfigError": "config",
    "TaskConfig": "config",
    "TrainConfig": "config",
    "load_config": "config",
    "DEFAULT_MODEL": "models",
    "build_default_model": "models",
    "build_default_tokenizer": "models",
    "load_model_and_tokenizer": "models",
    "MultiAgentTrainer": "trainer",
    "MAGRPOTrainer": "trainer",
    "MARLOOTrainer": "trainer",
    "MAReMaxTrainer": "trainer",
    "MAREINFORCETrainer": "trainer",
    "save_agent_checkpoint": "run",
    "dpo_loss": "preference_losses",
    "multi_agent_dpo_loss": "preference_losses",
    "bradley_terry_loss": "preference_losses",
    "sft_nll": "preference_losses",
    "select_preference_pairs": "preference_losses",
    "SFTConfig": "recipes.preference",
    "DPOConfig": "recipes.preference",
    "MADPOConfig": "recipes.preference",
    "RewardModelConfig": "recipes.preference",
    "JointRewardModel": "recipes.preference",
    "RewardModelReward": "recipes.preference",
    "SFTTrainer": "preference_trainers",
    "DPOTrainer": "preference_trainers",
    "MADPOTrainer": "preference_trainers",
    "MARLHFTrainer": "preference_trainers",
    "discounted_returns": "gae",
    "gae": "gae",
    "tree_gae": "gae",
    "q_advantages": "gae",
    "value_loss": "gae",
    "ValueHead": "value",
    "Critic": "value",
    "save_value_head": "value",
    "load_value_head": "value",
    "IACTrainer": "actor_critic_trainer",
    "MAACTrainer": "actor_critic_trainer",
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
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'comlrl.algos' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"comlrl.algos.{module}"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs; never executed
    from comlrl.algos.actor_critic_trainer import IACTrainer, MAACTrainer
    from comlrl.algos.advantages import ESTIMATORS, compute_advantages, register_estimator
    from comlrl.algos.agent import HFAgent
    from comlrl.algos.config import ConfigError, TaskConfig, TrainConfig, load_config
    from comlrl.algos.env import Branch, CallbackEnvironment, TaskEnvironment
    from comlrl.algos.gae import discounted_returns, gae, q_advantages, tree_gae, value_loss
    from comlrl.algos.joint import credit_completions, joint_action_indices
    from comlrl.algos.losses import completion_mask, kl_penalty, policy_loss
    from comlrl.algos.models import (
        DEFAULT_MODEL,
        build_default_model,
        build_default_tokenizer,
        load_model_and_tokenizer,
    )
    from comlrl.algos.preference_losses import (
        bradley_terry_loss,
        dpo_loss,
        multi_agent_dpo_loss,
        select_preference_pairs,
        sft_nll,
    )
    from comlrl.algos.preference_trainers import (
        DPOTrainer,
        MADPOTrainer,
        MARLHFTrainer,
        SFTTrainer,
    )
    from comlrl.algos.recipes.preference import (
        DPOConfig,
        JointRewardModel,
        MADPOConfig,
        RewardModelConfig,
        RewardModelReward,
        SFTConfig,
    )
    from comlrl.algos.records import AgentSamples, PolicyBatch, Rollout, TurnRollout
    from comlrl.algos.returns import tree_returns
    from comlrl.algos.rollout import TreeSettings
    from comlrl.algos.run import save_agent_checkpoint
    from comlrl.algos.trainer import (
        MAGRPOTrainer,
        MAREINFORCETrainer,
        MAReMaxTrainer,
        MARLOOTrainer,
        MultiAgentTrainer,
    )
    from comlrl.algos.update import UpdateSettings, update_policy
    from comlrl.algos.value import Critic, ValueHead, load_value_head, save_value_head
