"""One LoRA agent as a view of one adapter on a (possibly shared) peft base model.

:class:`SharedBase` is a peft-injected base and what its agents share (the lock, the
active adapter); :class:`LoraPolicy` is one agent's adapter, switching the layers to it on
every call; :class:`LoraReference` is the agent's KL reference (the base with adapters
disabled). Why views and how agents interleave on a shared base, and how checkpoints
look: :mod:`comlrl.algos.models.lora`, which builds these (:func:`~comlrl.algos.models.lora.attach_lora`).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "ADAPTER_WEIGHTS",
    "MERGED_DIR",
    "LoraPolicy",
    "LoraReference",
    "SharedBase",
    "require_peft",
]

#: File of an adapter's weights in a checkpoint folder (peft's name).
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: Sub-folder of an agent checkpoint with the merged weights (``merge_adapters: true``).
MERGED_DIR = "merged"


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
    """

    def __init__(self, peft_model: Any) -> None:
        self.peft_model = peft_model
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
    """

    is_lora_policy = True

    def __init__(
        self, shared: SharedBase, adapter_name: str, *, merge_on_save: bool = False
    ) -> None:
        super().__init__()
        self.peft_model = shared.peft_model  # registered: .to()/.train() reach the base
        self.adapter_name = adapter_name
        self.merge_on_save = merge_on_save
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
        ``path``; with :attr:`merge_on_save` also the merged model to ``path/merged``.

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


class LoraReference:
    """The KL reference of a LoRA agent: its base model with every adapter disabled.

    Calls like a causal LM; nothing is copied. ``parameters()`` are the base's (for its
    device).
    """

    def __init__(self, policy: LoraPolicy) -> None:
        self.policy = policy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.policy.disable_adapter():
            return self.policy.shared.hf_model(*args, **kwargs)

    def parameters(self) -> Iterator[nn.Parameter]:
        """The base model's parameters (frozen)."""
        return self.policy.shared.hf_model.parameters()

    def eval(self) -> LoraReference:
        """No-op (dropout follows the policy's mode; the base has none of its own)."""
        return self
