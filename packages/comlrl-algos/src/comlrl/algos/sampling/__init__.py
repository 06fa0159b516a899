"""Sampling: the native loop with a shared-prefix KV cache and the fast Llama-family step.

- :mod:`~comlrl.algos.sampling.native`: :class:`NativeSampler` and :func:`hf_generate`.
- :mod:`~comlrl.algos.sampling.decode`: :class:`FastDecoder`, the lean decode step.
- :mod:`~comlrl.algos.sampling.kv_cache`: preallocated KV caches.
- :mod:`~comlrl.algos.sampling.collate`: completions to padded policy batches.
- :mod:`~comlrl.algos.sampling.backends`: the generation-backend interface
  (``native``, ``hf``) that :class:`~comlrl.algos.agent.HFAgent` calls.
- :mod:`~comlrl.algos.sampling.vllm_backend`: a colocated vLLM engine per agent
  (extra ``comlrl-algos[vllm]``).
"""

from __future__ import annotations
