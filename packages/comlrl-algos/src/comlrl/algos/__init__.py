"""comlrl.algos: advantage estimators, policy-gradient losses and multi-agent trainers."""

from __future__ import annotations

from comlrl.algos.advantages import ESTIMATORS, compute_advantages, register_estimator
from comlrl.algos.agent import GenerationBatch, HFAgent
from comlrl.algos.config import ConfigError, TaskConfig, TrainConfig, load_config
from comlrl.algos.joint import credit_completions, joint_action_indices
from comlrl.algos.losses import completion_mask, kl_penalty, policy_loss
from comlrl.algos.models import (
    DEFAULT_MODEL,
    build_default_model,
    build_default_tokenizer,
    load_model_and_tokenizer,
)
from comlrl.algos.trainer import MAGRPOTrainer, MultiAgentTrainer, save_agent_checkpoint

__all__ = [
    "ESTIMATORS",
    "compute_advantages",
    "register_estimator",
    "GenerationBatch",
    "HFAgent",
    "ConfigError",
    "TaskConfig",
    "TrainConfig",
    "load_config",
    "credit_completions",
    "joint_action_indices",
    "completion_mask",
    "kl_penalty",
    "policy_loss",
    "DEFAULT_MODEL",
    "build_default_model",
    "build_default_tokenizer",
    "load_model_and_tokenizer",
    "MAGRPOTrainer",
    "MultiAgentTrainer",
    "save_agent_checkpoint",
]
