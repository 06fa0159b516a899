"""comlrl.kernels: fused kernels for CoMLRL training.

- :func:`token_logprobs`: per-token log-probs (and entropy) from logits, with a backward
  that recomputes softmax from the saved log-sum-exp (no float32 [N, V] tensor).
- :func:`linear_token_logprobs`: the same fused with the lm_head matmul, chunked over
  tokens so the full logits never exist.
- :func:`group_advantages`: per-group baselines (none/mean/loo/max) and std scaling.
- :func:`linear_rows`: ``F.linear`` for a few float32 CPU rows (the GEMVs of a decode
  step) at memory speed; ``F.linear`` serves everything else. :class:`FewRowsLinear`
  checks the weight once for loops that call it many times.
- :class:`DecodeStep`: one whole decode step of a Llama-family LM (embedding to logits,
  KV cache written in place) as a single C++ call on float32 CPU tensors, for small models
  whose Python decode step is mostly dispatch overhead.
- :func:`sample_tokens`: a decode loop's per-token sampling (temperature, top-k, top-p,
  inverse-CDF draw from given uniforms, full-softmax log-prob, EOS/done bookkeeping) as
  one C++ call on float32 CPU logits.

Each op has a pure-torch reference (``comlrl.kernels._reference``) that is also its
spec. Per call, CUDA tensors go to the CUDA module and CPU tensors to the C++ module when
they were compiled, else to the reference; see :func:`backend_info` and
:func:`use_backend` (or the ``COMLRL_KERNELS_BACKEND`` environment variable).
"""

from __future__ import annotations

from ._decode_step import DecodeLayerWeights, DecodeStep, decode_step_unavailable
from ._dispatch import BackendUnavailableError, backend_info, use_backend
from ._group_advantages import group_advantages
from ._linear_rows import FewRowsLinear, linear_rows
from ._linear_token_logprobs import linear_token_logprobs
from ._sample_tokens import sample_tokens, sample_tokens_unavailable
from ._token_logprobs import token_logprobs

__all__ = [
    "BackendUnavailableError",
    "DecodeLayerWeights",
    "DecodeStep",
    "FewRowsLinear",
    "backend_info",
    "decode_step_unavailable",
    "group_advantages",
    "linear_rows",
    "linear_token_logprobs",
    "sample_tokens",
    "sample_tokens_unavailable",
    "token_logprobs",
    "use_backend",
]
