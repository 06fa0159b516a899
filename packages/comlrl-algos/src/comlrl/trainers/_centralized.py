"""CoMLRL 1.4.3's names for centralized collaboration, mapped onto
:mod:`comlrl.algos.rollout.centralized` (one joint policy writes every role's output; the
method lives there, these are the same classes under 1.4.3's names)."""

from __future__ import annotations

from comlrl.algos.rollout.centralized import (
    CentralizedReward,
    RoleFormat,
    RoleParseError,
    TaggedRoles,
    centralized_callbacks,
    check_role_format,
    split_roles,
)

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "CentralizedReward",
    "TaggedCentralizedComparatorAdapter",
    "centralized_callbacks",
    "check_adapter",
    "split_roles",
]

#: 1.4.3's adapter protocol: :class:`comlrl.algos.rollout.centralized.RoleFormat`
CentralizedComparatorAdapter = RoleFormat
#: 1.4.3's parse error: :class:`comlrl.algos.rollout.centralized.RoleParseError`
CentralizedComparatorParseError = RoleParseError
#: 1.4.3's tagged adapter: :class:`comlrl.algos.rollout.centralized.TaggedRoles`
TaggedCentralizedComparatorAdapter = TaggedRoles
#: 1.4.3's adapter check: :func:`comlrl.algos.rollout.centralized.check_role_format`
check_adapter = check_role_format
