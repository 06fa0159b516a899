"""One round's preference pairs as a JSON file on disk: the replay's store when it is given
a folder (:class:`~comlrl.algos.recipes.preference.iterative.replay.PreferenceReplay`,
``replay_dir`` / CoMLRL 1.4.3's ``preference_replay_dir``).

With a folder, the replay keeps only each round's file and pair count in memory and reads
a round's pairs back when a draw picks that round, so a long run's history does not grow
the process, and the pairs every round trained from can be read after the run.

File layout (``iteration_XXXX.json``, ``XXXX`` the 1-based round, 4 digits)::

    {"iteration": 3, "num_pairs": 2, "pairs": [<IterPair.to_state()>, ...]}

Each pair record holds its prompts, chosen and rejected texts, token ids, rewards and
sources (:meth:`~comlrl.algos.recipes.preference.iterative.replay.IterPair.to_state`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ReplayShard", "write_shard", "read_shard", "shard_path"]


@dataclass(frozen=True)
class ReplayShard:
    """A round's pairs on disk.

    Attributes:
        iteration: the 1-based round.
        path: the JSON file.
        num_pairs: how many pairs it holds (``len(shard)``).
    """

    iteration: int
    path: Path
    num_pairs: int

    def __len__(self) -> int:
        return self.num_pairs

    def to_state(self) -> dict[str, Any]:
        """Plain values (a step checkpoint's replay part)."""
        return {"iteration": self.iteration, "path": str(self.path), "num_pairs": self.num_pairs}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ReplayShard:
        """The shard :meth:`to_state` gave."""
        return cls(int(state["iteration"]), Path(state["path"]), int(state["num_pairs"]))


def shard_path(folder: str | Path, iteration: int) -> Path:
    """``folder/iteration_XXXX.json`` of 1-based round ``iteration``."""
    return Path(folder) / f"iteration_{int(iteration):04d}.json"


def write_shard(
    folder: str | Path, iteration: int, pairs: Sequence[Mapping[str, Any]]
) -> ReplayShard:
    """Write round ``iteration``'s (1-based) ``pairs`` (pair records: plain values, as
    :meth:`~comlrl.algos.recipes.preference.iterative.replay.IterPair.to_state` gives) to :func:`shard_path` (created
    with its folder; written to a temporary name and renamed, so a reader never sees half
    a file; an earlier file of the same round is replaced).

    Raises:
        ValueError: ``iteration < 1``.
        TypeError: a pair's example holds a value JSON cannot write.
        OSError: the folder cannot be created or written.
    """
    if int(iteration) < 1:
        raise ValueError(f"replay shards are numbered from round 1, got iteration={iteration!r}")
    path = shard_path(folder, iteration)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "iteration": int(iteration),
        "num_pairs": len(pairs),
        "pairs": [dict(p) for p in pairs],
    }
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, ensure_ascii=False)
    os.replace(tmp, path)
    return ReplayShard(int(iteration), path, len(pairs))


def read_shard(shard: ReplayShard) -> list[dict[str, Any]]:
    """The pair records :func:`write_shard` wrote to ``shard.path``.

    Raises:
        FileNotFoundError: the file is gone (a replay folder must outlive its run).
        ValueError: the file does not hold ``shard.num_pairs`` pair records.
    """
    with open(shard.path, encoding="utf-8") as handle:
        payload = json.load(handle)
    records = payload.get("pairs") if isinstance(payload, dict) else None
    if not isinstance(records, list) or len(records) != shard.num_pairs:
        found = len(records) if isinstance(records, list) else type(records).__name__
        raise ValueError(
            f"replay shard {shard.path} should hold {shard.num_pairs} pairs, found {found}; "
            "was it changed during the run?"
        )
    return [dict(r) for r in records]
