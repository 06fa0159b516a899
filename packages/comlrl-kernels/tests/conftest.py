"""Shared fixtures for the comlrl-kernels tests.

``backend`` runs a test once per backend: ``torch`` always, ``cpu`` when the C++ module
was built, ``cuda`` (marked ``cuda``) when the CUDA module was built and a GPU is visible.
"""

from __future__ import annotations

import pytest
import torch
from comlrl.kernels import _dispatch


def _cuda_ready() -> str | None:
    if _dispatch._cuda is None:
        return f"_cuda module not built ({_dispatch._CUDA_ERROR})"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    return None


def backend_skip_reason(name: str) -> str | None:
    if name == "cpu" and _dispatch._cpu is None:
        return f"_cpu module not built ({_dispatch._CPU_ERROR})"
    if name == "cuda":
        return _cuda_ready()
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cuda: needs a CUDA GPU and the compiled _cuda module (skipped otherwise)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _cuda_ready()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start from automatic selection whatever the caller's environment says."""
    monkeypatch.delenv(_dispatch.ENV_VAR, raising=False)


@pytest.fixture(
    params=["torch", "cpu", pytest.param("cuda", marks=pytest.mark.cuda)],
)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    reason = backend_skip_reason(name)
    if reason is not None:
        pytest.skip(reason)
    return name


@pytest.fixture
def device(backend: str) -> torch.device:
    return torch.device("cuda" if backend == "cuda" else "cpu")
