"""The policy update's metrics: weighted sums kept on the device and read once
(:class:`MetricSums`), summed over ranks (:func:`merge_rank_metrics`), the truncated
importance weights' metrics (:func:`add_tis_metrics`), and one shared update's metrics
split among the agents that share the model (:func:`split_terms`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["MetricSums", "add_tis_metrics", "add_weighted", "merge_rank_metrics", "split_terms"]


class MetricSums:
    """Weighted metric sums kept on the device (no host synchronisation per micro-batch),
    read once at the end (:meth:`means`)."""

    def __init__(self) -> None:
        self.sums: dict[str, Any] = {}
        self.weights: dict[str, Any] = {}

    def add(self, key: str, value: Any, weight: Any) -> None:
        add_weighted(self.sums, self.weights, key, value, weight)

    def floats(self) -> tuple[dict[str, float], dict[str, float]]:
        """The sums and weights as Python floats, fetched in one transfer."""
        tensors = [
            v for v in (*self.sums.values(), *self.weights.values()) if isinstance(v, torch.Tensor)
        ]
        fetched = iter(
            torch.stack([t.to(torch.float64).reshape(()) for t in tensors]).tolist()
            if tensors
            else []
        )
        index = {id(t): next(fetched) for t in tensors}

        def host(v: Any) -> float:
            return float(index[id(v)]) if isinstance(v, torch.Tensor) else float(v)

        return (
            {k: host(v) for k, v in self.sums.items()},
            {k: host(v) for k, v in self.weights.items()},
        )


def merge_rank_metrics(
    sums: dict[str, float], weights: dict[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Sum the metric sums and weights of every rank (keys may differ: a rank may have no
    completions at a later turn); ``grad_norm`` is already global and kept as is."""
    from comlrl.algos.models.ranks import gather_objects

    merged_sums: dict[str, float] = {}
    merged_weights: dict[str, float] = {}
    for rank_sums, rank_weights in gather_objects((sums, weights)):
        for key, value in rank_sums.items():
            if key != "grad_norm":
                add_weighted(merged_sums, merged_weights, key, value, rank_weights[key])
    if "grad_norm" in sums:
        merged_sums["grad_norm"], merged_weights["grad_norm"] = (
            sums["grad_norm"],
            weights["grad_norm"],
        )
    return merged_sums, merged_weights


def add_tis_metrics(
    acc: MetricSums, prefix: str, turn: int, tis: torch.Tensor, mask: torch.Tensor, cap: float
) -> None:
    """Token-weighted ``tis_weight_mean`` and ``tis_truncated_fraction`` (share of valid
    tokens whose weight hit the cap) of one micro-batch, on the device."""
    valid = mask.to(torch.bool)
    tokens = valid.sum().to(torch.float64)
    mean = torch.where(valid, tis, 0.0).sum().to(torch.float64)
    truncated = (valid & (tis >= cap)).sum().to(torch.float64)
    for key, value in (("tis_weight_mean", mean), ("tis_truncated_fraction", truncated)):
        acc.add(f"{prefix}turn_{turn}/{key}", value, tokens)
        acc.add(f"{prefix}{key}", value, tokens)


def add_weighted(
    sums: dict[str, Any], weights: dict[str, Any], key: str, value: Any, weight: Any
) -> None:
    """Add ``value`` (weighted by ``weight``: a mean's numerator) to ``sums[key]`` and
    ``weight`` to ``weights[key]``; values may be device tensors."""
    sums[key] = sums.get(key, 0.0) + value
    weights[key] = weights.get(key, 0.0) + weight


_TERM_KEY = re.compile(r"^term_(\d+)/")


def split_terms(stats: Mapping[str, float], members: Sequence[int]) -> dict[int, dict[str, float]]:
    """Each member's metrics of one :func:`update_policy` (or
    :func:`~comlrl.algos.training.update.node_chunks.update_in_node_chunks`) call on a model they
    share: ``term_<m>/x`` goes to member ``m`` as ``x`` (its own completions' KL, clip
    fraction, ratio, per turn and over all turns); every other key (``loss``, the summed
    loss that was stepped, ``grad_norm``, ``optimizer_steps``, an ``extra_loss``'s
    metrics) belongs to the one step and goes to every member.

    Raises:
        ValueError: a ``term_<k>/`` key whose ``k`` is not one of ``members``.
    """
    out: dict[int, dict[str, float]] = {m: {} for m in members}
    for key, value in stats.items():
        match = _TERM_KEY.match(key)
        if match is None:
            for m in members:
                out[m][key] = value
            continue
        m = int(match.group(1))
        if m not in out:
            raise ValueError(
                f"metric {key!r} names term {m}, not one of the members {list(members)}"
            )
        out[m][key[match.end() :]] = value
    return out
