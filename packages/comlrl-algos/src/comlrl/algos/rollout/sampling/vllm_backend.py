"""A colocated vLLM engine per agent as a generation backend (extra ``comlrl-algos[vllm]``).

Targets vLLM 0.32 (the release built against torch 2.13); the APIs used are
``vllm.LLM`` (``generate`` on token-id prompts, ``SamplingParams(n=G, logprobs=0)``,
``logprobs_mode``), ``LoRARequest`` (``load_inplace``) and vLLM's weight-transfer API
for colocated training (``WeightTransferConfig(backend="ipc")`` on the engine, an
``IPCTrainerWeightTransferEngine`` over a ``ModuleSource`` of the training model on the
trainer side; see vLLM's "Weight Transfer" guide).

How it fits CoMLRL:

- One engine per agent, built on the agent's first :meth:`VLLMBackend.sample` (after the
  recipe has moved the model to its GPU), taking ``gpu_memory_utilization`` of the GPU.
- Prompts go in as token ids (the training tokenizer's, padding removed), so the
  :class:`~comlrl.algos.records.PolicyBatch` holds exactly the ids the engine saw.
- Stopping is the agent's: ``stop_token_ids`` = the agent's EOS ids and ``ignore_eos``
  (the engine's own EOS list is not used), so a completion ends at its first EOS or at
  ``max_new_tokens``, as with the native sampler; the first EOS is kept, the rest of
  the row is the pad id.
- ``G`` completions per prompt come from one request with ``n=G``, ordered by
  ``CompletionOutput.index``; rows are node-major like the native sampler's.
- Weights: before sampling, the engine is brought up to date when the training model's
  parameters changed since the last push (torch's in-place version counters; an
  optimizer step bumps them) or :meth:`VLLMBackend.after_update` was called. A full
  model is pushed through vLLM's IPC weight transfer; a ``peft`` model is saved as an
  adapter and given to the engine as a ``LoRARequest`` (reloaded in place after each
  update), the engine keeping the frozen base weights.
- Behaviour log-probs are, as everywhere in CoMLRL, those of the full tempered softmax
  ``log_softmax(logits / T)`` at the sampled token, the distribution the update computes
  its log-probs from (one distribution for both, so the first PPO ratio is 1).
  ``"engine"`` takes them from the engine (``SamplingParams(logprobs=0)``,
  ``logprobs_mode="processed_logprobs"``) when no top-p/top-k filter is on: they
  differ from the training forward's only by kernel numerics (bf16 matmuls, other
  attention kernels). The on-policy update never reads behaviour log-probs in its loss,
  so a ratio cannot correct that: the update logs the mismatch every step
  (``mismatch_abs_logp_diff``, ``mismatch_kl``) and, with ``tis`` (on by default for this
  backend's engine log-probs), weights each token by the truncated importance ratio
  ``min(pi_trainer / pi_engine, C)`` of Yao et al. 2025
  (:mod:`comlrl.estimators.importance`). Under top-p < 1 or top-k > 0
  the engine's processed log-probs are those of the *truncated, renormalised*
  distribution, ``log(p / Z)`` with ``Z <= 1`` the kept mass, so the ratio against the
  update's full softmax would be ``Z`` on every token (mean 0.72 at top_p = 0.6, and
  the clip zeroed most negative-advantage tokens): there the engine is not asked, the
  log-probs come back NaN and the agent recomputes them with the training model (as
  ``"recompute"`` always does, one extra forward per batch).

The pieces: :mod:`~comlrl.algos.rollout.sampling.vllm_api` (availability, the vLLM
constructors, outputs to tensors) and :mod:`~comlrl.algos.rollout.sampling.vllm_weights`
(the IPC weight push); this module re-exports their names.

Named axes: ``P`` prompts, ``G`` completions per prompt, ``B = P * G`` rows, ``S`` padded
prompt tokens, ``L`` completion tokens.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.rollout.sampling.backends import parameter_versions
from comlrl.algos.rollout.sampling.vllm_api import (
    BEHAVIOUR_LOGPROBS,
    VLLMApi,
    assemble_outputs,
    filters_tokens,
    load_vllm_api,
    vllm_unavailable_reason,
)
from comlrl.algos.rollout.sampling.vllm_weights import ipc_weight_sender
from comlrl.core import SamplingParams

__all__ = [
    "VLLMBackend",
]


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "save_pretrained")


class VLLMBackend:
    """Sample with a colocated vLLM engine; push weights to it after updates.

    Args:
        model: the agent's training model (a ``transformers`` causal LM, or a ``peft``
            model with one LoRA adapter).
        pad_token_id: id written after a row's end.
        eos_token_ids: ids that end a completion (the engine stops on these only).
        name: agent name (LoRA adapter name, messages).
        gpu_memory_utilization: fraction of the GPU's memory the engine may take (its
            weights, activations and KV cache), in ``(0, 1]``; the training model,
            gradients and optimizer state need the rest.
        behaviour_logprobs: ``"engine"`` or ``"recompute"`` (module docstring).
        engine_kwargs: extra ``vllm.LLM`` arguments (``model`` to override the checkpoint
            path, ``max_model_len``, ``enforce_eager``, ...).
        engine: an already built engine (``vllm.LLM`` or an object with its methods);
            ``None`` builds one on the first :meth:`sample`.
        api: vLLM constructors (default: :func:`load_vllm_api`).
        weight_sender: ``(engine, model) -> push()`` for a full model (default:
            :func:`ipc_weight_sender`).
        adapter_dir: where a ``peft`` adapter is saved for the engine (default: a
            temporary folder removed by :meth:`close`).

    Raises:
        ValueError: an unknown ``behaviour_logprobs`` or a ``gpu_memory_utilization``
            outside ``(0, 1]``.
        RuntimeError: no engine was given and vLLM or a CUDA GPU is missing.
    """

    name = "vllm"

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        name: str = "agent",
        gpu_memory_utilization: float = 0.3,
        behaviour_logprobs: str = "engine",
        engine_kwargs: dict[str, Any] | None = None,
        engine: Any | None = None,
        api: VLLMApi | None = None,
        weight_sender: Callable[[Any, Any], Callable[[], None]] | None = None,
        adapter_dir: str | Path | None = None,
    ) -> None:
        if behaviour_logprobs not in BEHAVIOUR_LOGPROBS:
            raise ValueError(
                f"agent {name!r}: behaviour_logprobs={behaviour_logprobs!r}; use 'engine' "
                "(the engine's log-probs) or 'recompute' (the training model's)"
            )
        if not 0.0 < float(gpu_memory_utilization) <= 1.0:
            raise ValueError(
                f"agent {name!r}: gpu_memory_utilization={gpu_memory_utilization!r} must be in "
                "(0, 1], the fraction of the GPU's memory the vLLM engine may take"
            )
        if engine is None:
            reason = vllm_unavailable_reason()
            if reason is not None:
                raise RuntimeError(
                    f"agent {name!r}: generation_backend='vllm' cannot run: {reason}"
                )
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.agent_name = name
        self.gpu_memory_utilization = float(gpu_memory_utilization)
        self.behaviour_logprobs = behaviour_logprobs
        self.engine_kwargs = dict(engine_kwargs or {})
        self.engine = engine
        self._api = api
        self._weight_sender_factory = weight_sender or ipc_weight_sender
        self._push: Callable[[], None] | None = None
        self.lora = _is_peft(model)
        self._own_adapter_dir = adapter_dir is None and self.lora
        self.adapter_dir = (
            Path(adapter_dir)
            if adapter_dir is not None
            else Path(tempfile.mkdtemp(prefix=f"comlrl-{name}-lora-"))
            if self.lora
            else None
        )
        self._lora_request: Any | None = None
        self._reload_adapter = False
        self._synced: tuple[int, ...] | None = None
        self._force_sync = False
        #: How many times weights (or the adapter) were pushed to the engine.
        self.num_weight_pushes = 0

    @property
    def recompute_logprobs(self) -> bool:
        """True with ``behaviour_logprobs="recompute"``."""
        return self.behaviour_logprobs == "recompute"

    @property
    def api(self) -> VLLMApi:
        """The vLLM constructors (imported on first use)."""
        if self._api is None:
            self._api = load_vllm_api()
        return self._api

    # --- the engine ------------------------------------------------------------------
    def _checkpoint_path(self) -> str:
        if "model" in self.engine_kwargs:
            return str(self.engine_kwargs["model"])
        if self.lora:
            cfg = next(iter(self.model.peft_config.values()))
            path = getattr(cfg, "base_model_name_or_path", None)
        else:
            path = getattr(getattr(self.model, "config", None), "_name_or_path", None)
        if not path:
            raise ValueError(
                f"agent {self.agent_name!r}: the vLLM engine needs the model's checkpoint "
                "(Hugging Face id or folder) and the model does not name one; pass "
                "engine_kwargs={'model': '<path>'}"
            )
        return str(path)

    def _build_engine(self) -> Any:
        from vllm import LLM

        kwargs: dict[str, Any] = {
            "model": self._checkpoint_path(),
            "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "logprobs_mode": "processed_logprobs",
        }
        if self.lora:
            cfg = next(iter(self.model.peft_config.values()))
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=int(cfg.r))
        else:
            from vllm.config import WeightTransferConfig

            kwargs["weight_transfer_config"] = WeightTransferConfig(backend="ipc")
        kwargs.update({k: v for k, v in self.engine_kwargs.items() if k != "model"})
        return LLM(**kwargs)

    # --- weights ----------------------------------------------------------------------
    def _params(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad or not self.lora]

    def after_update(self) -> None:
        """Mark the engine's weights stale; they are pushed before the next sample."""
        self._force_sync = True

    def sync_weights(self) -> None:
        """Push the training model's current weights (or LoRA adapter) to the engine now."""
        if self.engine is None:
            self.engine = self._build_engine()
        if self.lora:
            assert self.adapter_dir is not None
            self.model.save_pretrained(str(self.adapter_dir))
            self._lora_request = None
            self._reload_adapter = True
        else:
            if self._push is None:
                self._push = self._weight_sender_factory(self.engine, self.model)
            self._push()
        self._synced = parameter_versions(self._params())
        self._force_sync = False
        self.num_weight_pushes += 1

    def _stale(self) -> bool:
        return self._force_sync or self._synced != parameter_versions(self._params())

    def _lora(self) -> Any | None:
        if not self.lora:
            return None
        request = self.api.lora_request(
            lora_name=f"{self.agent_name}-adapter",
            lora_int_id=1,
            lora_path=str(self.adapter_dir),
            load_inplace=self._reload_adapter,
        )
        self._reload_adapter = False
        return request

    # --- sampling ---------------------------------------------------------------------
    @torch.no_grad()
    def sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | list[torch.Generator] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`~comlrl.algos.rollout.sampling.backends.GenerationBackend.sample`.

        Pushes the weights first when they changed since the last push. The random
        stream seeds the engine's requests (prompt ``p`` gets seed ``s + p * G``, its
        ``G`` completions ``s + p * G + g`` in vLLM), so a seeded agent draws the same
        completions from the same weights.
        """
        if isinstance(generator, list):
            raise ValueError(
                "the vLLM backend draws every prompt from one seeded request stream; per-prompt "
                "streams (sampling_rng='prompt') need generation_backend='native'"
            )
        if self.engine is None or self._stale():
            self.sync_weights()
        g = params.num_generations
        prompts = [
            {"prompt_token_ids": row[mask.bool()].tolist()}
            for row, mask in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)
        ]
        base = None
        if generator is not None:
            base = int(torch.randint(0, 2**31 - 1 - g * len(prompts), (1,), generator=generator))
        # under top-p/top-k the engine's log-probs are of the truncated distribution:
        # leave them NaN so the agent recomputes the full tempered softmax's
        want_engine_logp = self.behaviour_logprobs == "engine" and not filters_tokens(params)
        sampling = [
            self.api.sampling_params(
                n=g,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_tokens=params.max_new_tokens,
                logprobs=0 if want_engine_logp else None,
                stop_token_ids=list(self.eos_token_ids),
                ignore_eos=True,
                seed=None if base is None else base + p * g,
            )
            for p in range(len(prompts))
        ]
        assert self.engine is not None  # built by sync_weights
        outputs = self.engine.generate(prompts, sampling, use_tqdm=False, lora_request=self._lora())
        if len(outputs) != len(prompts):
            raise RuntimeError(
                f"agent {self.agent_name!r}: vLLM returned {len(outputs)} outputs for "
                f"{len(prompts)} prompts"
            )
        ids, logp = assemble_outputs(
            outputs,
            g,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            with_logprobs=want_engine_logp,
            max_tokens=params.max_new_tokens,
        )
        device = input_ids.device
        return ids.to(device), logp.to(device)

    def close(self) -> None:
        """Drop the engine and remove a temporary adapter folder."""
        self.engine = None
        self._push = None
        if self._own_adapter_dir and self.adapter_dir is not None:
            shutil.rmtree(self.adapter_dir, ignore_errors=True)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # may run at interpreter shutdown
            if self._own_adapter_dir and self.adapter_dir is not None:
                shutil.rmtree(self.adapter_dir, ignore_errors=True)
