"""Models: loading (Hugging Face folders, Hub ids, the built-in models), value heads and critics,
LoRA adapters, current-policy log-probs, device placement and data-parallel wrapping.

Modules: :mod:`~comlrl.algos.models.loading`, :mod:`~comlrl.algos.models.value`,
:mod:`~comlrl.algos.models.lora`, :mod:`~comlrl.algos.models.logprobs`,
:mod:`~comlrl.algos.models.devices`, :mod:`~comlrl.algos.models.ranks` and
:mod:`~comlrl.algos.models.gradient_sync` (data parallel).
"""
