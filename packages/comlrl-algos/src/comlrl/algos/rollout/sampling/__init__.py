"""Sampling: the native loop with a shared-prefix KV cache, the fast Llama-family step and
the graph-captured decode loop.

- :mod:`~comlrl.algos.rollout.sampling.native`: :class:`NativeSampler` and :func:`hf_generate`.
- :mod:`~comlrl.algos.rollout.sampling.decode_loop`: the fixed-shape decode loop whose whole
  step (forward, sampling, log-probs, stop bookkeeping) is replayed as a CUDA graph.
- :mod:`~comlrl.algos.rollout.sampling.draw`: temperature, top-k/top-p filters and
  inverse-CDF draws from the caller's random streams.
- :mod:`~comlrl.algos.rollout.sampling.fast_decode`: :class:`FastDecoder`, the lean decode
  step of Llama-family models, its parts and which models it can run.
- :mod:`~comlrl.algos.rollout.sampling.kv_cache`: preallocated KV caches.
- :mod:`~comlrl.algos.rollout.sampling.collate`: completions to padded policy batches.
- :mod:`~comlrl.algos.rollout.sampling.backends`: the generation-backend interface
  (``native``, ``hf``) that :class:`~comlrl.algos.rollout.agent.HFAgent` calls.
- :mod:`~comlrl.algos.rollout.sampling.vllm_backend`: a colocated vLLM engine per agent
  (extra ``comlrl-algos[vllm]``).
"""

from __future__ import annotations
