"""Agents as LoRA adapters on a frozen base model (extra ``comlrl-algos[lora]``: ``peft``).

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", Eq. 3): a
targeted weight ``W [out, in]`` acts as ``W + (alpha / r) * B A`` with ``A [r, in]`` and
``B [out, r]`` trained and ``W`` frozen; ``B`` starts at zero, so an agent starts as its
base model. :func:`attach_lora` turns the agents of a run into adapters:

- ``shared_base=True``: ONE frozen base for all agents, with one named peft adapter per
  agent (``agent_0``, ``agent_1``, ...; ``PeftModel.add_adapter``). Memory is about one
  base plus ``A`` adapters.
- ``shared_base=False``: each agent's own base gets its own adapter.

Each agent's ``model`` becomes a :class:`LoraPolicy`: a view of one adapter. Why a view
and how agents interleave on a shared base: peft's active adapter is state of the
injected layers, shared by every agent on the base. Every call of a view (forward,
``generate``, the adapter-disabled reference) therefore switches the layers to its own
adapter and runs under the base's lock, so concurrent sampling threads never see another
agent's adapter. Backward passes need no switch (the autograd graph recorded which
``A``/``B`` each forward used); the optimizer of an agent holds only its own adapter's
parameters (:meth:`LoraPolicy.parameters`), so one agent's step never touches another's
adapter or the base. Updates of agents on one base still run one after another
(:func:`model_key` tells the recipe which agents share a base): peft's adapter switch
flips ``requires_grad`` flags that a concurrent backward would read.

The KL reference of a LoRA agent is its base with the adapters disabled
(:class:`LoraReference`, ``PeftModel.disable_adapter``): no copy of the base.

Checkpoints (:meth:`LoraPolicy.save_pretrained`) hold the adapter in peft's format
(``adapter_config.json`` + ``adapter_model.safetensors``; load with
``PeftModel.from_pretrained(base, path)``) and, with ``merge=True``, the merged weights
``W + (alpha / r) B A`` in ``path/merged`` (load with
``AutoModelForCausalLM.from_pretrained(path / "merged")``, no peft needed).

The fast decode step (:class:`~comlrl.algos.rollout.sampling.decode.FastDecoder`) refuses LoRA
layers (they are not plain ``nn.Linear``), so LoRA agents decode through the model's
forward; ``benchmarks/bench_lora_decode.py`` measures the difference.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from comlrl.algos.training.config import LoraSettings

__all__ = [
    "require_peft",
    "SharedBase",
    "LoraPolicy",
    "LoraReference",
    "attach_lora",
    "is_lora_policy",
    "model_key",
    "reference_model",
    "unique_parameter_bytes",
    "ADAPTER_WEIGHTS",
    "MERGED_DIR",
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


def is_lora_policy(model: Any) -> bool:
    """Whether ``model`` is a :class:`LoraPolicy`."""
    return bool(getattr(type(model), "is_lora_policy", False))


def model_key(model: Any) -> int:
    """Identity of the weights behind ``model``: agents with equal keys share a base and
    must not be updated concurrently."""
    if is_lora_policy(model):
        return id(model.shared)
    return id(model)


def reference_model(model: Any, device: torch.device | None = None) -> Any:
    """The frozen KL reference of a policy.

    A :class:`LoraPolicy` gets a :class:`LoraReference` (its base, adapters disabled, no
    copy); any other model a deep copy in eval mode without gradients, on ``device``
    (default: the model's).
    """
    import copy

    if is_lora_policy(model):
        return LoraReference(model)
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    return ref.to(device) if device is not None else ref


def _lora_config(settings: LoraSettings) -> Any:
    peft = require_peft()
    target = settings.target_modules
    return peft.LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=target if isinstance(target, str) else list(target),
        bias="none",
        task_type="CAUSAL_LM",
    )


def _same_architecture(a: Any, b: Any) -> bool:
    ca, cb = getattr(a, "config", None), getattr(b, "config", None)
    if ca is None or cb is None:
        return a is b
    keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
    return all(getattr(ca, k, None) == getattr(cb, k, None) for k in keys)


def attach_lora(agents: Sequence[Any], settings: LoraSettings, *, seed: int = 0) -> None:
    """Turn each agent's model into a :class:`LoraPolicy` (in place: ``agent.replace_model``).

    With ``settings.shared_base`` agent 0's model becomes the one frozen base and the
    other agents' models are dropped (they must be the same architecture; pass the same
    weights). Adapters are named ``agent_<i>``; their ``A`` matrices are drawn from a
    stream seeded by ``seed`` (torch's global stream is left as it was). Agents whose
    model is already a :class:`LoraPolicy` are left alone.

    Raises:
        ImportError: peft is missing.
        ValueError: with ``shared_base``, agents whose models differ in architecture; a
            ``target_modules`` name that matches no layer (peft's message).
    """
    peft = require_peft()
    todo = [(i, a) for i, a in enumerate(agents) if not is_lora_policy(a.model)]
    if not todo:
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if settings.shared_base:
            base = todo[0][1].model
            for i, agent in todo[1:]:
                if not _same_architecture(base, agent.model):
                    raise ValueError(
                        f"lora.shared_base=true: agent {i}'s model differs from agent "
                        f"{todo[0][0]}'s; give every agent the same base model or set "
                        "lora.shared_base=false."
                    )
            names = [f"agent_{i}" for i, _ in todo]
            pm = peft.get_peft_model(base, _lora_config(settings), adapter_name=names[0])
            for name in names[1:]:
                pm.add_adapter(name, _lora_config(settings))
            shared = SharedBase(pm)
            for (_, agent), name in zip(todo, names, strict=True):
                agent.replace_model(LoraPolicy(shared, name, merge_on_save=settings.merge_adapters))
        else:
            for i, agent in todo:
                name = f"agent_{i}"
                pm = peft.get_peft_model(agent.model, _lora_config(settings), adapter_name=name)
                agent.replace_model(
                    LoraPolicy(SharedBase(pm), name, merge_on_save=settings.merge_adapters)
                )


def unique_parameter_bytes(models: Sequence[Any]) -> int:
    """Bytes of all distinct parameter and buffer tensors behind ``models`` (each tensor
    counted once, however many models reach it); a :class:`LoraPolicy` counts its whole
    base. Units: bytes (``numel * element_size``)."""
    seen: set[int] = set()
    total = 0
    for model in models:
        module = model.shared.hf_model if is_lora_policy(model) else model
        for t in [*module.parameters(), *module.buffers()]:
            key = t.data_ptr()
            if key in seen:
                continue
            seen.add(key)
            total += t.numel() * t.element_size()
    return total
