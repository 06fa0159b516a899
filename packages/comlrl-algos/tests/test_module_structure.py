"""The source tree keeps the module rules of docs/architecture.md (walked with ``ast``,
nothing imported):

- no re-export-only module: a module that defines nothing (no function, class or value of its
  own) and only imports names for others to import from it. A distribution's root package
  (``comlrl.algos``, ``comlrl.core``, ``comlrl.envs``, ``comlrl.kernels``) is its public API
  and may gather names;
- no partial hub: a module does not list names it imports from another module in its
  ``__all__`` (the recipe faces of :data:`RECIPE_FACES` aside);
- no private name imported across modules: ``from a.b import _name`` where ``_name`` is a
  function, class or value of another module (a private *module* may be imported inside the
  package that holds it);
- no import cycle between modules, counting every import (deferred ones inside functions
  too, but not those under ``if TYPE_CHECKING:``, which never run).

Each failing test names the offending modules. ``benchmarks/count_structure.py`` reuses
these walkers to print the three counts.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
#: every distribution that the rules cover, by its ``src`` folder (the compat layer,
#: CoMLRL 1.4.3's API, is translated code with its own rules and is left out)
SOURCE_ROOTS = tuple(
    REPO / "packages" / name / "src"
    for name in (
        "comlrl-core",
        "comlrl-algos",
        "comlrl-envs",
        "comlrl-kernels",
        "comlrl-estimators",
    )
)
#: public APIs, which gather the names they export: a distribution's root package, and the
#: task-suite and sandbox packages of comlrl-envs, whose users import from the package
#: (``from comlrl.envs.sandbox import SandboxPool``; the modules inside are its parts)
PUBLIC_API_PACKAGES = frozenset(
    {"comlrl.algos", "comlrl.core", "comlrl.envs", "comlrl.kernels", "comlrl.estimators"}
    | {
        f"comlrl.envs.{suite}"
        for suite in ("code", "math", "remote", "sandbox", "tools", "writing")
    }
)
#: a recipe module is the face of its family's run (setup, step, checkpoint, resume for the
#: loop driver and the trainer objects); it may list the names of its family's helper
#: modules (the actor-critic's config and critic maths)
RECIPE_FACES = frozenset(
    {"comlrl.algos.recipes.group_baseline.recipe", "comlrl.algos.recipes.actor_critic.recipe"}
)
#: offences tolerated while another branch rewrites the modules that hold them (each entry
#: must still be found, ``test_in_flight_offences_still_exist``, so the list only shrinks);
#: empty since the run modules left ``cli/``
IN_FLIGHT: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Module:
    """One source file: its dotted name, path and syntax tree."""

    name: str
    path: Path
    tree: ast.Module

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def package(self) -> str:
        """The package that relative imports in this module start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@functools.lru_cache(maxsize=4)
def load_modules(roots: tuple[Path, ...] = SOURCE_ROOTS) -> dict[str, Module]:
    """Every ``.py`` file under ``roots``, by dotted module name (parsed once per test run:
    the sources do not change under the tests, and the walkers only read the trees)."""
    modules: dict[str, Module] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of ``body`` except those under ``if TYPE_CHECKING:``."""
    for stmt in body:
        if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            for node in stmt.orelse:
                yield from _runtime_nodes([node])
            continue
        yield stmt
        for child in ast.iter_child_nodes(stmt):
            if isinstance(child, ast.stmt):
                yield from _runtime_nodes([child])
            else:
                yield from ast.walk(child)


def _all_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    for stmt in body:
        yield from ast.walk(stmt)


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.package.split(".")
    if node.level > 1:
        base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


@dataclass(frozen=True)
class Import:
    """``importer`` imports ``name`` from module ``source`` (``name`` is ``None`` for
    ``import source``)."""

    importer: str
    source: str
    name: str | None
    line: int


def imports(module: Module, *, runtime_only: bool) -> Iterator[Import]:
    """The imports of ``module`` (with ``runtime_only``, not those under TYPE_CHECKING)."""
    nodes = _runtime_nodes(module.tree.body) if runtime_only else _all_nodes(module.tree.body)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module.name, alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                if node.level and node.module is None:  # ``from . import sub``: a submodule
                    yield Import(module.name, f"{source}.{alias.name}", None, node.lineno)
                else:
                    yield Import(module.name, source, alias.name, node.lineno)


# -- re-export-only modules ---------------------------------------------------------------


def _defines_something(stmt: ast.stmt) -> bool:
    """Whether a top-level statement makes something of the module's own."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return False
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return False  # a docstring
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return not all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)
    if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
        return any(_defines_something(s) for s in stmt.orelse)
    if isinstance(stmt, ast.Try):  # optional imports
        return any(_defines_something(s) for s in [*stmt.body, *stmt.orelse])
    return True


def reexport_only_modules(modules: dict[str, Module]) -> list[str]:
    """Modules that import names and define nothing of their own (public API roots aside)."""
    found = []
    for name, module in modules.items():
        if name in PUBLIC_API_PACKAGES:
            continue
        body = module.tree.body
        imports_names = any(
            isinstance(s, ast.ImportFrom) and s.module != "__future__" for s in body
        ) or any(isinstance(s, ast.If) and _is_type_checking(s.test) for s in body)
        if imports_names and not any(_defines_something(s) for s in body):
            found.append(name)
    return sorted(found)


def reexported_names(modules: dict[str, Module]) -> list[str]:
    """``module re-exports name`` for each name that a module lists in its ``__all__`` but
    imports from another module (a partial hub: importers should go to the defining module).
    Public API packages and the recipe faces (:data:`RECIPE_FACES`) aside."""
    found = []
    for name, module in modules.items():
        if name in PUBLIC_API_PACKAGES or name in RECIPE_FACES:
            continue
        exported: list[str] = []
        imported: set[str] = set()
        for stmt in module.tree.body:
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets
            ):
                try:
                    exported = list(ast.literal_eval(stmt.value))
                except ValueError:
                    continue
            elif isinstance(stmt, ast.ImportFrom):
                imported |= {a.asname or a.name for a in stmt.names}
        found += [f"{name} re-exports {n}" for n in exported if n in imported]
    return sorted(found)


# -- private names imported across modules -------------------------------------------------


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def private_imports(modules: dict[str, Module]) -> list[str]:
    """``importer:line imports source._name`` for each private name of our packages taken
    from another module, by an import or as an attribute of an imported module
    (``from pkg import mod`` then ``mod._name``).

    A private submodule (``from pkg import _helpers``) is allowed inside ``pkg``'s own tree;
    a private name of a module (``from pkg.mod import _helper``) never is.
    """
    found = []
    for module in modules.values():
        aliases: dict[str, str] = {}  # local name -> the module of ours it stands for
        for imp in imports(module, runtime_only=False):
            if not _inside(imp.source, "comlrl"):
                continue
            if imp.name is None:
                parts = imp.source.split(".")
                private = [i for i, part in enumerate(parts) if _is_private(part)]
                if private and not _inside(module.name, ".".join(parts[: private[0]])):
                    found.append(f"{imp.importer}:{imp.line} imports {imp.source}")
                continue
            submodule = f"{imp.source}.{imp.name}"
            if submodule in modules:
                aliases[imp.name] = submodule
                if _is_private(imp.name) and not _inside(module.name, imp.source):
                    found.append(f"{imp.importer}:{imp.line} imports {submodule}")
                continue
            if _is_private(imp.name) and imp.source != module.name:
                found.append(f"{imp.importer}:{imp.line} imports {submodule}")
        for node in ast.walk(module.tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _is_private(node.attr)
                and f"{aliases[node.value.id]}.{node.attr}" not in modules
            ):
                found.append(
                    f"{module.name}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}"
                )
    return sorted(set(found))


# -- import cycles -------------------------------------------------------------------------


def import_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports when it runs (deferred imports
    included, TYPE_CHECKING imports not). ``from pkg import name`` points at the submodule
    ``pkg.name`` when there is one, else at ``pkg``; a module does not depend on the
    packages above it (importing ``a.b.c`` runs ``a.b``'s ``__init__`` first, which is how
    Python works, not a design choice of ``a.b.c``)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module in modules.values():
        for imp in imports(module, runtime_only=True):
            target = imp.source
            if imp.name is not None and f"{imp.source}.{imp.name}" in modules:
                target = f"{imp.source}.{imp.name}"
            if target in modules and target != module.name:
                graph[module.name].add(target)
    return graph


def import_cycles(modules: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each
    sorted: every module in one reaches every other through imports."""
    graph = import_graph(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


# -- the tests -----------------------------------------------------------------------------


def without_line(offence: str) -> str:
    """``a.b:12 imports c._d`` -> ``a.b imports c._d`` (line numbers move with edits)."""
    head, _, rest = offence.partition(" ")
    return f"{head.partition(':')[0]} {rest}"


def _new(offences: list[str]) -> list[str]:
    return [o for o in offences if without_line(o) not in IN_FLIGHT]


def _all_offences() -> set[str]:
    modules = load_modules()
    return (
        set(reexport_only_modules(modules))
        | set(reexported_names(modules))
        | {without_line(o) for o in private_imports(modules)}
        | {" <-> ".join(cycle) for cycle in import_cycles(modules)}
    )


def test_no_reexport_only_modules() -> None:
    found = _new(reexport_only_modules(load_modules()))
    assert not found, (
        "modules that only re-export names (import from the defining module instead, "
        f"and delete them): {found}"
    )


def test_no_names_reexported_through_all() -> None:
    found = _new(reexported_names(load_modules()))
    assert not found, (
        "modules that list another module's names in __all__ (point importers at the "
        "defining module and drop the names from __all__):\n" + "\n".join(found)
    )


def test_no_private_names_imported_across_modules() -> None:
    found = _new(private_imports(load_modules()))
    assert not found, (
        "private names imported from another module (make the name public where another "
        "module needs it, or move the code where it belongs):\n" + "\n".join(found)
    )


def test_no_import_cycles() -> None:
    found = _new([" <-> ".join(cycle) for cycle in import_cycles(load_modules())])
    assert not found, (
        "modules that import each other (merge them or split them by concept):\n" + "\n".join(found)
    )


def test_in_flight_offences_still_exist() -> None:
    gone = sorted(IN_FLIGHT - _all_offences())
    assert not gone, f"fixed: delete these entries from IN_FLIGHT: {gone}"


def test_walkers_find_each_kind_of_offence(tmp_path: Path) -> None:
    """The walkers themselves can fail: each one finds a planted offence."""
    pkg = tmp_path / "comlrl" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""demo."""\n')
    (pkg / "_private.py").write_text("def g():\n    pass\n")
    (pkg / "a.py").write_text(
        "from comlrl.demo import _private\nfrom comlrl.demo.b import _helper\n\n"
        "def f():\n    pass\n"
    )
    (pkg / "b.py").write_text("def _helper():\n    from comlrl.demo import a\n")
    (pkg / "c.py").write_text("from comlrl.demo import b\n\nx = b._helper\n")
    (pkg / "gather.py").write_text("from comlrl.demo.a import f\n\n__all__ = ['f']\n")
    (pkg / "hub.py").write_text("from comlrl.demo.a import f\n\ng = 1\n__all__ = ['f', 'g']\n")
    modules = load_modules((tmp_path,))
    assert reexport_only_modules(modules) == ["comlrl.demo.gather"]
    assert reexported_names(modules) == [
        "comlrl.demo.gather re-exports f",
        "comlrl.demo.hub re-exports f",
    ]
    assert private_imports(modules) == [
        "comlrl.demo.a:2 imports comlrl.demo.b._helper",
        "comlrl.demo.c:3 uses comlrl.demo.b._helper",
    ]
    assert import_cycles(modules) == [["comlrl.demo.a", "comlrl.demo.b"]]
