"""Backend selection for comlrl.kernels.

Which implementation serves a call is decided per call, from the input's device and what
was compiled:

- a CUDA tensor and the ``_cuda`` module built   -> ``"cuda"``
- a CPU tensor and the ``_cpu`` module built     -> ``"cpu"``
- anything else                                  -> ``"torch"`` (the pure-torch reference)

A backend can be forced with the environment variable ``COMLRL_KERNELS_BACKEND``
(``auto|torch|cpu|cuda``, read on every call) or, taking precedence, with the context
manager :func:`use_backend`. A forced backend that cannot serve a call raises
:class:`BackendUnavailableError`; under ``auto`` a native backend that fails at run time
warns once (per op and backend) and the torch reference serves instead.

Importing this module only records what imported; it never rewrites other modules.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import os
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TypeVar

import torch

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "BackendUnavailableError",
    "backend_info",
    "requested_backend",
    "run",
    "select",
    "use_backend",
]

BACKENDS = ("auto", "torch", "cpu", "cuda")
ENV_VAR = "COMLRL_KERNELS_BACKEND"
OPS = ("token_logprobs", "linear_token_logprobs", "group_advantages", "linear_rows")

# dtype codes shared with csrc/common.h
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.float16: 1,
    torch.bfloat16: 2,
    torch.float64: 3,
}

T = TypeVar("T")


class BackendUnavailableError(RuntimeError):
    """A forced backend cannot serve this call (not built, wrong device or dtype)."""


def _import_extension(name: str) -> tuple[ModuleType | None, str]:
    qualified = f"{__package__}.{name}"
    if importlib.util.find_spec(qualified) is None:
        return None, "not built (no compiled module in the installed package)"
    try:
        return importlib.import_module(qualified), ""
    except ImportError as exc:  # compiled for another Python/platform, missing library, ...
        return None, f"import failed: {exc}"


def _build_status() -> str:
    try:
        from . import _build_info
    except ImportError:
        return "no build record (package not installed through its CMake build)"
    return f"CUDA module {_build_info.CUDA_STATUS}"


_cpu, _CPU_ERROR = _import_extension("_cpu")
_cuda, _CUDA_ERROR = _import_extension("_cuda")
_BUILD_STATUS = _build_status()

_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "comlrl_kernels_backend", default=None
)
_warned: set[tuple[str, str]] = set()


def cpu_module() -> ModuleType:
    """The compiled ``_cpu`` module (only call after :func:`select` returned ``"cpu"``)."""
    assert _cpu is not None
    return _cpu


def cuda_module() -> ModuleType:
    """The compiled ``_cuda`` module (only call after :func:`select` returned ``"cuda"``)."""
    assert _cuda is not None
    return _cuda


def _check_name(name: str) -> str:
    value = name.strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"unknown comlrl.kernels backend {name!r}; expected one of {BACKENDS}")
    return value


def requested_backend() -> str:
    """The backend asked for now: the innermost :func:`use_backend`, else the env var."""
    forced = _forced.get()
    if forced is not None:
        return forced
    raw = os.environ.get(ENV_VAR, "") or "auto"
    try:
        return _check_name(raw)
    except ValueError:
        raise ValueError(
            f"{ENV_VAR}={raw!r} is not a backend; set it to one of {BACKENDS}"
        ) from None


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force the backend of comlrl.kernels ops inside the ``with`` block.

    ``name`` is ``"auto"``, ``"torch"``, ``"cpu"`` or ``"cuda"``; it overrides
    ``COMLRL_KERNELS_BACKEND``. The choice is per thread/task (a context variable); the
    backward of an op uses the backend its forward used.
    """
    token = _forced.set(_check_name(name))
    try:
        yield
    finally:
        _forced.reset(token)


def _native_for(device: torch.device) -> str | None:
    if device.type == "cuda":
        return "cuda"
    if device.type == "cpu":
        return "cpu"
    return None


def _missing_reason(backend: str) -> str | None:
    if backend == "cpu" and _cpu is None:
        return f"the _cpu extension is not available ({_CPU_ERROR})"
    if backend == "cuda" and _cuda is None:
        return f"the _cuda extension is not available ({_CUDA_ERROR}; {_BUILD_STATUS})"
    return None


def select(op: str, device: torch.device, unsupported: str | None = None) -> str:
    """Pick the backend for one call of ``op`` on tensors on ``device``.

    ``unsupported`` is a reason the native kernels cannot take these inputs (for example
    float64 logits), or None. Raises BackendUnavailableError when a forced backend cannot
    serve the call.
    """
    wanted = requested_backend()
    if wanted == "torch":
        return "torch"
    if wanted == "auto":
        native = _native_for(device)
        if native is None or unsupported is not None or _missing_reason(native) is not None:
            return "torch"
        return native
    # forced cpu / cuda
    if _native_for(device) != wanted:
        raise BackendUnavailableError(
            f"{op}: backend {wanted!r} is forced but the input is on {device}; move the "
            f"tensors to {wanted} or use backend 'auto' or 'torch'"
        )
    missing = _missing_reason(wanted)
    if missing is not None:
        raise BackendUnavailableError(
            f"{op}: backend {wanted!r} is forced but {missing}; reinstall comlrl-kernels "
            f"with a compiler (and nvcc for CUDA) or use backend 'auto' or 'torch'"
        )
    if unsupported is not None:
        raise BackendUnavailableError(
            f"{op}: backend {wanted!r} is forced but cannot serve this call: {unsupported}"
        )
    return wanted


def run(
    op: str, backend: str, native: Callable[[], T], reference: Callable[[], T]
) -> tuple[T, str]:
    """Run ``native`` (for backend ``backend``) or ``reference``; return (result, backend used).

    Under ``auto``, a RuntimeError from the native backend warns once per (op, backend) and
    the reference serves. ValueError (bad user input) always propagates.
    """
    if backend == "torch":
        return reference(), "torch"
    try:
        return native(), backend
    except ValueError:
        raise
    except RuntimeError as exc:
        if requested_backend() != "auto":
            raise
        key = (op, backend)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"comlrl.kernels: {backend} backend failed for {op} ({exc}); falling back to "
                f"the torch reference (warned once)",
                RuntimeWarning,
                stacklevel=3,
            )
        return reference(), "torch"


def num_threads() -> int:
    """Threads for the CPU kernels: torch's intra-op setting."""
    return max(1, torch.get_num_threads())


def cuda_stream(device: torch.device) -> int:
    """The current torch CUDA stream on ``device`` as an integer handle."""
    return int(torch.cuda.current_stream(device).cuda_stream)


def backend_info() -> dict[str, str]:
    """Say which backend serves each op now, and what was built.

    Keys: each op name (backend for inputs on the default device: CUDA when torch sees a
    GPU, else CPU), ``"<op>@cpu"`` and ``"<op>@cuda"`` (per device), ``"requested"`` (the
    forced backend or ``"auto"``), ``"_cpu"`` and ``"_cuda"`` (built, or why not), and
    ``"build"`` (the CMake decision recorded at build time).
    """
    info: dict[str, str] = {}
    try:
        wanted = requested_backend()
    except ValueError as exc:
        wanted = f"invalid ({exc})"
    info["requested"] = wanted
    gpu = torch.cuda.is_available()
    for op in OPS:
        for dev in ("cpu", "cuda"):
            try:
                info[f"{op}@{dev}"] = select(op, torch.device(dev))
            except (BackendUnavailableError, ValueError) as exc:
                info[f"{op}@{dev}"] = f"unavailable: {exc}"
        info[op] = info[f"{op}@cuda"] if gpu else info[f"{op}@cpu"]
    info["_cpu"] = (
        f"built; isa {_cpu.isa()}" if _cpu is not None else f"not available: {_CPU_ERROR}"
    )
    if _cuda is None:
        info["_cuda"] = f"not available: {_CUDA_ERROR}"
    else:
        count, error = _cuda.device_count()
        info["_cuda"] = (
            f"built; {count} device(s) visible" if count else f"built; no usable GPU ({error})"
        )
    info["build"] = _BUILD_STATUS
    return info
