"""Source size and the three structure counts of a checkout (no imports of its code).

Prints, and saves as JSON:

- source lines (physical lines of ``.py`` files under ``packages/<name>/src``) per package,
  and per top-level folder (or module) inside each package's namespace directory, e.g.
  ``comlrl-algos/cli`` or ``comlrl-compat/trainers``;
- the three counts that docs/architecture.md's module rules want at zero, with the modules behind each: re-export-only
  modules, private names imported across modules, and import cycles (strongly connected
  groups of modules); and partial hubs (modules listing another module's names in
  ``__all__``, with the number of such names). They come from the walkers of
  ``packages/comlrl-algos/tests/test_module_structure.py`` (the test that keeps them at
  zero), over comlrl-core, -algos, -envs and -kernels; ``in_flight`` says how many of them
  that test still tolerates (``IN_FLIGHT``); the same counts over comlrl-compat are
  reported apart (``compat``: translated code, not held to the rules by the test);
- the shape of the recipes (``recipes``): the modules under ``comlrl/algos/recipes`` and
  the import edges between them (run-time imports, and those under ``TYPE_CHECKING`` apart);
  the places in comlrl-algos' sources that build a trainer or recipe object (a call of a
  class of ``comlrl.algos.recipes`` (the registry aside) whose name ends in ``Trainer`` or
  ``Recipe``, or of a callable handed in for one: a name ending in ``_cls``, or ``build``); and the config classes
  (pydantic models in comlrl-algos' sources) with the depth of each one's inheritance (a
  class on ``BaseModel`` is 1) and the number of its config-class ancestors.

``--root DIR`` counts another checkout (e.g. ``git archive 604308e packages | tar -x -C
/tmp/before`` then ``--root /tmp/before``) with this checkout's walkers.

Usage::

    python benchmarks/count_structure.py --output benchmarks/results/structure.json
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WALKERS = REPO / "packages" / "comlrl-algos" / "tests" / "test_module_structure.py"


def load_walkers() -> ModuleType:
    """The structure test module, loaded by path (it is not an installed package)."""
    spec = importlib.util.spec_from_file_location("test_module_structure", WALKERS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def source_lines(root: Path) -> dict[str, Any]:
    """Lines of ``.py`` source per package and per top-level folder inside it."""
    packages: dict[str, int] = {}
    folders: dict[str, int] = {}
    for src in sorted((root / "packages").glob("*/src")):
        package = src.parent.name
        packages[package] = 0
        for path in sorted(src.rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            packages[package] += lines
            parts = path.relative_to(src).parts  # ("comlrl", "algos", "cli", "main.py")
            top = parts[2] if len(parts) > 2 else parts[-1]
            folders[f"{package}/{top}"] = folders.get(f"{package}/{top}", 0) + lines
    return {"packages": packages, "folders": folders, "total": sum(packages.values())}


def _classes(src: Path, package: str) -> dict[str, tuple[str, list[str]]]:
    """Every class under ``src/comlrl/<package>``: name -> (module, base names as written)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for path in sorted((src / "comlrl" / package).rglob("*.py")):
        module = ".".join(path.relative_to(src).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                found.setdefault(node.name, (module, bases))
    return found


def config_classes(src: Path) -> dict[str, Any]:
    """The pydantic models of comlrl-algos: per class its inheritance depth (1: a class on
    ``BaseModel``) and its config-class ancestors."""
    classes = _classes(src, "algos")

    def ancestors(name: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
        """Config-class ancestors of ``name``; None when it is not a pydantic model."""
        if name == "BaseModel":
            return set()
        if name not in classes or name in seen:
            return None
        out: set[str] = set()
        model = False
        for base in classes[name][1]:
            found = ancestors(base, seen | {name})
            if found is not None:
                model = True
                out |= found | ({base} if base != "BaseModel" else set())
        return out if model else None

    def depth(name: str) -> int:
        if name == "BaseModel":
            return 0
        return 1 + max(
            depth(b) for b in classes[name][1] if ancestors(b) is not None or b == "BaseModel"
        )

    rows = {}
    for name in classes:
        found = ancestors(name)
        if found is not None:
            rows[name] = {"module": classes[name][0], "depth": depth(name), "ancestors": len(found)}
    deepest = max(rows.values(), key=lambda r: r["depth"])["depth"] if rows else 0
    widest = max(rows, key=lambda n: rows[n]["ancestors"]) if rows else None
    return {
        "count": len(rows),
        "deepest": deepest,
        "most_ancestors": {"class": widest, "ancestors": rows[widest]["ancestors"]}
        if widest
        else None,
        "classes": dict(sorted(rows.items())),
    }


def trainer_builds(src: Path) -> list[str]:
    """``module:line callee`` for every place in comlrl-algos' sources that builds a trainer
    or recipe object."""
    recipe_classes = {
        n
        for n, (module, _) in _classes(src, "algos").items()
        if module.startswith("comlrl.algos.recipes")
        and module != "comlrl.algos.recipes.registry"  # its rows name recipes, build none
        and n.endswith(("Trainer", "Recipe"))
    }
    found = []
    for path in sorted((src / "comlrl" / "algos").rglob("*.py")):
        module = ".".join(path.relative_to(src).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            written = ast.unparse(node.func)
            callee = written.rpartition(".")[2]
            if callee in recipe_classes or callee.endswith("_cls") or written == "build":
                found.append(f"{module}:{node.lineno} {ast.unparse(node.func)}")
    return found


def recipe_shape(walkers: ModuleType, root: Path) -> dict[str, Any]:
    """Modules of ``comlrl.algos.recipes``, the import edges among them, the places that
    build a trainer or recipe object, and the config classes."""
    src = root / "packages" / "comlrl-algos" / "src"
    modules = {
        name: m
        for name, m in walkers.load_modules((src,)).items()
        if name == "comlrl.algos.recipes" or name.startswith("comlrl.algos.recipes.")
    }
    runtime = walkers.import_graph(modules)
    edges = sorted(f"{a} -> {b}" for a, targets in runtime.items() for b in targets)
    typing_only = set()
    for module in modules.values():
        for imp in walkers.imports(module, runtime_only=False):
            target = imp.source
            if imp.name is not None and f"{imp.source}.{imp.name}" in modules:
                target = f"{imp.source}.{imp.name}"
            if target in modules and target != module.name and target not in runtime[module.name]:
                typing_only.add(f"{module.name} -> {target}")
    builds = trainer_builds(src)
    configs = config_classes(src)
    return {
        "modules": len(modules),
        "import_edges": len(edges),
        "type_checking_edges": len(typing_only),
        "trainer_builds": len(builds),
        "config_classes": configs["count"],
        "deepest_config_inheritance": configs["deepest"],
        "most_config_ancestors": configs["most_ancestors"],
        "details": {
            "modules": sorted(modules),
            "import_edges": edges,
            "type_checking_edges": sorted(typing_only),
            "trainer_builds": builds,
            "config_classes": configs["classes"],
        },
    }


def structure_counts(walkers: ModuleType, roots: tuple[Path, ...]) -> dict[str, Any]:
    """The three counts and what is behind each."""
    modules = walkers.load_modules(roots)
    reexports = walkers.reexport_only_modules(modules)
    hubs = walkers.reexported_names(modules)
    private = walkers.private_imports(modules)
    cycles = [" <-> ".join(c) for c in walkers.import_cycles(modules)]
    found = set(reexports) | set(hubs) | {walkers.without_line(p) for p in private} | set(cycles)
    return {
        "modules": len(modules),
        "reexport_only_modules": len(reexports),
        "partial_hubs": len({h.split(" ")[0] for h in hubs}),
        "reexported_names": len(hubs),
        "private_imports_across_modules": len(private),
        "import_cycles": len(cycles),
        "in_flight": len(found & walkers.IN_FLIGHT),
        "details": {
            "reexport_only_modules": reexports,
            "reexported_names": hubs,
            "private_imports_across_modules": private,
            "import_cycles": cycles,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO, help="checkout to count")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "structure.json")
    args = parser.parse_args(argv)
    walkers = load_walkers()
    root = args.root.resolve()
    covered = tuple(
        root / "packages" / Path(r).relative_to(walkers.REPO / "packages")
        for r in walkers.SOURCE_ROOTS
    )
    compat = root / "packages" / "comlrl-compat" / "src"
    result = {
        "root": str(root),
        "source_lines": source_lines(root),
        "counts": structure_counts(walkers, covered),
        "compat": structure_counts(walkers, (compat,)) if compat.is_dir() else None,
        "recipes": recipe_shape(walkers, root),
    }
    lines = result["source_lines"]
    print(f"{'package':<24}{'lines':>8}")
    for name, n in lines["packages"].items():
        print(f"{name:<24}{n:>8}")
    print(f"{'total':<24}{lines['total']:>8}\n")
    print(f"{'folder':<40}{'lines':>8}")
    for name, n in sorted(lines["folders"].items()):
        print(f"{name:<40}{n:>8}")
    for label, counts in (
        ("core/algos/envs/kernels", result["counts"]),
        ("compat", result["compat"]),
    ):
        if counts is None:
            continue
        print(
            f"\n{label}: {counts['modules']} modules; re-export-only modules "
            f"{counts['reexport_only_modules']}, partial hubs {counts['partial_hubs']} "
            f"({counts['reexported_names']} names), private imports across modules "
            f"{counts['private_imports_across_modules']}, import cycles {counts['import_cycles']}"
            f" (in flight: {counts['in_flight']})"
        )
    shape = result["recipes"]
    widest = shape["most_config_ancestors"] or {}
    print(
        f"\nrecipes/: {shape['modules']} modules, {shape['import_edges']} import edges among them "
        f"(+{shape['type_checking_edges']} under TYPE_CHECKING); trainer/recipe objects built in "
        f"{shape['trainer_builds']} places of comlrl-algos; {shape['config_classes']} config "
        f"classes, deepest inheritance {shape['deepest_config_inheritance']}, most config "
        f"ancestors {widest.get('ancestors')} ({widest.get('class')})"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nsaved {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
