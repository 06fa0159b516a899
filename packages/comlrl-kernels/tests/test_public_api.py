from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest


def test_import_comlrl_kernels_exports_every_name_in_all() -> None:
    kernels = importlib.import_module("comlrl.kernels")
    assert kernels.__all__, "comlrl.kernels.__all__ is empty"
    for name in kernels.__all__:
        assert getattr(kernels, name) is not None, name
        exec(f"from comlrl.kernels import {name}", {})


def test_comlrl_is_a_namespace_package() -> None:
    comlrl = importlib.import_module("comlrl")
    # PEP 420: no comlrl/__init__.py in any distribution.
    assert getattr(comlrl, "__file__", None) is None
    src = pathlib.Path(__file__).resolve().parents[1] / "src" / "comlrl"
    assert not (src / "__init__.py").exists()


def test_backend_info_names_every_op_and_module() -> None:
    from comlrl.kernels import backend_info

    info = backend_info()
    for key in ("token_logprobs", "linear_token_logprobs", "group_advantages", "_cpu", "_cuda"):
        assert key in info and isinstance(info[key], str)
    assert info["token_logprobs"] in ("torch", "cpu", "cuda")


def test_compiled_cpu_extension_present_when_required() -> None:
    """CI sets COMLRL_KERNELS_REQUIRE_EXT=1: then a missing _cpu module is a failure."""
    from comlrl.kernels import _dispatch

    if os.environ.get("COMLRL_KERNELS_REQUIRE_EXT") != "1":
        pytest.skip("COMLRL_KERNELS_REQUIRE_EXT is not 1; the extension is optional here")
    assert _dispatch._cpu is not None, f"_cpu did not import: {_dispatch._CPU_ERROR}"
    assert _dispatch.backend_info()["token_logprobs@cpu"] == "cpu"


def test_compiled_cuda_extension_present_when_required() -> None:
    """COMLRL_KERNELS_REQUIRE_CUDA=1 (set on GPU CI) makes a missing _cuda module a failure."""
    from comlrl.kernels import _dispatch

    if os.environ.get("COMLRL_KERNELS_REQUIRE_CUDA") != "1":
        pytest.skip("COMLRL_KERNELS_REQUIRE_CUDA is not 1; the CUDA module is optional here")
    assert _dispatch._cuda is not None, f"_cuda did not import: {_dispatch._CUDA_ERROR}"


def test_import_works_and_torch_serves_when_extensions_fail_to_import() -> None:
    """A broken or missing build must not break `import comlrl.kernels`."""
    code = textwrap.dedent(
        """
        import importlib.abc, importlib.machinery, sys

        class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            def find_spec(self, name, path=None, target=None):
                if name in ("comlrl.kernels._cpu", "comlrl.kernels._cuda"):
                    return importlib.machinery.ModuleSpec(name, self)
                return None
            def create_module(self, spec):
                raise ImportError("simulated: extension missing")
            def exec_module(self, module):
                pass

        sys.meta_path.insert(0, Broken())
        import torch
        import comlrl.kernels as K
        info = K.backend_info()
        assert info["token_logprobs@cpu"] == "torch", info
        assert "simulated" in info["_cpu"] and "simulated" in info["_cuda"], info
        out = K.token_logprobs(torch.randn(3, 5), torch.tensor([0, 1, 4]))
        assert out.shape == (3,)
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "COMLRL_KERNELS_BACKEND"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
