"""The order a run sees its examples in: seeded, reshuffled every epoch, and resumable
(:class:`DataStream`); and the append-only JSON-lines logs (:class:`JsonlWriter`)."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = [
    "DataStream",
    "JsonlWriter",
]


class DataStream:
    """Examples in a seeded order, reshuffled every epoch (or in dataset order).

    Args:
        dataset: a sequence of examples (mappings); a ``datasets.Dataset`` works.
        seed: seed of the shuffle.
        shuffle: ``False`` hands out the examples in dataset order, epoch after epoch.

    Raises:
        ValueError: on an empty dataset.
    """

    def __init__(
        self, dataset: Sequence[Mapping[str, Any]], seed: int = 0, shuffle: bool = True
    ) -> None:
        if len(dataset) == 0:
            raise ValueError("the dataset is empty; nothing to train on.")
        self.dataset = dataset
        self.shuffle = shuffle
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.epoch = 0

    def next_batch(self, size: int) -> list[Mapping[str, Any]]:
        """The next ``size`` examples."""
        out: list[Mapping[str, Any]] = []
        while len(out) < size:
            if not self.order:
                self.order = list(range(len(self.dataset)))
                if self.shuffle:
                    self.rng.shuffle(self.order)
                self.order.reverse()  # pop() from the end hands out order[0] first
                self.epoch += 1
            out.append(self.dataset[self.order.pop()])
        return out

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: the rest of this epoch's order, the epoch, the shuffle RNG.

        Plain ints, lists and tuples (``torch.load(weights_only=True)`` reads them back).
        """
        return {
            "num_examples": len(self.dataset),
            "order": list(self.order),
            "epoch": self.epoch,
            "rng": self.rng.getstate(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next batch is the one the saved stream gave.

        Raises:
            ValueError: the saved stream was over a dataset of another size (the data
                changed since the checkpoint; resuming would hand out other examples).
        """
        if int(state["num_examples"]) != len(self.dataset):
            raise ValueError(
                f"the checkpoint's data stream was over {state['num_examples']} examples but "
                f"the dataset now has {len(self.dataset)}; resume with the same task data "
                "(task.name, task.split, task.kwargs) as the run was started with."
            )
        self.order = [int(i) for i in state["order"]]
        self.epoch = int(state["epoch"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


class JsonlWriter:
    """Append JSON rows to a file, one per line, flushed after each write."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[str] = open(self.path, "a")  # noqa: SIM115 - closed in close()

    def write(self, row: Mapping[str, Any]) -> None:
        self._fh.write(json.dumps(row, default=str) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
