"""Every command and code block in README.md and docs/*.md runs as pasted.

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
- ``text``: output or a diagram; nothing runs.
- ``<lang> no-test``: cannot run here (an install, a GPU, torchrun over nodes, vLLM, the
  network or a Hub model id); skipped, and the only blocks that may be.

A block with another or no info string fails the test, so a new block is either run or
marked. The pages also name modules (``comlrl.algos.x.y``), repository files and other
pages: each must exist (:func:`test_names_and_links_in_the_docs_exist`; only the paths
and links of ``docs/compat.md``, which also names what CoMLRL 1.4.3 had and this
package lacks).

``docs/compat.md`` is left out: its blocks show CoMLRL 1.4.3 code fragments and
``examples/comlrl143/`` (run by ``packages/comlrl-compat/tests/test_compat_examples.py``)
holds the complete scripts.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import shlex
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Pages whose blocks are run, relative to the repository root.
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
#: Pages not run here, and why (module docstring).
NOT_RUN = {"docs/compat.md": "CoMLRL 1.4.3 fragments; examples/comlrl143/ runs the scripts"}
RUN_PAGES = [p for p in PAGES if p not in NOT_RUN]
LANGS = {"bash", "python", "yaml", "text"}

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

    @property
    def file(self) -> str | None:
        names = [f.removeprefix("file=") for f in self.flags if f.startswith("file=")]
        return names[0] if names else None


_FENCE = re.compile(r"^(\s*)```(.*)$")


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
    from comlrl.algos.training.config import load_config_data

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
    from comlrl.algos.training.config import load_config_data

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


def run_bash(block: Block, cwd: Path, used: dict[str, str]) -> None:
    from comlrl.algos.cli.main import main

    for command in shell_commands(block.text):
        argv = shlex.split(command)
        if argv[0] == "comlrl" and not set(argv) & {">", "|", "&&", ";", "<"}:
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
        if b.lang not in LANGS or any(f != "no-test" and not f.startswith("file=") for f in b.flags)
    ]
    assert not bad, (
        "blocks need an info string in "
        + f"{sorted(LANGS)} (+ no-test | file=NAME):\n"
        + "\n".join(bad)
    )


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_blocks_of_a_page_run_as_pasted(page: str, offline: Path) -> None:
    runnable = [b for b in blocks(page) if b.lang != "text" and "no-test" not in b.flags]
    ran: list[str] = []
    used: dict[str, str] = {}  # output_dir -> the block that started a run there
    for block in blocks(page):
        if block.lang == "bash" and block not in runnable:
            for argv in train_commands(block):
                check_no_collision(block.where, argv, used)
        if block not in runnable:
            continue
        if block.lang == "bash":
            run_bash(block, offline, used)
        elif block.lang == "python":
            run_python(block)
        elif block.lang == "yaml":
            run_yaml(block, offline)
        else:
            pytest.fail(f"{block.where}: no runner for {block.lang!r}")
        ran.append(block.where)
    assert ran == [b.where for b in runnable]


_MODULE = re.compile(r"`(comlrl(?:\.\w+)+)`")
_PATH = re.compile(r"`((?:packages|tests|benchmarks|examples|docs|\.ci)/[\w./*-]+)`")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a module's attribute (e.g. a class's method)."""
    parts = dotted.split(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated aliases still resolve
        for cut in range(len(parts), 1, -1):
            try:
                obj: Any = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for name in parts[cut:]:
                    obj = getattr(obj, name)
            except AttributeError:
                return False
            return True
    return False


def test_names_and_links_in_the_docs_exist() -> None:
    missing = []
    for page in PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        names = [] if page in NOT_RUN else sorted(set(_MODULE.findall(text)))
        for dotted in names:  # compat.md also names what 1.4.3 had and this package lacks
            if not _resolves(dotted):
                missing.append(f"{page}: module or name `{dotted}`")
        for rel in sorted(set(_PATH.findall(text))):
            if not list(REPO.glob(rel.rstrip("/."))):
                missing.append(f"{page}: path `{rel}`")
        for link in sorted(set(_LINK.findall(text))):
            if "://" not in link and not (REPO / page).parent.joinpath(link).exists():
                missing.append(f"{page}: link ({link})")
    assert not missing, "the docs name things that do not exist:\n" + "\n".join(missing)
