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
  attention kernels), which the PPO ratio then corrects. Under top-p < 1 or top-k > 0
  the engine's processed log-probs are those of the *truncated, renormalised*
  distribution, ``log(p / Z)`` with ``Z <= 1`` the kept mass, so the ratio against the
  update's full softmax would be ``Z`` on every token (mean 0.72 at top_p = 0.6, and
  the clip zeroed most negative-advantage tokens): there the engine is not asked, the
  log-probs come back NaN and the agent recomputes them with the training model (as
  ``"recompute"`` always does, one extra forward per batch).

Named axes: ``P`` prompts, ``G`` completions per prompt, ``B = P * G`` rows, ``S`` padded
prompt tokens, ``L`` completion tokens.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from comlrl.algos.rollout.sampling.backends import parameter_versions
from comlrl.core import SamplingParams

__all__ = [
    "BEHAVIOUR_LOGPROBS",
    "filters_tokens",
    "VLLM_INSTALL_HINT",
    "VLLMApi",
    "VLLMBackend",
    "EngineSyncClient",
    "assemble_outputs",
    "ipc_weight_sender",
    "load_vllm_api",
    "vllm_unavailable_reason",
]

#: Where behaviour log-probs come from (see the module docstring).
BEHAVIOUR_LOGPROBS = ("engine", "recompute")

VLLM_INSTALL_HINT = (
    "install it with: pip install 'comlrl-algos[vllm]' (needs a CUDA GPU), or use "
    "generation_backend='native'"
)


def vllm_unavailable_reason(*, need_cuda: bool = True) -> str | None:
    """Why the vLLM backend cannot run here (``None`` when it can).

    Checks that ``vllm`` is importable (without importing it) and, with ``need_cuda``,
    that torch sees a CUDA device.
    """
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed; {VLLM_INSTALL_HINT}"
    if need_cuda and not torch.cuda.is_available():
        return "vLLM needs a CUDA GPU and torch sees none; use generation_backend='native'"
    return None


@dataclass(frozen=True)
class VLLMApi:
    """The vLLM constructors the backend calls (swapped for fakes in the contract tests).

    Attributes:
        sampling_params: ``vllm.SamplingParams``.
        lora_request: ``vllm.lora.request.LoRARequest``.
    """

    sampling_params: Callable[..., Any]
    lora_request: Callable[..., Any]


def load_vllm_api() -> VLLMApi:
    """Import vLLM's ``SamplingParams`` and ``LoRARequest``.

    Raises:
        ImportError: vLLM is not installed (the message says how to install it).
    """
    try:
        from vllm import SamplingParams as VSamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        raise ImportError(
            f"the 'vllm' generation backend needs vLLM ({exc}); {VLLM_INSTALL_HINT}"
        ) from exc
    return VLLMApi(sampling_params=VSamplingParams, lora_request=LoRARequest)


def filters_tokens(params: SamplingParams) -> bool:
    """True when top-p or top-k truncates the sampling distribution (``top_p < 1`` or
    ``top_k > 0``): then vLLM's processed log-probs are renormalised over the kept tokens
    and do not match the full tempered softmax the update uses."""
    return params.top_p < 1.0 or params.top_k > 0


def assemble_outputs(
    outputs: Sequence[Any],
    group_size: int,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    with_logprobs: bool,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM ``RequestOutput``\\ s to the native sampler's padded tensors.

    Each output's ``G`` completions are ordered by ``CompletionOutput.index``; a
    completion is cut after its first EOS (kept), and rows are right-padded with
    ``pad_token_id`` to the longest (at least one token, like the native sampler).

    Args:
        outputs: ``P`` request outputs (``.outputs``: ``G`` completion outputs with
            ``index``, ``token_ids`` and, with ``with_logprobs``, ``logprobs``: one
            ``{token_id: Logprob}`` mapping per token).
        group_size: ``G``.
        eos_token_ids: ids that end a completion.
        pad_token_id: id written after a row's end.
        with_logprobs: read the sampled tokens' log-probs; otherwise they are NaN
            (to be recomputed).
        max_tokens: the completion budget; a completion without EOS must have used all
            of it (the native convention: only EOS ends a row early, so padding is never
            mistaken for sampled tokens). ``None`` skips the check.

    Returns:
        ids ``[B, L]`` int64 and log-probs ``[B, L]`` float32 (0 after a row's end),
        ``B = P * G``, node-major.

    Raises:
        ValueError: a request with other than ``G`` completions, a completion without
            log-probs (or without the sampled token's) when they were asked for, or one
            that stopped without EOS before ``max_tokens`` (the engine's context limit).
    """
    eos = {int(i) for i in eos_token_ids}
    rows: list[list[int]] = []
    logps: list[list[float]] = []
    for p, request in enumerate(outputs):
        completions = sorted(request.outputs, key=lambda c: c.index)
        if len(completions) != group_size:
            raise ValueError(
                f"vLLM returned {len(completions)} completions for prompt {p}, expected "
                f"G={group_size}; the engine must be called with SamplingParams(n=G)"
            )
        for c in completions:
            ids = [int(t) for t in c.token_ids]
            end = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
            ids = ids[:end]
            if max_tokens is not None and len(ids) < max_tokens and not (ids and ids[-1] in eos):
                raise ValueError(
                    f"vLLM stopped completion {c.index} of prompt {p} after {len(ids)} of "
                    f"{max_tokens} tokens without EOS (finish_reason="
                    f"{getattr(c, 'finish_reason', None)!r}), most likely at the engine's "
                    "context limit; raise vllm.engine_kwargs.max_model_len or lower "
                    "max_new_tokens"
                )
            if with_logprobs:
                if c.logprobs is None or len(c.logprobs) < len(ids):
                    raise ValueError(
                        f"vLLM returned no log-probs for completion {c.index} of prompt {p}; "
                        "the engine must be called with SamplingParams(logprobs=0)"
                    )
                try:
                    lp = [float(c.logprobs[i][t].logprob) for i, t in enumerate(ids)]
                except KeyError as exc:
                    raise ValueError(
                        f"vLLM's log-probs for completion {c.index} of prompt {p} miss the "
                        f"sampled token {exc}"
                    ) from None
            else:
                lp = [float("nan")] * len(ids)
            rows.append(ids)
            logps.append(lp)
    length = max([1, *(len(r) for r in rows)])
    out_ids = torch.full((len(rows), length), int(pad_token_id), dtype=torch.int64)
    out_logp = torch.zeros(len(rows), length, dtype=torch.float32)
    for i, (ids, lp) in enumerate(zip(rows, logps, strict=True)):
        out_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        out_logp[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return out_ids, out_logp


class EngineSyncClient:
    """vLLM's trainer-side weight-sync client protocol over an in-process ``vllm.LLM``.

    The trainer engine calls these four methods; they forward to the ``LLM`` methods of
    the same names, which take the info wrapped in a request mapping.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Set up the engine side of the transfer (once)."""
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        """Open one weight update."""
        self.llm.start_weight_update()

    def update_weights(self, update_info: Any) -> None:
        """Ship one batch of weights (IPC handles)."""
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Close the update; the engine samples from the new weights from now on."""
        self.llm.finish_weight_update(weight_version)


def ipc_weight_sender(llm: Any, model: Any) -> Callable[[], None]:
    """A function that pushes ``model``'s parameters into ``llm`` by CUDA IPC (vLLM 0.32).

    The engine must have been built with ``weight_transfer_config=
    WeightTransferConfig(backend="ipc")``; parameters are sent under their
    ``named_parameters()`` names (the Hugging Face checkpoint names vLLM's
    ``load_weights`` reads).
    """
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.ipc_engine import (
        IPCTrainerInitInfo,
        IPCTrainerWeightTransferEngine,
    )

    trainer = IPCTrainerWeightTransferEngine.trainer_init(
        IPCTrainerInitInfo(rank=0), client=EngineSyncClient(llm), source=ModuleSource(model)
    )
    return trainer.send_weights


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
