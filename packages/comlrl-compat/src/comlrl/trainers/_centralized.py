"""CoMLRL 1.4.3's names for centralized collaboration, mapped onto
:mod:`comlrl.algos.rollout.joint_policy` (one joint policy writes every role's output; the
method lives there, these are the same classes under 1.4.3's names)."""

from __future__ import annotations

from typing import Any

from comlrl.algos.rollout.joint_policy import (
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
    "JointRoleEvaluation",
    "TaggedCentralizedComparatorAdapter",
    "centralized_callbacks",
    "check_adapter",
    "split_roles",
]

#: 1.4.3's adapter protocol: :class:`comlrl.algos.rollout.joint_policy.RoleFormat`
CentralizedComparatorAdapter = RoleFormat
#: 1.4.3's parse error: :class:`comlrl.algos.rollout.joint_policy.RoleParseError`
CentralizedComparatorParseError = RoleParseError
#: 1.4.3's tagged adapter: :class:`comlrl.algos.rollout.joint_policy.TaggedRoles`
TaggedCentralizedComparatorAdapter = TaggedRoles
#: 1.4.3's adapter check: :func:`comlrl.algos.rollout.joint_policy.check_role_format`
check_adapter = check_role_format


class JointRoleEvaluation:
    """Evaluation of one joint actor for role-level ``eval_logger``s: the compat trainers
    that train one joint policy (centralized MAGRPO, the centralized MARLHF actor-critic
    stage) split its joint responses into the roles' outputs.

    The trainer sets ``_joint_reward`` (a
    :class:`~comlrl.algos.rollout.joint_policy.CentralizedReward`: it splits a joint
    response) and ``num_roles`` (``A``).
    """

    _joint_reward: Any
    num_roles: int

    @property
    def _centralized_eval_items(self) -> list[Any]:
        """1.4.3's examples held for the evaluation in progress: ours keeps none between
        evaluations (the roles' outputs are split per evaluation), so always empty."""
        return []

    def _eval_role_completions(
        self, completions: list[list[list[str]]], rows: list[dict[str, Any]]
    ) -> list[list[list[str]]]:
        """The joint responses ``[1][example][turn]`` as the roles' outputs
        ``[A][example][turn]`` (each split by ``_joint_reward.split(text, row)``)."""
        roles: list[list[list[str]]] = [[] for _ in range(self.num_roles)]
        for turns, item in zip(completions[0], rows, strict=True):
            parsed = [self._joint_reward.split(text, item) for text in turns]
            for r in range(self.num_roles):
                roles[r].append([p[r] for p in parsed])
        return roles
