"""The fast decode step: one new token for a batch of Llama-family sequences without the
Hugging Face forward's per-call overhead.

- :mod:`~comlrl.algos.rollout.sampling.fast_decode.decoder`: :class:`FastDecoder`, the step
  itself (embedding to logits, the KV cache written in place).
- :mod:`~comlrl.algos.rollout.sampling.fast_decode.support`: which models it can run.
- :mod:`~comlrl.algos.rollout.sampling.fast_decode.layers`: one decoder layer's weights, cache
  and maths (:class:`DecodeLayer`, :func:`rms_norm`).
- :mod:`~comlrl.algos.rollout.sampling.fast_decode.linears`: each projection as ``F.linear``
  or the C++ few-rows GEMV, with its LoRA delta where it has adapters.
- :mod:`~comlrl.algos.rollout.sampling.fast_decode.lora`: LoRA adapters per block of rows
  (several agents on one base in one step).
- :mod:`~comlrl.algos.rollout.sampling.fast_decode.cpp_step`: the whole step as one C++ call
  (:class:`comlrl.kernels.DecodeStep`) for small float32 CPU models.
"""
