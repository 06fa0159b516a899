"""One LoRA agent as a view of one adapter on a (possibly shared) peft base model.

:class:`SharedBase` is a peft-injected base and what its agents share (the lock, the
active adapter); :class:`LoraPolicy` is one agent's adapter, switching the layers to it on
every call; :class:`AdapterBatch` is several agents' adapters in one batch (the rows split
into equal blocks, block ``i`` through adapter ``i``: peft's mixed-adapter batches), for
sampling and updating agents that share a base together; :class:`LoraReference` is the
agent's KL reference (the base with adapters disabled). Each view also gives the bare
decoder with its adapters selected (``get_decoder``), so log-probs take the fused path
(hidden states times the LM head in chunks) instead of materialising the logits. Why views and how agents interleave on a shared base, and how checkpoints
look: :mod:`comlrl.algos.models.lora`, which builds these (:func:`~comlrl.algos.models.lora.attach_lora`).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "ADAPTER_WEIGHTS",
    "BASE_RECORD",
    "MERGED_DIR",
    "AdapterBatch",
    "LoraPolicy",
    "LoraReference",
    "SharedBase",
    "require_peft",
]

#: File of an adapter's weights in a checkpoint folder (peft's name).
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: Sub-folder of an agent checkpoint with the merged weights (``merge_adapters: true``).
MERGED_DIR = "merged"
#: File beside an adapter naming the base it was trained on (the model's ``comlrl_source``:
#: ``{"model": name or absolute path, "seed": int, "trust_remote_code": bool}``), so the
#: folder loads as a model (:func:`comlrl.algos.models.loading.load_adapter_folder`).
BASE_RECORD = "comlrl_base.json"


def require_peft() -> Any:
    """The ``peft`` module.

    Raises:
        ImportError: peft is not installed (names the extra to install).
    """
    try:
        import peft
    except ImportError as exc:
        raise ImportError(
            "LoRA agents need peft: pip install 'comlrl-algos[lora]' (or remove the lora section)."
        ) from exc
    return peft


class SharedBase:
    """One peft-injected base model and what its agents share: the lock and the active adapter.

    Args:
        peft_model: a ``peft.PeftModel`` holding one or more LoRA adapters.
        batched: its agents may sample and update in one batch
            (:mod:`comlrl.algos.rollout.shared_base`,
            :func:`~comlrl.algos.training.update.policy.update_adapters`).
    """

    def __init__(self, peft_model: Any, *, batched: bool = True) -> None:
        self.peft_model = peft_model
        self.batched = bool(batched)
        #: objects the samplers keep per base between calls (the batched sampler).
        self.cache: dict[Any, Any] = {}
        #: the injected ``transformers`` model (LoRA layers in place of the targeted linears).
        self.hf_model = peft_model.get_base_model()
        self.lock = threading.RLock()
        self.active: str | None = None
        self._adapter_params: dict[str, list[tuple[str, nn.Parameter]]] = {}
        self._restore_trainable()  # peft's add_adapter leaves the added adapters frozen

    def adapter_parameters(self, name: str) -> list[tuple[str, nn.Parameter]]:
        """``(qualified name, parameter)`` of adapter ``name``'s ``A`` and ``B`` matrices.

        Raises:
            ValueError: the base has no adapter ``name``.
        """
        if name not in self._adapter_params:
            found = []
            for qual, p in self.peft_model.named_parameters():
                parts = qual.split(".")
                if any(
                    a.startswith("lora_") and b == name
                    for a, b in zip(parts, parts[1:], strict=False)
                ):
                    found.append((qual, p))
            if not found:
                raise ValueError(
                    f"the base has no LoRA adapter {name!r} (adapters: {sorted(self.peft_model.peft_config)})"
                )
            self._adapter_params[name] = found
        return self._adapter_params[name]

    def _restore_trainable(self) -> None:
        # peft's set_adapter / enable_adapter_layers mark the inactive adapters frozen; every
        # agent's adapter stays trainable (each optimizer holds only its own).
        for name in self.peft_model.peft_config:
            for _, p in self.adapter_parameters(name):
                p.requires_grad_(True)

    def activate(self, name: str) -> None:
        """Switch the LoRA layers to adapter ``name`` (call with :attr:`lock` held)."""
        if self.active != name:
            self.peft_model.set_adapter(name)
            self._restore_trainable()
            self.active = name

    @contextlib.contextmanager
    def row_adapters(self, names: Sequence[str]) -> Iterator[None]:
        """Hold the lock; inside the block, every LoRA layer of the base runs the rows of a
        batch of ``n`` rows in ``len(names)`` equal contiguous blocks, block ``i`` through
        adapter ``names[i]`` (peft's ``adapter_names`` argument of its LoRA layers, passed
        by forward pre-hooks, so the bare decoder gets it too).

        Raises (inside the block's forward calls):
            ValueError: a batch whose rows do not split into ``len(names)`` blocks.
        """
        from peft.tuners.lora import LoraLayer

        blocks = list(names)

        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            x = args[0] if args else kwargs["x"]
            n = x.shape[0]
            if n % len(blocks):
                raise ValueError(
                    f"a batch of {n} rows does not split into {len(blocks)} adapter blocks"
                )
            per = n // len(blocks)
            return args, {**kwargs, "adapter_names": [blocks[i // per] for i in range(n)]}

        with self.lock:
            layers = [m for m in self.hf_model.modules() if isinstance(m, LoraLayer)]
            handles = [
                nn.Module.register_forward_pre_hook(m, hook, with_kwargs=True)  # type: ignore[arg-type]
                for m in layers
            ]
            try:
                yield
            finally:
                for h in handles:
                    h.remove()

    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Hold the lock and run the plain base (all adapters off) inside the block."""
        with self.lock:
            try:
                with self.peft_model.disable_adapter():
                    yield
            finally:
                self.active = None  # peft re-enables the layers with its own active adapter
                self._restore_trainable()


class LoraPolicy(nn.Module):
    """One agent's policy: adapter ``adapter_name`` on a (possibly shared) frozen base.

    Calls like the ``transformers`` causal LM it wraps (``model(input_ids=..., ...)``,
    ``generate``); attributes it does not define (``config``, ``generation_config``,
    ``model``, ``lm_head``, ...) are the base model's. :meth:`parameters` yields only the
    adapter's ``A``/``B`` matrices (the trainable parameters of this agent); ``to``,
    ``train`` and ``state_dict`` act on the whole base (shared by every agent on it).

    Args:
        shared: the base and its lock (:class:`SharedBase`).
        adapter_name: this agent's adapter on it.
        merge_on_save: :meth:`save_pretrained` also writes the merged weights.
        base_source: where the base was loaded from (its ``comlrl_source``, set by
            :func:`~comlrl.algos.models.loading.load_model_and_tokenizer`), written beside
            the adapter; ``None`` (a base built another way): the folder then loads only
            with peft (``PeftModel.from_pretrained(base, path)``).
    """

    is_lora_policy = True
    #: ``get_decoder`` runs the decoder with this agent's adapter (the fused log-prob path).
    selects_adapters = True

    def __init__(
        self,
        shared: SharedBase,
        adapter_name: str,
        *,
        merge_on_save: bool = False,
        base_source: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.peft_model = shared.peft_model  # registered: .to()/.train() reach the base
        self.adapter_name = adapter_name
        self.merge_on_save = merge_on_save
        self.base_source = base_source
        object.__setattr__(self, "shared", shared)  # not a submodule (no double registration)
        shared.adapter_parameters(adapter_name)  # fails early for an unknown name

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or "peft_model" not in self.__dict__.get("_modules", {}):
                raise
            return getattr(self.shared.hf_model, name)

    # ------------------------------------------------------------------ parameters
    def named_parameters(  # type: ignore[override]
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        """This agent's adapter parameters (``A`` and ``B`` of every targeted layer)."""
        for qual, p in self.shared.adapter_parameters(self.adapter_name):
            yield (f"{prefix}.{qual}" if prefix else qual), p

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:  # type: ignore[override]
        """This agent's adapter parameters (what its optimizer steps)."""
        for _, p in self.named_parameters():
            yield p

    @property
    def device(self) -> torch.device:
        """Device of the base model."""
        return torch.device(next(self.shared.hf_model.parameters()).device)

    # ------------------------------------------------------------------ calls
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The base model's forward with this agent's adapter (under the base's lock)."""
        with self.shared.lock:
            self.shared.activate(self.adapter_name)
            return self.shared.hf_model(*args, **kwargs)

    @property
    def adapter_layout(self) -> tuple[str]:
        """The adapter of every row: this agent's (one block; see :class:`AdapterBatch`)."""
        return (self.adapter_name,)

    def get_decoder(self) -> _Decoder:
        """The base's decoder (no LM head) with this agent's adapter, under the lock."""
        return _Decoder(self.shared, lambda: self._active())

    @contextlib.contextmanager
    def _active(self) -> Iterator[None]:
        with self.shared.lock:
            self.shared.activate(self.adapter_name)
            yield

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """``model.generate`` with this agent's adapter (the lock is held throughout)."""
        with self.shared.lock:
            self.shared.activate(self.adapter_name)
            return self.shared.hf_model.generate(*args, **kwargs)

    def disable_adapter(self) -> contextlib.AbstractContextManager[None]:
        """Context manager: inside it, calls of the base model run without any adapter."""
        return self.shared.adapters_disabled()

    # ------------------------------------------------------------------ checkpoints
    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter's weights in peft's saved format (keys without the adapter name)."""
        from peft import get_peft_model_state_dict

        with self.shared.lock:
            sd = get_peft_model_state_dict(self.peft_model, adapter_name=self.adapter_name)
        return {k: v.detach().cpu().contiguous() for k, v in sd.items()}

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """Whole-model weights with this adapter merged in: per targeted layer
        ``W + (alpha / r) B A`` (peft's ``get_delta_weight``), keys of the plain model.
        The shared base is not modified."""
        from peft.tuners.lora import LoraLayer

        model = self.shared.hf_model
        with self.shared.lock, torch.no_grad():
            out: dict[str, torch.Tensor] = {}
            for key, value in model.state_dict().items():
                if any(part.startswith("lora_") for part in key.split(".")):
                    continue
                out[key.replace(".base_layer.", ".")] = value.detach()
            for name, module in model.named_modules():
                if isinstance(module, LoraLayer) and self.adapter_name in module.lora_A:
                    key = f"{name}.weight"
                    w = out[key]
                    layer: Any = module  # a lora.Linear/Embedding/...: all have get_delta_weight
                    out[key] = w + layer.get_delta_weight(self.adapter_name).to(w.dtype)
        return {k: v.cpu().contiguous() for k, v in out.items()}

    def save_pretrained(self, path: str | Path, **kwargs: Any) -> None:
        """Write the adapter (``adapter_config.json``, ``adapter_model.safetensors``) to
        ``path``, with :attr:`base_source` (where its base was loaded from) as
        :data:`BASE_RECORD`; with :attr:`merge_on_save` also the merged model to
        ``path/merged``.

        Load the adapter with ``PeftModel.from_pretrained(base, path)``. Other keyword
        arguments (``state_dict``) are not supported: the adapter is saved whole.

        Raises:
            ValueError: a ``state_dict`` was passed.
        """
        if kwargs.get("state_dict") is not None:
            raise ValueError(
                "LoraPolicy.save_pretrained saves the adapter itself; do not pass state_dict."
            )
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file(self.adapter_state_dict(), str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        config = self.peft_model.peft_config[self.adapter_name]
        data = config.to_dict()
        for key, value in list(data.items()):  # sets (target_modules) are not JSON
            if isinstance(value, set):
                data[key] = sorted(value)
        (path / "adapter_config.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
        if self.base_source is not None:
            (path / BASE_RECORD).write_text(json.dumps(self.base_source, indent=2) + "\n")
        if self.merge_on_save:
            self.shared.hf_model.save_pretrained(
                path / MERGED_DIR, state_dict=self.merged_state_dict()
            )

    def load_adapter_weights(self, path: str | Path) -> None:
        """Copy the adapter saved by :meth:`save_pretrained` at ``path`` into this adapter
        in place (optimizers over its parameters stay valid).

        Raises:
            FileNotFoundError: ``path`` has no adapter weights.
            ValueError: the saved adapter does not fit (missing or unexpected tensors, or
                another rank or target modules).
        """
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        f = Path(path) / ADAPTER_WEIGHTS
        if not f.is_file():
            raise FileNotFoundError(f"{str(f)!r} does not exist; not a LoRA agent checkpoint")
        saved = load_file(str(f))
        expected = self.adapter_state_dict()
        if set(saved) != set(expected) or any(saved[k].shape != expected[k].shape for k in saved):
            raise ValueError(
                f"the adapter in {str(path)!r} does not fit agent adapter {self.adapter_name!r} "
                "(other rank or target_modules); resume with the lora settings of the run."
            )
        with self.shared.lock:
            result: Any = set_peft_model_state_dict(
                self.peft_model, saved, adapter_name=self.adapter_name
            )
        if getattr(result, "unexpected_keys", None):
            raise ValueError(
                f"unexpected adapter tensors in {str(path)!r}: {result.unexpected_keys[:5]}"
            )


class AdapterBatch(nn.Module):
    """Several agents' adapters on one base, one batch: the rows of every call split into
    ``A`` equal contiguous blocks, block ``i`` through adapter ``names[i]``.

    Calls like the ``transformers`` causal LM (``model(input_ids=..., ...)``); attributes
    it does not define are the base's. :meth:`parameters` yields the adapters' ``A``/``B``
    matrices. Forward calls go through peft's mixed-adapter batches
    (:meth:`SharedBase.row_adapters`); the fast decode step reads :attr:`adapter_layout`
    and applies each block's adapter itself
    (:mod:`comlrl.algos.rollout.sampling.fast_decode.lora`).

    Args:
        shared: the base.
        names: the adapter of each block of rows, in row order.

    Raises:
        ValueError: no names, or a name the base has no adapter for.
    """

    selects_adapters = True

    def __init__(self, shared: SharedBase, names: Sequence[str]) -> None:
        super().__init__()
        if not names:
            raise ValueError("AdapterBatch needs at least one adapter name")
        self.peft_model = shared.peft_model  # registered: .to()/.train() reach the base
        self.names = tuple(names)
        object.__setattr__(self, "shared", shared)
        for name in self.names:
            shared.adapter_parameters(name)  # fails early for an unknown name

    @classmethod
    def of(cls, policies: Sequence[Any]) -> AdapterBatch:
        """The batch of the agents ``policies`` (:class:`LoraPolicy` views of one base).

        Raises:
            ValueError: a policy that is not a LoRA view, or views of different bases.
        """
        if not policies or not all(getattr(p, "is_lora_policy", False) for p in policies):
            raise ValueError("AdapterBatch.of takes LoraPolicy views (LoRA agents) only")
        shared = policies[0].shared
        if any(p.shared is not shared for p in policies):
            raise ValueError(
                "AdapterBatch.of: the agents are adapters of different bases; only agents on "
                "one shared base (lora.shared_base: true) run in one batch"
            )
        return cls(shared, [p.adapter_name for p in policies])

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or "peft_model" not in self.__dict__.get("_modules", {}):
                raise
            return getattr(self.shared.hf_model, name)

    @property
    def adapter_layout(self) -> tuple[str, ...]:
        """The adapter of each block of rows."""
        return self.names

    def named_parameters(  # type: ignore[override]
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        """The adapters' parameters, adapter by adapter."""
        for name in self.names:
            for qual, p in self.shared.adapter_parameters(name):
                yield (f"{prefix}.{qual}" if prefix else qual), p

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:  # type: ignore[override]
        """The adapters' parameters."""
        for _, p in self.named_parameters():
            yield p

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The base model's forward, each block of rows through its adapter."""
        with self.shared.row_adapters(self.names):
            return self.shared.hf_model(*args, **kwargs)

    def get_decoder(self) -> _Decoder:
        """The base's decoder with each block of rows through its adapter."""
        return _Decoder(self.shared, lambda: self.shared.row_adapters(self.names))


class _Decoder:
    """The base's decoder called inside a context that selects the adapters."""

    def __init__(
        self, shared: SharedBase, select: Callable[[], contextlib.AbstractContextManager[Any]]
    ) -> None:
        self.shared, self.select = shared, select

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.select():
            return self.shared.hf_model.get_decoder()(*args, **kwargs)

    __call__ = forward


class LoraReference:
    """The KL reference of a LoRA agent: its base model with every adapter disabled.

    Calls like a causal LM; nothing is copied. ``parameters()`` are the base's (for its
    device).
    """

    selects_adapters = True

    def __init__(self, policy: LoraPolicy) -> None:
        self.policy = policy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.policy.disable_adapter():
            return self.policy.shared.hf_model(*args, **kwargs)

    def get_decoder(self) -> _Decoder:
        """The base's decoder with every adapter disabled."""
        return _Decoder(self.policy.shared, self.policy.disable_adapter)

    def get_output_embeddings(self) -> Any:
        """The base's LM head."""
        return self.policy.shared.hf_model.get_output_embeddings()

    def parameters(self) -> Iterator[nn.Parameter]:
        """The base model's parameters (frozen)."""
        return self.policy.shared.hf_model.parameters()

    def eval(self) -> LoraReference:
        """No-op (dropout follows the policy's mode; the base has none of its own)."""
        return self
