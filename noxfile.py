"""Test matrix, lint and type check for the CoMLRL monorepo.

``nox -s tests`` runs every package's tests in its own virtual environment holding only
that package, its declared dependencies and the test tools, then the cross-package tests
in ``tests/`` with all five packages installed:

- the torch-free packages on the Pythons in :data:`PYTHONS_FOR` (``core`` on all of
  :data:`ALL_PYTHONS`, ``envs`` on 3.10 and 3.13) that are on this machine (``PATH`` or pyenv's ``~/.pyenv/versions``); a missing one is
  skipped with a message. The tests marked ``slow`` (sweeps over every reference
  solution of a data set, 1000 sandbox timeouts, the learning runs of the pretrained
  model) are left out on every Python: ``nox -s slow`` runs them, once, on
  :data:`TORCH_PYTHON` (``slow(integration)`` and ``compat`` reuse ``tests(integration)``'s
  venv when it holds this checkout). ``.ci/run`` runs envs' slow tests by ``slow(envs)``
  and the cross-package ones inside ``tests(integration)`` (``COMLRL_NOX_WITH_SLOW``);
- the torch packages (``kernels``, ``estimators``, ``algos``, ``compat``) and ``integration``
  on :data:`TORCH_PYTHON`, the Python the pinned CPU torch wheel is installed for.
  ``tests(estimators)`` is the proof that the estimators install with torch alone: its venv
  holds torch, ``comlrl-kernels``, ``comlrl-estimators`` and the test tools, nothing else,
  and its tests import every public name.

``nox -s lint`` runs ``ruff check`` and ``ruff format --check`` over the repository;
``nox -s typecheck`` runs mypy over the five packages' sources (settings in
``pyproject.toml``). ``nox -s demo`` runs the built-in default experiment. torch is
pinned (``TORCH_SPEC``) because an unpinned torch pulls the CUDA build. The venvs are made
with uv where it is installed (``pip install nox uv``), else with venv and pip.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = False
# uv where it is installed (``pip install nox uv``; .ci/run does), else the standard venv
# and pip: the same packages either way (uv is only faster: measured on the 2-core machine,
# algos' venv with torch and the extras in 3.9 s wall with an empty uv cache, 2.6 s with a
# warm one, against ~85 s with pip). uv downloads no interpreter: a missing one is skipped.
nox.options.default_venv_backend = "uv|venv"
if hasattr(nox.options, "download_python"):  # an older nox downloads no interpreter anyway
    nox.options.download_python = "never"
# A Python that is not installed is skipped with nox's message, also under CI=true.
nox.options.error_on_missing_interpreters = False

ROOT = Path(__file__).parent
PACKAGES = ROOT / "packages"
TORCH_SPEC = os.environ.get("COMLRL_TORCH_SPEC", "torch==2.13.0")
RUFF_SPEC = "ruff==0.17.6"
MYPY_SPEC = "mypy==2.4.1"
IMPORT_LINTER_SPEC = "import-linter==2.16"
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100", "pytest-xdist>=3.5"]
# The long sessions run their test files on two workers (CI has two cores); a file's tests
# stay on one worker so module-scoped fixtures (reference runs) are built once. Each worker
# collects (imports) every test file, and CI's two cores are two hyperthreads whose second
# thread adds far less than a core, so a worker pays only where the tests outweigh that.
# Measured on the 2-core machine, alone, two workers vs one process (wall s, CPU-s):
# envs 88 / 79 vs 169 / 81, and four workers 93 / 93 (two: its wall is one file's sandbox
# timeouts); algos 48 / 88 vs 74 / 73 (bytecode not yet written, as in CI's fresh clone:
# each worker compiles what it imports), compat 40 / 74 vs 49 / 49 and estimators
# 19.6 / 33.6 vs 20.9 / 20.9 (one process: in CI they run beside the background sessions,
# which keep the other core busy, so a second worker adds CPU time and little speed).
# ``integration`` runs last, alone once the background sessions end: two workers.
PARALLEL = {
    "envs": ["-n", "2", "--dist", "loadfile"],
    # the queue in collection order (tests/conftest.py puts the longest files first), not
    # xdist's default order by number of tests per file
    "integration": ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"],
}
#: torch sessions whose pytest workers (or one process) get one intra-op (OpenMP) thread
#: each. Two workers on two cores with torch's default (a thread per core) put four OpenMP
#: threads on two cores, and an idle OpenMP thread spins before it sleeps: CPU time spent
#: waiting. Measured on the 2-core machine (with other jobs on it):
#: test_actor_critic_resume.py 64.6 user + 0.9 sys CPU-s with the default, 11.8 + 0.9 with
#: one thread; test_evaluate.py 15.3 + 0.8 vs 9.6 + 0.8. A test that needs threads sets
#: them (torch.set_num_threads); an OMP_NUM_THREADS in the environment wins. kernels keeps
#: the default: its tests run the C++ kernels' threaded path, which takes its thread count
#: from torch.
ONE_THREAD_PER_WORKER = {"estimators", "algos", "compat", "integration"}
#: the environment of the test runs: Python writes the bytecode of what it imports (under
#: ``.nox/_pycache``, so the checkout stays clean) even where ``PYTHONDONTWRITEBYTECODE`` is
#: set. pip compiles a venv's bytecode when it installs, uv does not (``--compile-bytecode``
#: compiles all of it: 36 CPU-s for the cross-package venv, measured on the 2-core
#: machine); without bytecode every Python process, each pytest worker and each
#: ``comlrl train`` child, compiles torch and transformers again: 11.7 user-s to import
#: them and comlrl without .pyc files, 4.9 with them, and ~7 s once to write them.
WRITE_BYTECODE: dict[str, str | None] = {
    "PYTHONDONTWRITEBYTECODE": None,
    "PYTHONPYCACHEPREFIX": str(ROOT / ".nox" / "_pycache"),
}
#: the GGUF cache of the test runs (comlrl.algos.models.gguf), one for every session: the
#: first test that loads SmolLM2's GGUF file converts it (~24 CPU-s), every later load in
#: any session reads the entry (~3 s); an environment's own COMLRL_GGUF_CACHE wins
GGUF_CACHE = {
    "COMLRL_GGUF_CACHE": os.environ.get("COMLRL_GGUF_CACHE", str(ROOT / ".nox" / "_gguf_cache"))
}
#: OpenMP threads that wait for work sleep at once instead of spinning first: where the
#: test sessions share the cores (CI runs several at once), a spinning thread takes the core
#: of the thread it waits for. Measured on the 2-core machine, kernels' tests (two OpenMP
#: threads) beside two busy processes: 29.5 user-s and 37.2 s wall spinning, 16.2 user-s and
#: 26.1 s passive; alone, 18.6 vs 18.4 user-s. Results are the same either way (only idle
#: threads change). An OMP_WAIT_POLICY in the environment wins.
OMP_WAIT = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
ALL_PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
TORCH_PYTHON = "3.11"
TORCH_FREE = ["core", "envs"]
# Local sibling distributions each package needs (they are not on PyPI under these names).
LOCAL_DEPS = {
    "core": [],
    "kernels": [],
    "estimators": ["kernels"],
    "envs": ["core"],
    "algos": ["core", "kernels", "estimators"],
    "compat": ["core", "kernels", "estimators", "algos"],
}
# Optional extras installed with a package for its tests (they test what the extras do).
EXTRAS = {"algos": "[gguf,lora,plot,tensorboard,wandb]", "envs": "[serve]"}
NEEDS_TORCH = {"kernels", "estimators", "algos", "compat"}


def _pip_settings_for_uv() -> None:
    """Hand pip's ``find-links`` and ``constraint`` settings (its config files and ``PIP_*``
    variables, as ``pip config list`` shows them) to uv, which reads none of pip's settings,
    unless ``UV_FIND_LINKS`` / ``UV_CONSTRAINT`` are set already: where the CPU torch wheel
    lies in a local folder named by pip's config, uv must find the same wheel (without it,
    ``torch==2.13.0`` from PyPI is the CUDA build with its nvidia-* wheels)."""
    # uv's separators: commas between find-links, spaces between constraint files
    wanted = {"find-links": ("UV_FIND_LINKS", ","), "constraint": ("UV_CONSTRAINT", " ")}
    if all(var in os.environ for var, _ in wanted.values()):
        return
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    found: dict[str, list[str]] = {}
    for line in listing.stdout.splitlines():  # e.g. global.find-links='/opt/wheels'
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in wanted:
            for item in value.strip("'\"").split():
                if item not in found.setdefault(name, []):
                    found[name].append(item)
    for name, (var, sep) in wanted.items():
        if found.get(name) and var not in os.environ:
            os.environ[var] = sep.join(found[name])


_pip_settings_for_uv()


def _runs(exe: str) -> bool:
    """Whether ``exe --version`` works (pyenv's shims exist for versions that are not active)."""
    try:
        return subprocess.run([exe, "--version"], capture_output=True, check=False).returncode == 0
    except OSError:
        return False


def _find_pythons() -> list[str]:
    """Put pyenv's interpreters for :data:`ALL_PYTHONS` on ``PATH`` where the plain
    ``python3.X`` does not run; returns the versions that are still missing."""
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    missing, found = [], []
    for minor in ALL_PYTHONS:
        if _runs(f"python{minor}"):
            continue
        candidates = sorted(
            versions.glob(f"{minor}.*/bin/python{minor}"),
            key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.parent.name)],
        )
        if candidates:
            found.append(str(candidates[-1].parent))
        else:
            missing.append(minor)
    if found:
        os.environ["PATH"] = os.pathsep.join([*found, os.environ.get("PATH", "")])
    return missing


MISSING_PYTHONS = _find_pythons()
for _minor in MISSING_PYTHONS:
    print(f"noxfile: Python {_minor} not found (PATH, pyenv); its test sessions are skipped")


def _kernels_wheel(session: nox.Session) -> str:
    """Build the comlrl-kernels wheel once per source state (the C++/CUDA build is the slow part)."""
    src = PACKAGES / "comlrl-kernels"
    digest = hashlib.sha256()
    for path in sorted(src.rglob("*")):
        if path.is_file() and "build" not in path.parts and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(src)).encode())
            digest.update(path.read_bytes())
    out = ROOT / ".nox" / "_wheels" / digest.hexdigest()[:16]
    out.mkdir(parents=True, exist_ok=True)
    # CI runs typecheck beside the tests: one builds the wheel, the other waits for it.
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheels = list(out.glob("comlrl_kernels-*.whl"))
        if not wheels:
            # run_install: an install step, so that `nox --install-only` builds it too
            if session.venv_backend == "uv":  # a uv venv has no pip
                session.run_install("uv", "build", "--wheel", "--out-dir", str(out), str(src))
            else:
                session.run_install(
                    "python", "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(src)
                )
            wheels = list(out.glob("comlrl_kernels-*.whl"))
    return str(wheels[0])


def _local(session: nox.Session, name: str, extras: str = "") -> str:
    if name == "kernels":
        return _kernels_wheel(session)
    return f"{PACKAGES / f'comlrl-{name}'}{extras}"


def _install(session: nox.Session, names: list[str], tested: str | None = None) -> None:
    """Install the test tools, torch (pinned) only where a package needs it, then ``names``
    (``tested`` with its :data:`EXTRAS`)."""
    pinned = [TORCH_SPEC] if NEEDS_TORCH.intersection(names) else []
    session.install(*pinned, *TEST_TOOLS)
    session.install(*[_local(session, n, EXTRAS.get(n, "") if n == tested else "") for n in names])


# envs (sandbox, suites: ~1 minute a Python on 2 cores) runs on the oldest and newest
# Pythons (its slow tests and the cross-package tests run it on TORCH_PYTHON); core
# (seconds) on all of them.
PYTHONS_FOR = {"core": ALL_PYTHONS, "envs": ["3.10", "3.13"]}
#: packages left out of ``nox -s tests`` (comma-separated): ``.ci/run`` runs the README's
#: ``nox -s tests`` with ``COMLRL_NOX_SKIP_PACKAGES=core,envs`` and those sessions by name beside
#: it. Left out of the matrix, not skipped inside the session: nox would first recreate the
#: skipped session's venv, which the run beside it is using.
SKIPPED_PACKAGES = [p for p in os.environ.get("COMLRL_NOX_SKIP_PACKAGES", "").split(",") if p]
#: packages whose ``tests`` session also runs their tests marked ``slow`` (comma-separated):
#: ``.ci/run`` sets ``integration``, so the cross-package tests run in one pytest run
#: (one start of the workers, one tail where a worker waits for the other) instead of
#: ``tests(integration)`` and then ``slow(integration)``.
WITH_SLOW_PACKAGES = [p for p in os.environ.get("COMLRL_NOX_WITH_SLOW", "").split(",") if p]
MATRIX = [
    (py, pkg)
    for py, pkg in [(py, pkg) for pkg in TORCH_FREE for py in PYTHONS_FOR[pkg]]
    + [(TORCH_PYTHON, pkg) for pkg in ("kernels", "estimators", "algos", "compat", "integration")]
    if pkg not in SKIPPED_PACKAGES
]


#: venvs that hold our five packages with algos' extras and the test tools, as
#: :func:`_install_all` makes them: ``tests(integration)``'s (built first in CI), then
#: ``slow(integration)``'s. ``slow(integration)`` and ``compat`` run in one of them when its
#: installed ``comlrl`` sources equal this checkout's (:func:`_reusable_python`), so CI
#: installs torch and the extras for the cross-package tests once, not three times.
REUSABLE_VENVS = [
    f"tests-python-{TORCH_PYTHON.replace('.', '-')}-package-integration",
    "slow-package-integration",
]
#: run by a candidate venv's Python: exit 0 when every ``comlrl.<name>`` subpackage of
#: ``packages/*/src`` (argv[1]) is importable and holds each of its ``.py`` files
#: unchanged, and the extras and test tools that the reusing sessions need import (a
#: missing ``peft`` or ``gguf`` would turn tests into skips, not failures)
_SAME_SOURCES = """
import importlib, pathlib, sys
for src in sorted(pathlib.Path(sys.argv[1]).glob("*/src/comlrl/*")):
    if not (src / "__init__.py").is_file():
        continue
    mod = importlib.import_module("comlrl." + src.name)
    installed = pathlib.Path(mod.__file__).parent
    for path in src.rglob("*.py"):  # a build may add files (kernels' _build_info.py)
        copy = installed / path.relative_to(src)
        if not copy.is_file() or copy.read_bytes() != path.read_bytes():
            sys.exit(f"comlrl.{src.name}: installed {copy} differs from {path}")
import aiohttp, datasets, gguf, hypothesis, peft, pytest, transformers, xdist
"""


def _install_all(session: nox.Session) -> None:
    """The five packages, algos with its :data:`EXTRAS`, the test tools (cross-package tests),
    and envs' ``[serve]`` extra (aiohttp: ``comlrl serve``, ``tests/test_task_serving.py``)."""
    _install(session, ["core", "kernels", "estimators", "envs", "algos", "compat"], tested="algos")
    session.install(_local(session, "envs", "[serve]"))


def _reusable_python(session: nox.Session) -> str | None:
    """The Python of a venv in :data:`REUSABLE_VENVS` whose installed ``comlrl`` sources
    equal this checkout's, else None (then the caller installs)."""
    for name in REUSABLE_VENVS:
        python = ROOT / ".nox" / name / "bin" / "python"
        if not python.is_file():
            continue
        check = subprocess.run(
            [str(python), "-c", _SAME_SOURCES, str(PACKAGES)], capture_output=True, text=True
        )
        if check.returncode == 0:
            session.log(f"reusing .nox/{name} (its comlrl sources equal this checkout's)")
            return str(python)
        session.log(f"not reusing .nox/{name}: {check.stderr.strip()[-200:]}")
    return None


def _list_installed(session: nox.Session) -> None:
    """Print the venv's packages and versions (``name==version``) into the log."""
    if session.venv_backend == "uv":
        session.run("uv", "pip", "freeze", silent=False)
    else:
        session.run("python", "-m", "pip", "list", "--format=freeze", silent=False)


@nox.session
@nox.parametrize(("python", "package"), MATRIX)
def tests(session: nox.Session, package: str) -> None:
    """Run one package's tests in a venv with only its declared dependencies
    (:data:`MATRIX`; ``COMLRL_NOX_SKIP_PACKAGES`` leaves packages out, and
    ``COMLRL_NOX_WITH_SLOW`` names those that run their slow tests too)."""
    if package == "integration":
        _install_all(session)
        target = "tests"
    else:
        _install(session, [*LOCAL_DEPS[package], package], tested=package)
        target = f"packages/comlrl-{package}/tests"
    _list_installed(session)
    marks = [] if package in WITH_SLOW_PACKAGES else ["-m", "not slow"]
    _pytest(session, package, target, marks)


@nox.session(python=TORCH_PYTHON)
@nox.parametrize("package", ["envs", "integration"])
def slow(session: nox.Session, package: str) -> None:
    """The tests marked ``slow`` (the packages that have any), on :data:`TORCH_PYTHON` only.
    ``integration`` runs in ``tests(integration)``'s venv when that holds this checkout
    (:func:`_reusable_python`; ``.ci/run`` runs it after ``nox -s tests``)."""
    python = "python"
    if package == "integration":
        python = _reusable_python(session) or "python"
        if python == "python":
            _install_all(session)
        target = "tests"
    else:
        _install(session, [*LOCAL_DEPS[package], package], tested=package)
        target = f"packages/comlrl-{package}/tests"
    _pytest(session, package, target, ["-m", "slow"], python=python)


def _seed_bytecode(venv: Path) -> int:
    """Link into ``venv``'s bytecode (under :data:`WRITE_BYTECODE`'s prefix) what the other
    venvs of this checkout already compiled for the very same installed files; returns how
    many files it linked.

    uv installs a package's files as hard links to its cache, so the venvs of one checkout
    share torch's, transformers' ... files (same inodes), and a ``.pyc`` compiled for one is
    valid for the others (Python checks a ``.pyc`` against its source's mtime and size and
    sets the code's file name to the importing path). A file is linked only where both
    venvs' sources are one file (``os.path.samefile``), so another version of a package, or
    a copy, is compiled as usual. Without it each venv compiles the ~3,800 modules its tests
    import (~7 CPU-s), and each of two pytest workers does so at once."""
    prefix = Path(WRITE_BYTECODE["PYTHONPYCACHEPREFIX"] or "")
    mine = next(venv.glob("lib/python*/site-packages"), None)
    if mine is None:
        return 0
    linked = 0
    for site in (prefix / ROOT.relative_to(ROOT.anchor) / ".nox").glob(
        f"*/lib/{mine.parent.name}/site-packages"
    ):
        source_site = Path(ROOT.anchor) / site.relative_to(prefix)
        if source_site == mine:
            continue
        for pyc in site.rglob("*.pyc"):
            rel = pyc.relative_to(site)
            dest = prefix / mine.relative_to(mine.anchor) / rel
            module = rel.parent / (rel.name.split(".", 1)[0] + ".py")
            try:
                if dest.exists() or not os.path.samefile(source_site / module, mine / module):
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.link(pyc, dest)
                linked += 1
            except OSError:  # a source that is not there, another file system: compile it
                continue
    return linked


def _pytest(
    session: nox.Session,
    package: str,
    target: str,
    marks: list[str],
    python: str = "python",
) -> None:
    """pytest over ``target`` with ``python`` (this session's venv, or a path to another's),
    on the workers :data:`PARALLEL` gives ``package`` (none: one process), after
    :func:`_seed_bytecode`."""
    venv = Path(python).parent.parent if python != "python" else Path(session.virtualenv.location)
    session.log(f"bytecode of other venvs linked: {_seed_bytecode(venv)} files")
    session.run(
        python,
        "-m",
        "pytest",
        target,
        "-q",
        "-ra",
        "-p",
        "no:cacheprovider",
        *marks,
        # One fixed seed for every property test: CI runs are reproducible and cannot
        # fail on an example that an earlier run did not try (run without it to explore).
        "--hypothesis-seed=0",
        *PARALLEL.get(package, []),
        "--durations=10",  # the slowest tests, to keep CI's time in view
        *session.posargs,
        env={
            **WRITE_BYTECODE,
            **GGUF_CACHE,
            **OMP_WAIT,
            "COMLRL_KERNELS_REQUIRE_EXT": os.environ.get("COMLRL_KERNELS_REQUIRE_EXT", "1"),
            **(
                {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
                if package in ONE_THREAD_PER_WORKER
                else {}
            ),
        },
        external=python != "python",
    )


@nox.session(python=TORCH_PYTHON)
def lint(session: nox.Session) -> None:
    """``ruff check`` and ``ruff format --check`` over the repository, then the import-linter
    contracts (comlrl.algos' layers; settings in pyproject.toml)."""
    session.install(RUFF_SPEC, IMPORT_LINTER_SPEC)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # import-linter reads the sources statically; the four src folders make the namespace.
    src = os.pathsep.join(str(PACKAGES / p / "src") for p in sorted(os.listdir(PACKAGES)))
    session.run("lint-imports", env={"PYTHONPATH": src})


@nox.session(python=TORCH_PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy over the five packages' sources and this file, with their dependencies installed."""
    session.install(TORCH_SPEC, MYPY_SPEC, "nox")
    session.install(
        *[_local(session, n) for n in ("core", "kernels", "estimators", "envs", "algos", "compat")]
    )
    session.run(
        "mypy",
        "packages/comlrl-core/src",
        "packages/comlrl-envs/src",
        "packages/comlrl-kernels/src",
        "packages/comlrl-estimators/src",
        "packages/comlrl-algos/src",
        "packages/comlrl-compat/src",
        "noxfile.py",
    )


@nox.session(python=TORCH_PYTHON)
def demo(session: nox.Session) -> None:
    """Run the built-in default experiment (``comlrl train`` with no config)."""
    _install_all(session)
    session.run("comlrl", "train", *session.posargs)


#: CoMLRL 1.4.3's sdist (its tests/ folder is the suite the compat session runs)
COMLRL_143 = "comlrl==1.4.3"
#: the 1.4.3 test files that are the compat layer's contract (its constructors, configs and
#: comlrl.utils); the rest of 1.4.3's suite tests its private methods and files
COMPAT_TEST_FILES = ["test_config.py", "test_trainer_init.py", "test_utils.py"]


def _comlrl143_tests(session: nox.Session) -> Path:
    """1.4.3's ``tests/`` folder, unpacked from its sdist, downloaded once into
    ``.nox/_comlrl143`` (``pip download --no-deps --no-binary :all:``)."""
    cache = ROOT / ".nox" / "_comlrl143"
    tests = cache / "tests"
    if tests.is_dir():
        return tests
    cache.mkdir(parents=True, exist_ok=True)
    sdists = list(cache.glob("comlrl-1.4.3.tar.gz"))
    if not sdists:
        # nox's own pip: a uv venv has none
        session.run(
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            COMLRL_143, "-d", str(cache), external=True,
        )  # fmt: skip
        sdists = list(cache.glob("comlrl-1.4.3.tar.gz"))
    import tarfile

    with tarfile.open(sdists[0]) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("comlrl-1.4.3/tests/")]
        tar.extractall(cache / "_unpacked", members=members, filter="data")
    (cache / "_unpacked" / "comlrl-1.4.3" / "tests").rename(tests)
    return tests


@nox.session(python=TORCH_PYTHON)
def compat(session: nox.Session) -> None:
    """CoMLRL 1.4.3's own tests of its public API, unmodified, against ``comlrl.trainers`` /
    ``comlrl.utils``: its sdist's ``tests/`` folder (cached under ``.nox/_comlrl143``; only
    the tests are unpacked, so its ``comlrl`` package cannot shadow ours) with its own
    ``helpers.py``/``conftest.py`` imported the way its pytest config does. It runs in the
    integration tests' venv when that holds this checkout (:func:`_reusable_python`: nothing
    to install, as in CI after ``nox -s tests``), else in its own venv holding our four
    packages. It runs :data:`COMPAT_TEST_FILES`; all must pass. Pass test files and pytest
    options to run others, e.g. ``nox -s compat -- test_config.py -x``."""
    tests = _comlrl143_tests(session)
    python = _reusable_python(session)
    if python is None:
        _install_all(session)
        python = "python"
    ini = tests.parent / "pytest.ini"
    ini.write_text("[pytest]\n")  # keeps the monorepo's pytest settings out of 1.4.3's suite
    targets = session.posargs or COMPAT_TEST_FILES
    session.chdir(tests)
    session.run(
        python, "-m", "pytest", *targets, "-c", str(ini), "--rootdir", str(tests),
        "-p", "no:cacheprovider", "-q", "-ra",
        env={**WRITE_BYTECODE, "WANDB_MODE": "disabled"}, external=True,
    )  # fmt: skip
