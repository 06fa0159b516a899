"""The order a task-mixture run sees its examples in: each prompt of a batch comes from task
``i`` with probability ``w_i / sum(w)``, and each task hands out its own examples in a
seeded order, reshuffled every epoch of that task (:class:`MixtureStream`). The whole
position (which task comes next, where each task stands) is in :meth:`state_dict`, so a
resumed run draws exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.algos.rollout.mixture import task_of
from comlrl.algos.training.run.data import DataStream

__all__ = ["MixtureStream", "example_stream"]


class MixtureStream(DataStream):
    """Examples of several tasks, drawn by weight, each task in its own seeded order: a
    :class:`DataStream` (same methods, so every recipe and the checkpoint take it) whose
    batches come from one :class:`DataStream` per task.

    Args:
        dataset: every task's examples (e.g. :meth:`comlrl.algos.rollout.mixture.MixtureTask.load`).
        weights: ``{task: weight > 0}``; every task of the dataset needs one.
        task_of: the task an example came from.
        seed: seed of the task draws; task ``i``'s own order uses ``seed + 1 + i``.
        shuffle: ``False``: each task's examples in dataset order.

    Raises:
        ValueError: an empty dataset, a task without examples or without a weight, a
            weight that is not positive.
    """

    def __init__(
        self,
        dataset: Sequence[Mapping[str, Any]],
        weights: Mapping[str, float],
        task_of: Callable[[Mapping[str, Any]], str | None],
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        super().__init__(dataset, seed=seed, shuffle=shuffle)  # checks it is not empty
        parts: dict[str, list[Mapping[str, Any]]] = {name: [] for name in weights}
        for ex in dataset:
            name = task_of(ex)
            if name not in parts:
                raise ValueError(
                    f"an example of task {name!r} has no weight in the mixture {dict(weights)}"
                )
            parts[name].append(ex)
        empty = [name for name, exs in parts.items() if not exs]
        if empty:
            raise ValueError(f"the mixture's task(s) {empty} have no examples; nothing to draw")
        bad = {k: w for k, w in weights.items() if not w > 0}
        if bad:
            raise ValueError(f"mixture weights must be > 0, got {bad}")
        self.names = list(weights)
        self.weights = [float(weights[name]) for name in self.names]
        self.streams = {
            name: DataStream(parts[name], seed=seed + 1 + i, shuffle=shuffle)
            for i, name in enumerate(self.names)
        }
        self.rng = random.Random(seed)
        self.drawn = dict.fromkeys(self.names, 0)

    def next_batch(self, size: int) -> list[Mapping[str, Any]]:
        """The next ``size`` examples: a task drawn by weight for each, then that task's
        next example."""
        picks = self.rng.choices(self.names, weights=self.weights, k=size)
        for name in picks:
            self.drawn[name] += 1
        return [self.streams[name].next_batch(1)[0] for name in picks]

    def state_dict(self) -> dict[str, Any]:
        """The task draws' RNG, how many examples each task gave, and each task's stream
        (plain ints, lists, tuples and dicts: ``torch.load(weights_only=True)`` reads them)."""
        return {
            "mixture": list(self.names),
            "weights": list(self.weights),
            "rng": self.rng.getstate(),
            "drawn": dict(self.drawn),
            "streams": {name: s.state_dict() for name, s in self.streams.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next batch is the one the saved stream gave.

        Raises:
            ValueError: the checkpoint is of another data stream (not a mixture, other
                tasks or weights) or of other task data.
        """
        if (
            list(state.get("mixture", [])) != self.names
            or [float(w) for w in state.get("weights", [])] != self.weights
        ):
            raise ValueError(
                f"the checkpoint's data stream is not this mixture ({self.names} with weights "
                f"{self.weights}); resume with the task.mixture the run was started with."
            )
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.drawn = {name: int(state["drawn"][name]) for name in self.names}
        for name, stream in self.streams.items():
            stream.load_state_dict(state["streams"][name])


def example_stream(
    dataset: Sequence[Mapping[str, Any]], *, seed: int, shuffle: bool = True, task: Any = None
) -> DataStream:
    """The example stream of a run: a :class:`MixtureStream` weighted as ``task.mixture``
    when ``task`` (a :class:`~comlrl.algos.training.config.task.TaskConfig`, or ``None``) names a
    mixture, else a :class:`DataStream`.

    Raises:
        ValueError: as those classes' constructors.
    """
    mixture = getattr(task, "mixture", None)
    if mixture:
        weights = {entry.key: entry.weight for entry in mixture}
        return MixtureStream(dataset, weights, task_of, seed=seed, shuffle=shuffle)
    return DataStream(dataset, seed=seed, shuffle=shuffle)
