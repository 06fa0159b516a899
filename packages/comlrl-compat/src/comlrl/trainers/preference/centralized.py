"""CoMLRL 1.4.3's module path ``comlrl.trainers.preference.centralized``: its centralized
comparator adapter names for ``comlrl.algos``' role formats (one joint policy writes every
role's output; :func:`comlrl.algos.centralized_callbacks`)."""

from __future__ import annotations

from comlrl.algos import RoleFormat, RoleParseError, TaggedRoles

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "TaggedCentralizedComparatorAdapter",
]

#: 1.4.3's adapter protocol
CentralizedComparatorAdapter = RoleFormat
#: 1.4.3's parse error
CentralizedComparatorParseError = RoleParseError
#: 1.4.3's tagged adapter
TaggedCentralizedComparatorAdapter = TaggedRoles
