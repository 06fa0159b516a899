"""Rollouts: environments, agents, sampling, the rollout tree and evaluation.

- :mod:`~comlrl.algos.rollout.environment`: the :class:`Environment` a rollout talks to (a
  :class:`comlrl.core.Task`, or CoMLRL-style formatter and reward callbacks).
- :mod:`~comlrl.algos.rollout.agent`: :class:`HFAgent`, a Hugging Face causal LM as an agent.
- :mod:`~comlrl.algos.rollout.sampling`: the native sampler, KV cache, fast decode step, vLLM.
- :mod:`~comlrl.algos.rollout.shared_base`: LoRA agents of one base sampling in one batch.
- :mod:`~comlrl.algos.rollout.tree`: :func:`rollout`, sample, score and expand a batch into a
  :class:`~comlrl.algos.records.Rollout`.
- :mod:`~comlrl.algos.rollout.evaluate`: the rollout without an update, on held-out examples.
"""
