"""Local row files and split selection shared by the text suites (writing, math).

A suite's ``path=`` may be:

- a directory holding one file per split: ``<split>.jsonl`` / ``<split>.json`` (a few
  aliases per split are tried, e.g. ``validation``/``val`` for ``test`` when no ``test``
  file exists; the suite documents them);
- one ``.jsonl`` / ``.json`` file: rows that carry a ``"split"`` field are selected by
  it; otherwise the file is split by index, the last fifth being ``test`` and the rest
  ``train`` (disjoint; deterministic).

Without ``path`` the suite loads its Hugging Face dataset through ``datasets`` when that
package is installed (it is optional: nothing here imports it at module level). Before
that, one TCP connection to the Hub's host (``HF_ENDPOINT``, 3 s) tells an offline machine
at once, instead of after ``datasets``' retries (about 30 s); with ``HF_HUB_OFFLINE=1`` or
``HF_DATASETS_OFFLINE=1`` (a copy in the ``datasets`` cache), or a proxy set, it is skipped.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.parse
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
        FileNotFoundError: when ``datasets`` is not installed, the Hub's host cannot be
            reached (:func:`_hub_unreachable`, before any download is tried) or the
            download fails; the message says to pass ``path=`` (``task.kwargs.path=``) to
            a local copy instead.
    """
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise FileNotFoundError(
            f"no path= given and the `datasets` package is not installed to fetch "
            f"{dataset!r}; pass path= to a local .jsonl/.json copy (or a directory with one "
            "file per split), or `pip install datasets`"
        ) from exc
    local_copy = (
        "pass path= to a local .jsonl/.json copy or a directory with one file per split "
        "(on the command line: task.kwargs.path=FILE)"
    )
    unreachable = _hub_unreachable()
    if unreachable is not None:
        raise FileNotFoundError(
            f"no path= given and the Hugging Face Hub cannot be reached to fetch {dataset!r} "
            f"({unreachable}); {local_copy}, or set HF_HUB_OFFLINE=1 to read a copy from the "
            "`datasets` cache"
        )
    try:
        data = datasets.load_dataset(dataset, config, split=split)
    except Exception as exc:  # network, missing split, ...: one clear message
        raise FileNotFoundError(
            f"could not load {dataset!r} split {split!r} from the Hugging Face Hub "
            f"({type(exc).__name__}: {exc}); {local_copy}"
        ) from exc
    return [dict(row) for row in data]


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def _hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the Hub's host (``HF_ENDPOINT``, default ``https://huggingface.co``) takes no TCP
    connection within ``timeout_s`` seconds; ``None`` when it does, in offline mode (the
    ``datasets`` cache answers) and behind a proxy (only the proxy can tell)."""
    if any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in _OFFLINE_VARS
    ):
        return None
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc}"
