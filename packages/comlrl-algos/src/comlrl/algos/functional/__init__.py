"""Pure functions over tensors: advantages, returns, GAE, joint credit, policy and preference losses.

Nothing under :mod:`comlrl.algos.functional` imports transformers: import these estimators into
your own RL code with only torch installed. Modules:

- :mod:`~comlrl.algos.functional.advantages`: group-baseline estimators (REINFORCE, GRPO mean,
  leave-one-out mean, leave-one-out max) by name, and the optional std scaling.
- :mod:`~comlrl.algos.functional.returns`: discounted returns down a multi-turn rollout tree
  (an early end's reward held for the turns it skips).
- :mod:`~comlrl.algos.functional.gae`: critic-based returns, GAE and the value loss.
- :mod:`~comlrl.algos.functional.joint`: joint actions from per-agent completions and credit back.
- :mod:`~comlrl.algos.functional.losses`: completion masks, reference KL, clipped surrogate
  (token-level, or GSPO's sequence-level ratio).
- :mod:`~comlrl.algos.functional.importance`: the sampler/trainer mismatch, truncated
  importance sampling (TIS) weights, GSPO's sequence log-ratio.
- :mod:`~comlrl.algos.functional.preference_losses`: DPO, multi-agent DPO, SFT, Bradley-Terry.
"""
