"""Local row files and split selection shared by the text suites (writing, math).

A suite's ``path=`` may be:

- a directory holding one file per split: ``<split>.jsonl`` / ``<split>.json`` (a few
  aliases per split are tried, e.g. ``validation``/``val`` for ``test`` when no ``test``
  file exists; the suite documents them);
- one ``.jsonl`` / ``.json`` file: rows that carry a ``"split"`` field are selected by
  it; otherwise the file is split by index, the last fifth being ``test`` and the rest
  ``train`` (disjoint; deterministic).

Without ``path`` the suite loads its Hugging Face dataset through ``datasets`` when that
package is installed (it is optional: nothing here imports it at module level).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["read_rows", "rows_for_split", "index_split", "hub_rows"]


def read_rows(file: Path) -> list[dict[str, Any]]:
    """Rows of one ``.jsonl`` or ``.json`` (list, or mapping of rows) file.

    Raises:
        ValueError: for another extension or a row that is not an object.
    """
    name = file.name.lower()
    if name.endswith(".jsonl"):
        with open(file, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    elif name.endswith(".json"):
        data = json.loads(file.read_text(encoding="utf-8"))
        rows = list(data.values()) if isinstance(data, dict) else list(data)
    else:
        raise ValueError(f"unsupported data file {file}: use .jsonl or .json")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{file}: row {i} is a {type(row).__name__}, not a JSON object")
    return rows


def index_split(rows: Sequence[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    """``train`` = all but the last fifth of ``rows``, ``test`` = the last fifth (>= 1 row
    when there are two or more)."""
    n = len(rows)
    cut = n - (max(1, n // 5) if n > 1 else 0)
    return list(rows[:cut] if split == "train" else rows[cut:])


def rows_for_split(
    path: str | Path,
    split: str,
    file_names: Mapping[str, Sequence[str]],
    *,
    what: str,
) -> list[dict[str, Any]]:
    """The rows of ``split`` from a local ``path`` (directory or file, see module docs).

    Args:
        path: directory or file.
        split: ``"train"`` or ``"test"``.
        file_names: for each split, the file stems tried in a directory, in order.
        what: the suite's name, for error messages.

    Raises:
        FileNotFoundError: when ``path`` or the split's file is missing (the message
            names the files tried and the ``path=`` to pass).
        ValueError: for an unknown split or a malformed file.
    """
    if split not in file_names:
        raise ValueError(f"unknown split {split!r}; {what} has splits {sorted(file_names)}")
    root = Path(path)
    if root.is_dir():
        tried = []
        for stem in file_names[split]:
            for ext in (".jsonl", ".json"):
                candidate = root / (stem + ext)
                tried.append(candidate.name)
                if candidate.is_file():
                    return read_rows(candidate)
        raise FileNotFoundError(
            f"{what}: no file for split {split!r} in {root} (tried {tried}); put one there "
            "or pass path= to a single .jsonl/.json file"
        )
    if not root.is_file():
        raise FileNotFoundError(
            f"{what}: data path not found: {root}; pass path= to a .jsonl/.json file or a "
            "directory with one file per split"
        )
    rows = read_rows(root)
    if rows and all("split" in r for r in rows):
        names = set(file_names[split]) | {split}
        return [r for r in rows if str(r["split"]) in names]
    return index_split(rows, split)


def hub_rows(dataset: str, split: str, config: str | None = None) -> list[dict[str, Any]]:
    """Rows of a Hugging Face dataset split via the optional ``datasets`` package.

    Raises:
        FileNotFoundError: when ``datasets`` is not installed or the download fails; the
            message says to pass ``path=`` to a local copy instead.
    """
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise FileNotFoundError(
            f"no path= given and the `datasets` package is not installed to fetch "
            f"{dataset!r}; pass path= to a local .jsonl/.json copy (or a directory with one "
            "file per split), or `pip install datasets`"
        ) from exc
    try:
        data = datasets.load_dataset(dataset, config, split=split)
    except Exception as exc:  # network, missing split, ...: one clear message
        raise FileNotFoundError(
            f"could not load {dataset!r} split {split!r} from the Hugging Face Hub "
            f"({type(exc).__name__}: {exc}); pass path= to a local copy"
        ) from exc
    return [dict(row) for row in data]
