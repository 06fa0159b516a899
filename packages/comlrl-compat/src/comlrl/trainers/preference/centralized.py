"""CoMLRL 1.4.3's module path ``comlrl.trainers.preference.centralized``: the centralized
comparator adapters."""

from __future__ import annotations

from comlrl.trainers._centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "TaggedCentralizedComparatorAdapter",
]
