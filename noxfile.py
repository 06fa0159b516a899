"""Test matrix for the CoMLRL monorepo.

``nox -s tests`` runs every package's tests in its own virtual environment holding only
that package, its declared dependencies and the test tools, then the cross-package tests
in ``tests/`` with all four packages installed. ``nox -s demo`` runs the built-in default
experiment. torch is pinned (``TORCH_SPEC``) because an unpinned torch pulls the CUDA build.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = False
nox.options.default_venv_backend = "venv"

ROOT = Path(__file__).parent
PACKAGES = ROOT / "packages"
TORCH_SPEC = os.environ.get("COMLRL_TORCH_SPEC", "torch==2.13.0")
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100"]
# Local sibling distributions each package needs (they are not on PyPI under these names).
LOCAL_DEPS = {
    "core": [],
    "kernels": [],
    "envs": ["core"],
    "algos": ["core", "kernels"],
}


def _kernels_wheel(session: nox.Session) -> str:
    """Build the comlrl-kernels wheel once per source state (the C++/CUDA build is the slow part)."""
    src = PACKAGES / "comlrl-kernels"
    digest = hashlib.sha256()
    for path in sorted(src.rglob("*")):
        if path.is_file() and "build" not in path.parts and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(src)).encode())
            digest.update(path.read_bytes())
    out = ROOT / ".nox" / "_wheels" / digest.hexdigest()[:16]
    wheels = list(out.glob("comlrl_kernels-*.whl"))
    if not wheels:
        session.run("python", "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(src))
        wheels = list(out.glob("comlrl_kernels-*.whl"))
    return str(wheels[0])


def _local(session: nox.Session, name: str) -> str:
    return _kernels_wheel(session) if name == "kernels" else str(PACKAGES / f"comlrl-{name}")


NEEDS_TORCH = {"kernels", "algos"}


def _install(session: nox.Session, names: list[str]) -> None:
    """Install the test tools, torch (pinned) only where a package needs it, then ``names``."""
    pinned = [TORCH_SPEC] if NEEDS_TORCH.intersection(names) else []
    session.install(*pinned, *TEST_TOOLS)
    session.install(*[_local(session, n) for n in names])


@nox.session
@nox.parametrize("package", ["core", "kernels", "envs", "algos", "integration"])
def tests(session: nox.Session, package: str) -> None:
    """Run one package's tests in a venv with only its declared dependencies."""
    if package == "integration":
        _install(session, ["core", "kernels", "envs", "algos"])
        target = "tests"
    else:
        _install(session, [*LOCAL_DEPS[package], package])
        target = f"packages/comlrl-{package}/tests"
    session.run("python", "-m", "pip", "list", "--format=freeze", silent=False)
    session.run(
        "python", "-m", "pytest", target, "-q", "-ra", "-p", "no:cacheprovider",
        *session.posargs,
        env={"COMLRL_KERNELS_REQUIRE_EXT": os.environ.get("COMLRL_KERNELS_REQUIRE_EXT", "1")},
    )


@nox.session
def demo(session: nox.Session) -> None:
    """Run the built-in default experiment (``comlrl train`` with no config)."""
    _install(session, ["core", "kernels", "envs", "algos"])
    session.run("comlrl", "train", *session.posargs)
