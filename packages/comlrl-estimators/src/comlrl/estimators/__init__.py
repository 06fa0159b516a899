"""comlrl.estimators: advantages, returns, GAE, joint credit, policy and preference losses
as pure functions over torch tensors.

Nothing here imports transformers, a model or a config object: import these estimators
into your own RL code with torch (and ``comlrl-kernels``, which ``group_advantages`` runs
on) installed. Modules:

- :mod:`~comlrl.estimators.advantages`: group-baseline advantages by estimator name
  (REINFORCE, GRPO mean, leave-one-out mean, leave-one-out max) and the optional std scaling.
- :mod:`~comlrl.estimators.agentwise`: a multi-agent batch's advantages from each agent's
  own statistics or the team's pooled ones (Dr. MAS), and agent x turn groups (AT-GRPO).
- :mod:`~comlrl.estimators.registry`: the estimators by name, and registering your own.
- :mod:`~comlrl.estimators.returns`: discounted returns down a multi-turn rollout tree
  (an early end's reward held for the turns it skips).
- :mod:`~comlrl.estimators.gae`: critic-based returns, GAE and the value loss.
- :mod:`~comlrl.estimators.joint`: joint actions from per-agent completions and credit back.
- :mod:`~comlrl.estimators.losses`: completion masks, the clipped surrogate (token-level,
  or GSPO's sequence-level ratio) with its reference-KL term.
- :mod:`~comlrl.estimators.kl`: the per-token KL estimators to a reference (k1/k2/k3).
- :mod:`~comlrl.estimators.kl_reward`: the reference KL as a penalty on each completion's
  return (KL in the reward, PPO-RLHF's and CoMLRL 1.4.3's).
- :mod:`~comlrl.estimators.importance`: the sampler/trainer mismatch, truncated
  importance sampling (TIS) weights, GSPO's sequence log-ratio.
- :mod:`~comlrl.estimators.preference_losses`: DPO, multi-agent DPO, SFT, Bradley-Terry.
"""

from comlrl.estimators.advantages import compute_advantages, loo_max_baseline
from comlrl.estimators.agentwise import (
    agent_return_moments,
    agent_turn_group_ids,
    agentwise_advantages,
)
from comlrl.estimators.gae import discounted_returns, gae, q_advantages, tree_gae, value_loss
from comlrl.estimators.importance import (
    sampler_mismatch,
    sequence_log_ratio,
    truncated_importance_weights,
)
from comlrl.estimators.joint import credit_completions, joint_action_indices
from comlrl.estimators.kl import kl_penalty
from comlrl.estimators.kl_reward import sequence_kl
from comlrl.estimators.losses import completion_mask, policy_loss
from comlrl.estimators.preference_losses import (
    bradley_terry_loss,
    dpo_loss,
    multi_agent_dpo_loss,
    select_preference_pairs,
    sft_nll,
)
from comlrl.estimators.registry import ESTIMATORS, Estimator, register_estimator
from comlrl.estimators.returns import tree_returns

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "register_estimator",
    "compute_advantages",
    "loo_max_baseline",
    "agentwise_advantages",
    "agent_turn_group_ids",
    "agent_return_moments",
    "tree_returns",
    "discounted_returns",
    "gae",
    "tree_gae",
    "q_advantages",
    "value_loss",
    "credit_completions",
    "joint_action_indices",
    "completion_mask",
    "kl_penalty",
    "sequence_kl",
    "policy_loss",
    "sampler_mismatch",
    "sequence_log_ratio",
    "truncated_importance_weights",
    "dpo_loss",
    "multi_agent_dpo_loss",
    "bradley_terry_loss",
    "sft_nll",
    "select_preference_pairs",
]
