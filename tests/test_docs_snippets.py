"""Every command and code block in README.md, docs/*.md and packages/*/README.md runs as
pasted, and every module path the docs and the docstrings name exists.

Each page's fenced blocks run in order in one empty folder, the way a reader pastes them
into one shell (so a later ``comlrl train --resume runs/x`` finds the run an earlier block
made). What a block is, is said by its info string:

- ``bash``: one command per line (``\\`` continues a line, ``#`` starts a comment).
  ``comlrl ...`` runs in this process through :func:`comlrl.algos.cli.main.main` and must
  return 0, and a command that starts a run must not reuse the ``output_dir`` of an
  earlier one on the page (``no-test`` blocks included: a reader runs the Quickstart's
  ``comlrl train``). To keep the test short, :func:`_short_settings` appends overrides to
  ``comlrl train`` / ``comlrl eval`` (``num_steps=2 batch_size=1 num_generations=2
  max_new_tokens=8 ...``, each only where the recipe has that key; ``save_every`` and
  ``eval_every`` become 1 where the command sets them; a ``--resume`` continues 2 steps
  further). Any other command runs under ``bash -c`` in the folder.
- ``python``: the block is executed on its own (a fresh namespace: imports included),
  with ``num_steps=<n>`` replaced by ``num_steps=2`` (the one constant substituted).
- ``yaml file=NAME``: written to ``NAME`` for a later command (``--config NAME``);
  ``yaml`` alone: a config fragment, checked with ``comlrl train --config ... --print-config``.
- ``python file=NAME`` and ``toml file=NAME``: written to ``NAME`` (folders made), the
  way a reader saves a file (a Python file is compiled, not run; ``toml`` needs ``file=``).
- ``pip install [-e] DIR`` of a folder the page wrote (its ``pyproject.toml``) is not run
  by pip: the test puts ``DIR`` (``DIR/src`` if there is one) on ``sys.path`` for the rest
  of the page and declares the ``[project]`` name and ``[project.entry-points]`` of its
  ``pyproject.toml`` there as an installed distribution would (a ``*.dist-info`` folder),
  so its modules import and ``comlrl`` finds the tasks it registers, and nothing is left
  installed after the test.
- ``text``: output or a diagram; nothing runs. Its words that look like paths of ours (a
  file tree, a repository map) must exist; in ``text root=DIR`` every word that looks
  like a path must exist under ``DIR``, at any depth.
- ``<lang> no-test``: cannot run here (an install, a GPU, torchrun over nodes, vLLM, the
  network, a Hub model id, or a test suite or benchmark, which ``nox`` runs); skipped, and
  the only blocks that may be.

A block with another or no info string fails the test, so a new block is either run or
marked. The pages also name modules (``comlrl.algos.x.y``), repository files and other
pages: each must exist (:func:`test_names_and_links_in_the_docs_exist`; only the paths
and links of ``docs/compat.md``, which also names what CoMLRL 1.4.3 had and this
package lacks). A package README names files by their path in the repository, in its
package (``src/comlrl/envs/...``, ``tests/...``) or below a folder of its package that
its text is about (``results/x.json`` of ``benchmarks/``); any of these will do.

The sources of ``packages/*/src`` name modules in their docstrings: every dotted
``comlrl.x.y`` and every ``:mod:``/``:func:``/``:class:``/... reference whose target is a
module path (``comlrl.x.y``, a relative ``.x`` read against the module's package, or a
path of another importable package such as ``torch.optim.AdamW``) must import and
resolve (:func:`test_module_paths_in_docstrings_resolve`; bare names and ``Class.attr``
references are not checked).

``docs/compat.md`` is left out: its blocks show CoMLRL 1.4.3 code fragments and
``examples/comlrl143/`` (run by ``packages/comlrl-compat/tests/test_compat_examples.py``)
holds the complete scripts.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Pages whose blocks are run, relative to the repository root.
PAGES = [
    "README.md",
    *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")),
    *sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("packages/*/README.md")),
]
#: Pages not run here, and why (module docstring).
NOT_RUN = {"docs/compat.md": "CoMLRL 1.4.3 fragments; examples/comlrl143/ runs the scripts"}
RUN_PAGES = [p for p in PAGES if p not in NOT_RUN]
LANGS = {"bash", "python", "yaml", "text", "toml"}

#: Overrides appended to a fresh ``comlrl train`` (those the recipe has).
SHORT_TRAIN = {
    "num_steps": "2",
    "batch_size": "1",
    "num_generations": "2",
    "max_new_tokens": "8",
    "eval_limit": "2",
    "log_samples": "1",
    "num_collect_batches": "1",
    "progress": "false",
}
#: Set to 1 where the command sets them, so checkpoints and evaluations happen in 2 steps.
EVERY = ("save_every", "eval_every")
SHORT_EVAL = {"eval_limit": "2", "max_new_tokens": "8"}


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: its page, first line number, language, flags and text."""

    page: str
    line: int
    lang: str
    flags: tuple[str, ...]
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def flag(self, key: str) -> str | None:
        """The value of ``key=VALUE`` in the info string, ``None`` when absent."""
        values = [f.removeprefix(f"{key}=") for f in self.flags if f.startswith(f"{key}=")]
        return values[0] if values else None

    @property
    def file(self) -> str | None:
        return self.flag("file")


_FENCE = re.compile(r"^(\s*)```([^`]*)$")  # an info string has no backtick (CommonMark)


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page`` (indented fences, e.g. in list items, included).

    Raises:
        AssertionError: a fence that is never closed.
    """
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m.group(1), m.group(2).split()
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        assert j < len(lines), f"{page}:{i + 1}: the block opened here is never closed"
        lang = info[0] if info else ""
        out.append(Block(page, i + 1, lang, tuple(info[1:]), "\n".join(body) + "\n"))
        i = j + 1
    return out


def shell_commands(text: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [c.strip() for c in joined.splitlines() if c.strip() and not c.strip().startswith("#")]


def _short_settings(argv: list[str]) -> list[str]:
    """The overrides the test appends to ``comlrl <argv>`` (see the module docstring)."""
    from comlrl.algos.cli.main import parse_args

    ns = parse_args(argv)
    if ns.command == "eval":
        return [f"{k}={v}" for k, v in SHORT_EVAL.items()]
    if ns.command != "train" or ns.print_config:
        return []
    if ns.resume:
        step = max(json.loads(r)["step"] for r in _lines(Path(ns.resume) / "metrics.jsonl"))
        return [f"num_steps={step + 2}", "progress=false"]
    from comlrl.algos.recipes.registry import resolve_recipe
    from comlrl.algos.training.config.rl import load_config_data

    data = load_config_data(ns.config, list(ns.overrides))
    if str(data.get("algo", "")).lower() == "list":
        return []
    recipe, _ = resolve_recipe(data)
    fields = recipe.config_class().model_fields
    given = {o.split("=", 1)[0].strip() for o in ns.overrides} | set(data)
    short = dict(SHORT_TRAIN, **{k: "1" for k in EVERY if k in given})
    return [f"{k}={v}" for k, v in short.items() if k in fields]


def _lines(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if x.strip()]


def fresh_output_dir(argv: list[str]) -> str | None:
    """The ``output_dir`` of ``comlrl <argv>`` when it starts a new run (not ``--resume``,
    ``--overwrite`` or ``--print-config``); ``None`` otherwise. Read without validating the
    config, so a ``no-test`` command (GPU devices, a Hub id) is understood here too."""
    from comlrl.algos.cli.main import parse_args
    from comlrl.algos.recipes.registry import resolve_recipe
    from comlrl.algos.training.config.rl import load_config_data

    if argv[:1] != ["train"]:
        return None
    ns = parse_args(argv)
    if ns.resume or ns.overwrite or ns.print_config:
        return None
    data = load_config_data(ns.config, list(ns.overrides))
    if str(data.get("algo", "")).lower() == "list":
        return None
    recipe, rest = resolve_recipe(data)
    out = ns.output_dir or rest.get("output_dir")
    if out is None:
        out = recipe.config_class().model_fields["output_dir"].default
    return str(Path(out))


def train_commands(block: Block) -> list[list[str]]:
    """The ``comlrl train ...`` commands of a block, ``&&`` chains included (the
    Quickstart's first command ends in one)."""
    out = []
    for command in shell_commands(block.text):
        for part in command.split("&&"):
            argv = shlex.split(part)
            if argv[:2] == ["comlrl", "train"]:
                out.append(argv[1:])
    return out


def check_no_collision(where: str, argv: list[str], used: dict[str, str]) -> None:
    """A new run must not land in the ``output_dir`` of an earlier command on the page (run
    by this test or not: a reader runs the Quickstart), which ``comlrl train`` refuses."""
    out = fresh_output_dir(argv)
    if out is None:
        return
    assert out not in used, (
        f"{where}: `comlrl {' '.join(argv)}` writes to {out!r}, which {used[out]} already "
        "used: give it its own output_dir="
    )
    used[out] = where


def install_on_sys_path(folder: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``pip install -e folder`` makes visible, without pip (module docstring)."""
    import tomllib

    project = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name = re.sub(r"[-_.]+", "_", project["name"]).lower()
    info = site / f"{name}-{project.get('version', '0')}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project.get('version', '0')}\n"
    )
    groups = project.get("entry-points", {})
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
            for group, points in groups.items()
        )
    )
    monkeypatch.syspath_prepend(str(folder / "src" if (folder / "src").is_dir() else folder))
    monkeypatch.syspath_prepend(str(site))


def _pip_install_target(argv: list[str], cwd: Path) -> Path | None:
    """The folder of ``pip install [-e] DIR`` (or ``python -m pip ...``) when the page wrote
    ``DIR/pyproject.toml``; ``None`` for any other command."""
    if argv[:3] == ["python", "-m", "pip"]:
        argv = argv[2:]
    rest = [a for a in argv[2:] if a != "-e"]
    if argv[:2] != ["pip", "install"] or len(rest) != 1:
        return None
    folder = cwd / rest[0]
    return folder if (folder / "pyproject.toml").is_file() else None


def run_bash(
    block: Block, cwd: Path, used: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from comlrl.algos.cli.main import main

    for command in shell_commands(block.text):
        argv = shlex.split(command)
        folder = _pip_install_target(argv, cwd)
        if folder is not None:
            install_on_sys_path(folder, cwd / f"_site_{block.line}", monkeypatch)
        elif argv[0] == "comlrl" and not set(argv) & {">", "|", "&&", ";", "<"}:
            check_no_collision(block.where, argv[1:], used)
            code = main([*argv[1:], *_short_settings(argv[1:])])
            assert code == 0, f"{block.where}: `{command}` exited {code}"
        else:
            done = subprocess.run(
                ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, f"{block.where}: `{command}` failed:\n{done.stderr}"


def run_python(block: Block) -> None:
    source = re.sub(r"\bnum_steps=\d+", "num_steps=2", block.text)
    code = compile(source, block.where, "exec")
    exec(code, {"__name__": "__main__"})  # noqa: S102 - the docs' own code, run as pasted


def write_file(block: Block, cwd: Path) -> None:
    """Save a ``file=NAME`` block as ``NAME``; a Python file must compile."""
    assert block.file, f"{block.where}: a {block.lang} block needs file=NAME"
    target = cwd / block.file
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.text, encoding="utf-8")
    if block.lang == "python":
        compile(block.text, block.where, "exec")


def run_yaml(block: Block, cwd: Path) -> None:
    from comlrl.algos.cli.main import main

    name = block.file
    target = cwd / (name or f"_block_{block.line}.yaml")
    target.write_text(block.text)
    if name is None:
        code = main(["train", "--config", str(target), "--print-config"])
        assert code == 0, f"{block.where}: the config fragment does not validate"


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty working folder, no network, no W&B."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    return tmp_path


def test_every_block_says_what_it_is() -> None:
    bad = [
        f"{b.where}: info string {' '.join([b.lang, *b.flags]).strip()!r}"
        for page in RUN_PAGES
        for b in blocks(page)
        if b.lang not in LANGS
        or any(f != "no-test" and not f.startswith(("file=", "root=")) for f in b.flags)
    ]
    assert not bad, (
        "blocks need an info string in "
        + f"{sorted(LANGS)} (+ no-test | file=NAME | root=DIR):\n"
        + "\n".join(bad)
    )


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_blocks_of_a_page_run_as_pasted(
    page: str, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runnable = [b for b in blocks(page) if b.lang != "text" and "no-test" not in b.flags]
    ran: list[str] = []
    used: dict[str, str] = {}  # output_dir -> the block that started a run there
    try:
        for block in blocks(page):
            if block.lang == "bash" and block not in runnable:
                for argv in train_commands(block):
                    check_no_collision(block.where, argv, used)
            if block not in runnable:
                continue
            if block.lang == "bash":
                run_bash(block, offline, used, monkeypatch)
            elif block.lang in ("python", "toml") and block.file:
                write_file(block, offline)
            elif block.lang == "python":
                run_python(block)
            elif block.lang == "yaml":
                run_yaml(block, offline)
            else:
                pytest.fail(f"{block.where}: no runner for {block.lang!r}")
            ran.append(block.where)
    finally:  # modules the page's own files defined do not outlive it
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(offline)):
                del sys.modules[name]
    assert ran == [b.where for b in runnable]


_MODULE = re.compile(r"`(comlrl(?:\.\w+)+)`")
_PATH = re.compile(r"`((?:packages|tests|benchmarks|examples|docs|\.ci)/[\w./*-]+)`")
#: In a package README also paths inside the package (``src/...``) and ``.py`` file names.
_PACKAGE_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.*-]*|[\w-]+\.py)`")
#: A path in a ``text`` block (a file tree, a repository map).
_TEXT_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.*-]*|[\w-]+\.py)(?![\w/])")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
#: Dotted ``comlrl.`` names that are not modules, and what they are.
NOT_MODULES = {"comlrl.tasks": "the entry-point group task suites register under"}
#: Modules that exist only where they could be built, and when that is.
OPTIONAL_MODULES = {"comlrl.kernels._cuda": "built only where CMake finds nvcc"}


def _unresolved(dotted: str) -> str | None:
    """Why ``dotted`` is neither a module nor a module's attribute (e.g. a class's method);
    ``None`` when it resolves. The longest prefix that is a module is imported, then the
    rest is read with ``getattr``; a module that exists but fails to import says why."""
    if dotted in NOT_MODULES or dotted in OPTIONAL_MODULES:
        return None
    parts = dotted.split(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated aliases still resolve
        for cut in range(len(parts), 0, -1):
            name = ".".join(parts[:cut])
            try:
                obj: Any = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name != name and not name.startswith(f"{exc.name}."):
                    return f"module {name} exists but cannot import: {exc}"
                continue
            except ImportError as exc:
                return f"module {name} exists but cannot import: {exc}"
            for i, attr in enumerate(parts[cut:]):
                if not hasattr(obj, attr):
                    return f"{'.'.join(parts[: cut + i])} has no attribute {attr!r}"
                obj = getattr(obj, attr)
            return None
    return "no such module"


def _roots(page: str) -> list[Path]:
    """Where a path named on ``page`` may start: the repository, and for a package README
    its package, its source tree (``src/comlrl/<name>``) and its ``benchmarks/``."""
    if not page.startswith("packages/"):
        return [REPO]
    package = (REPO / page).parent
    return [REPO, package, *package.glob("src/comlrl/*"), package / "benchmarks"]


def _path_exists(page: str, rel: str, root: str | None = None) -> bool | None:
    """Whether ``rel``, named on ``page``, is a file or folder; ``None`` when it is not a
    path of this repository (in a package README, one whose first folder is none of ours,
    e.g. a Hub dataset ``openai/gsm8k``)."""
    rel = rel.rstrip("/.") or "."
    if rel.startswith("../"):  # beside the repository (../shared): not ours to check
        return None
    roots = _roots(page) + ([REPO / root] if root else [])
    if any(list(r.glob(rel)) for r in roots):
        return True
    if root:  # a map of a folder names what is inside it at any depth
        return bool(list((REPO / root).glob(f"**/{rel}")))
    if page.startswith("packages/") and "/" not in rel:  # a bare file name: anywhere in it
        return bool(list((REPO / page).parent.glob(f"**/{rel}")))
    first = rel.split("/")[0]
    if _PATH.fullmatch(f"`{rel}/`") or any((r / first).is_dir() for r in roots):
        return False
    return None


def test_names_and_links_in_the_docs_exist() -> None:
    missing = []
    for page in PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        names = [] if page in NOT_RUN else sorted(set(_MODULE.findall(text)))
        for dotted in names:  # compat.md also names what 1.4.3 had and this package lacks
            why = _unresolved(dotted)
            if why:
                missing.append(f"{page}: module or name `{dotted}` ({why})")
        paths: set[tuple[str, str | None]] = {(rel, None) for rel in _PATH.findall(text)}
        if page.startswith("packages/"):
            paths |= {(rel, None) for rel in _PACKAGE_PATH.findall(text)}
        for block in blocks(page):  # file trees and maps: their words that look like paths
            if block.lang == "text":
                paths |= {(rel, block.flag("root")) for rel in _TEXT_PATH.findall(block.text)}
        for rel, root in sorted(paths, key=str):
            if _path_exists(page, rel, root) is False:
                missing.append(f"{page}: path `{rel}`" + (f" (under {root})" if root else ""))
        for link in sorted(set(_LINK.findall(text))):
            if "://" not in link and not (REPO / page).parent.joinpath(link).exists():
                missing.append(f"{page}: link ({link})")
    assert not missing, "the docs name things that do not exist:\n" + "\n".join(missing)


#: A Sphinx-style reference: ``:func:`x```, ``:class:`~x```, ``:meth:`title <x>```.
_ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|exc|obj|const):`([^`]+)`")
_DOTTED = re.compile(r"(?<![\w.])comlrl(?:\.\w+)+")


def _docstrings(tree: ast.Module) -> list[ast.Constant]:
    """The docstrings of a module and of every class and function in it."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr):
            value = node.body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.append(value)
    return out


def _role_target(text: str, package: str) -> str | None:
    """The module path a reference's ``text`` names, absolute; ``None`` for a bare name or a
    ``Class.attr`` (read against the module's own names, which this test does not check)."""
    target = re.sub(r"^.*<(.+)>$", r"\1", text.strip()).lstrip("~!")
    if target.startswith("."):
        return importlib.util.resolve_name(target, package)
    head = target.split(".")[0]
    if "." not in target or not head.isidentifier() or head[0].isupper():
        return None
    return target if head == "comlrl" or importlib.util.find_spec(head) else None


def docstring_references(path: Path) -> list[tuple[int, str, str]]:
    """``(line, as written, module path)`` of each module path a docstring of ``path`` names
    (module docstring)."""
    src_root = next(p for p in path.parents if p.name == "src")
    parts = path.relative_to(src_root).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    module = ".".join(parts[:-1] if is_package else parts)
    package = module if is_package else module.rpartition(".")[0]
    source = path.read_text(encoding="utf-8")
    out = []
    for node in _docstrings(ast.parse(source)):
        raw = ast.get_source_segment(source, node) or ""
        roles = list(_ROLE.finditer(raw))
        found = [(m.start(), m.group(1), _role_target(m.group(1), package)) for m in roles]
        spans = [m.span() for m in roles]
        found += [
            (m.start(), m.group(0), m.group(0))
            for m in _DOTTED.finditer(raw)
            if not any(a <= m.start() < b for a, b in spans)
        ]
        out += [(node.lineno + raw[:at].count("\n"), text, t) for at, text, t in found if t]
    return sorted(out)


def test_module_paths_in_docstrings_resolve() -> None:
    bad = []
    for path in sorted(REPO.glob("packages/*/src/**/*.py")):
        for line, written, target in docstring_references(path):
            why = _unresolved(target)
            if why:
                shown = written if written == target else f"{written} (= {target})"
                bad.append(f"{path.relative_to(REPO)}:{line}: {shown}: {why}")
    assert not bad, (
        f"{len(bad)} module paths named in docstrings do not resolve (import the module, "
        "then getattr the rest):\n" + "\n".join(bad)
    )
