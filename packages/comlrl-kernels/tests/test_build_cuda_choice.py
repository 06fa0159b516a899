"""When the build compiles the CUDA module (``cmake/cuda_choice.cmake``).

``COMLRL_WITH_CUDA=AUTO`` (the default) builds it only where a GPU is visible: an ``nvcc``
on a machine without one (a CPU node, a container with the toolkit) would compile for
minutes a module nothing there runs. ``ON`` builds it with or without a GPU, ``OFF`` never.
The choice runs in CMake's script mode here with the places it looks for a GPU pointed at
test folders and programs, so the tests give the same answer on any machine; one configure
of the real ``CMakeLists.txt`` checks that AUTO without a GPU never looks for nvcc.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHOICE = ROOT / "cmake" / "cuda_choice.cmake"
CMAKE = shutil.which("cmake")

pytestmark = pytest.mark.skipif(CMAKE is None, reason="cmake is not on PATH")


def _program(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _choice(tmp: Path, with_cuda: str, **defines: str) -> tuple[str, str]:
    """``(build, reason)`` of ``comlrl_cuda_choice`` with these ``-D`` definitions."""
    probe = tmp / "probe.cmake"
    probe.write_text(
        f'include("{CHOICE}")\n'
        f'comlrl_cuda_choice("{with_cuda}" build reason)\n'
        'message("${build}|${reason}")\n'
    )
    args = [str(CMAKE), *(f"-D{k}={v}" for k, v in defines.items()), "-P", str(probe)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60)
    build, _, reason = out.stderr.strip().partition("|")
    return build, reason


def _no_gpu(tmp: Path) -> dict[str, str]:
    """A machine without a GPU: an empty driver folder and no nvidia-smi."""
    (tmp / "proc").mkdir(exist_ok=True)
    return {"COMLRL_NVIDIA_PROC": str(tmp / "proc"), "COMLRL_NVIDIA_SMI": str(tmp / "absent")}


def test_auto_builds_cuda_only_where_a_gpu_is_visible(tmp_path: Path) -> None:
    none = _no_gpu(tmp_path)
    build, reason = _choice(tmp_path, "AUTO", **none)
    assert build == "OFF" and reason.startswith("skipped (COMLRL_WITH_CUDA=AUTO and no GPU")
    assert "COMLRL_WITH_CUDA=ON builds it" in reason
    smi = _program(tmp_path / "nvidia-smi", 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"')
    assert _choice(tmp_path, "AUTO", **{**none, "COMLRL_NVIDIA_SMI": str(smi)}) == (
        "ON",
        "COMLRL_WITH_CUDA=AUTO and nvidia-smi -L lists a GPU",
    )
    failing = _program(tmp_path / "smi-fails", 'echo "NVIDIA-SMI has failed"; exit 9')
    assert _choice(tmp_path, "AUTO", **{**none, "COMLRL_NVIDIA_SMI": str(failing)})[0] == "OFF"
    (tmp_path / "proc" / "0000:01:00.0").mkdir()  # what the driver lists per GPU
    assert _choice(tmp_path, "AUTO", **none)[0] == "ON"


def test_on_builds_without_a_gpu_and_off_never(tmp_path: Path) -> None:
    none = _no_gpu(tmp_path)
    assert _choice(tmp_path, "ON", **none) == ("ON", "asked for (COMLRL_WITH_CUDA=ON)")
    (tmp_path / "proc" / "0000:01:00.0").mkdir()
    assert _choice(tmp_path, "OFF", **none) == ("OFF", "disabled (COMLRL_WITH_CUDA=OFF)")
    assert _choice(tmp_path, "AUTO", COMLRL_GPU_VISIBLE="OFF")[0] == "OFF"


def _configure(tmp: Path, *defines: str, env: dict[str, str] | None = None) -> str:
    if importlib.util.find_spec("pybind11") is None:
        pytest.skip("pybind11 (the build's own requirement) is not installed here")
    import pybind11

    args = [
        str(CMAKE), "-S", str(ROOT), "-B", str(tmp / "build"),
        f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", *defines,
    ]  # fmt: skip
    out = subprocess.run(
        args, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})}
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def test_auto_without_a_gpu_never_looks_for_nvcc(tmp_path: Path) -> None:
    """The real CMakeLists.txt with an nvcc on PATH (one that says if it was run) on a
    machine that shows no GPU: the CUDA compiler is never looked for."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _program(bin_dir / "nvcc", f'touch "{tmp_path}/nvcc-ran"; exit 1')
    none = _no_gpu(tmp_path)
    out = _configure(
        tmp_path,
        *(f"-D{k}={v}" for k, v in none.items()),
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COMLRL_WITH_CUDA": ""},
    )
    assert "comlrl-kernels: CUDA module skipped (COMLRL_WITH_CUDA=AUTO and no GPU visible" in out
    assert "Looking for a CUDA compiler" not in out
    assert not (tmp_path / "nvcc-ran").exists()
    info = (tmp_path / "build" / "_build_info.py").read_text()
    assert 'WITH_CUDA = "AUTO"' in info and "skipped" in info


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_on_with_the_architectures_of_the_environment_builds_cuda_without_a_gpu(
    tmp_path: Path,
) -> None:
    """``COMLRL_WITH_CUDA=ON CMAKE_CUDA_ARCHITECTURES=90`` (as environment variables, how a
    GPU machine's install is written) configures the CUDA module for sm_90."""
    out = _configure(
        tmp_path,
        *(f"-D{k}={v}" for k, v in _no_gpu(tmp_path).items()),
        env={"COMLRL_WITH_CUDA": "ON", "CMAKE_CUDA_ARCHITECTURES": "90"},
    )
    assert "comlrl-kernels: CUDA module enabled (nvcc" in out
    assert "archs 90; asked for (COMLRL_WITH_CUDA=ON))" in out
