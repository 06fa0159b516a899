"""Source size and the three structure counts of a checkout (no imports of its code).

Prints, and saves as JSON:

- source lines (physical lines of ``.py`` files under ``packages/<name>/src``) per package,
  and per top-level folder (or module) inside each package's namespace directory, e.g.
  ``comlrl-algos/cli`` or ``comlrl-compat/trainers``;
- the three counts that STYLE.md wants at zero, with the modules behind each: re-export-only
  modules, private names imported across modules, and import cycles (strongly connected
  groups of modules); and partial hubs (modules listing another module's names in
  ``__all__``, with the number of such names). They come from the walkers of
  ``packages/comlrl-algos/tests/test_module_structure.py`` (the test that keeps them at
  zero), over comlrl-core, -algos, -envs and -kernels; ``in_flight`` says how many of them
  that test still tolerates (``IN_FLIGHT``); the same counts over comlrl-compat are
  reported apart (``compat``: translated code, not held to the rules by the test).

``--root DIR`` counts another checkout (e.g. ``git archive 604308e packages | tar -x -C
/tmp/before`` then ``--root /tmp/before``) with this checkout's walkers.

Usage::

    python benchmarks/count_structure.py --output benchmarks/results/structure.json
"""

from __future__ import annotations

import argparse
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
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nsaved {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
