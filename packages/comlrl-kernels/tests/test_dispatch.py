"""Backend selection: env var, context manager, forced failures, warn-once fallback."""

from __future__ import annotations

import types
import warnings

import pytest
import torch
from comlrl.kernels import (
    BackendUnavailableError,
    _dispatch,
    backend_info,
    group_advantages,
    token_logprobs,
    use_backend,
)
from comlrl.kernels._reference import token_logprobs_reference

needs_cpu = pytest.mark.skipif(_dispatch._cpu is None, reason="_cpu module not built")


class Spy:
    """Stands in for the _cpu module: records calls, optionally fails."""

    def __init__(self, real: types.ModuleType | None, fail: bool = False) -> None:
        self.real, self.fail, self.calls = real, fail, 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.fail:
                raise RuntimeError("injected native failure")
            return getattr(self.real, name)(*args, **kwargs)

        return call


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 33), torch.tensor([0, 5, 7, 32])


@needs_cpu
def test_auto_sends_cpu_tensors_to_the_cpp_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(_dispatch._cpu)
    monkeypatch.setattr(_dispatch, "cpu_module", lambda: spy)
    token_logprobs(*inputs())
    assert spy.calls == 1
    assert backend_info()["token_logprobs@cpu"] == "cpu"


@needs_cpu
@pytest.mark.parametrize("how", ["env", "context"])
def test_forcing_torch_bypasses_the_extension(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    spy = Spy(_dispatch._cpu)
    monkeypatch.setattr(_dispatch, "cpu_module", lambda: spy)
    logits, targets = inputs()
    if how == "env":
        monkeypatch.setenv("COMLRL_KERNELS_BACKEND", "torch")
        out = token_logprobs(logits, targets)
        assert backend_info()["token_logprobs"] == "torch"
    else:
        with use_backend("torch"):
            out = token_logprobs(logits, targets)
            assert backend_info()["requested"] == "torch"
    assert spy.calls == 0
    torch.testing.assert_close(out, token_logprobs_reference(logits, targets), atol=1e-5, rtol=1e-5)


def test_context_manager_overrides_the_environment_and_restores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMLRL_KERNELS_BACKEND", "cuda")
    assert _dispatch.requested_backend() == "cuda"
    with use_backend("torch"):
        assert _dispatch.requested_backend() == "torch"
        with use_backend("auto"):
            assert _dispatch.requested_backend() == "auto"
        assert _dispatch.requested_backend() == "torch"
    assert _dispatch.requested_backend() == "cuda"


def test_forced_cuda_on_a_cpu_tensor_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMLRL_KERNELS_BACKEND", "cuda")
    with pytest.raises(BackendUnavailableError, match="'cuda' is forced"):
        token_logprobs(*inputs())
    with pytest.raises(BackendUnavailableError, match="'cuda' is forced"):
        group_advantages(torch.zeros(4), group_size=2)


def test_forced_cpu_without_the_extension_raises_and_auto_uses_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_dispatch, "_cpu", None)
    monkeypatch.setattr(_dispatch, "_CPU_ERROR", "import failed: simulated")
    with use_backend("cpu"), pytest.raises(BackendUnavailableError, match="simulated"):
        token_logprobs(*inputs())
    assert backend_info()["token_logprobs@cpu"] == "torch"
    assert "simulated" in backend_info()["_cpu"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing extension is not worth a warning
        token_logprobs(*inputs())


def test_unknown_backend_names_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown"):
        with use_backend("triton"):
            pass
    monkeypatch.setenv("COMLRL_KERNELS_BACKEND", "gpu")
    with pytest.raises(ValueError, match="COMLRL_KERNELS_BACKEND"):
        token_logprobs(*inputs())


@needs_cpu
def test_auto_fallback_warns_once_and_matches_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_dispatch, "_warned", set())
    spy = Spy(_dispatch._cpu, fail=True)
    monkeypatch.setattr(_dispatch, "cpu_module", lambda: spy)
    logits, targets = inputs()
    logits.requires_grad_()
    with pytest.warns(RuntimeWarning, match="falling back"):
        out = token_logprobs(logits, targets)
    out.sum().backward()
    torch.testing.assert_close(out, token_logprobs_reference(logits, targets), atol=1e-5, rtol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        token_logprobs(logits, targets)  # second failure of the same op: silent
    with pytest.warns(RuntimeWarning, match="group_advantages"):
        group_advantages(torch.randn(4), group_size=2)  # another op warns once too
    # forward, second forward, group_advantages; the backward follows its forward to torch
    assert spy.calls == 3


@needs_cpu
def test_forced_native_failure_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_dispatch, "cpu_module", lambda: Spy(_dispatch._cpu, fail=True))
    with use_backend("cpu"), pytest.raises(RuntimeError, match="injected"):
        token_logprobs(*inputs())
