"""CoMLRL 1.4.3's centralized collaboration: one joint policy writes every role's output.

A *centralized adapter* (``build_prompt(item, agent_prompts) -> str`` and
``parse_completion(completion, item, num_agents) -> num_agents strings``) turns the roles'
prompts into one joint prompt and the joint completion back into role outputs. The policy
learns on the joint text; only the task reward and ``eval_logger`` see the role outputs.
:class:`CentralizedReward` is that boundary as a batched joint reward for a one-agent run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from comlrl.core import RewardBatch

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "CentralizedReward",
    "TaggedCentralizedComparatorAdapter",
]


class CentralizedComparatorParseError(ValueError):
    """A joint completion could not be split into role outputs (the joint action then
    counts as empty outputs for every role, as in CoMLRL 1.4.3)."""


class CentralizedComparatorAdapter(Protocol):
    """CoMLRL 1.4.3's adapter protocol (any object with these two methods works)."""

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        """One prompt asking for every role's output, from the roles' own prompts."""
        ...

    def parse_completion(
        self, completion: str, batch_item: dict[str, Any], num_agents: int
    ) -> Sequence[str]:
        """``num_agents`` role outputs from one joint completion; raise
        :class:`CentralizedComparatorParseError` when none can be found."""
        ...


@dataclass(frozen=True)
class TaggedCentralizedComparatorAdapter:
    """An adapter that asks for each role's output between ``<agent_i>`` and
    ``</agent_i>`` tags (``i`` from 0) and reads them back; a missing section is ``""``.

    Raises:
        CentralizedComparatorParseError: (from :meth:`parse_completion``) no section found.
    """

    def build_prompt(self, batch_item: Mapping[str, Any], agent_prompts: Sequence[str]) -> str:
        """The roles' prompts, then the required answer layout."""
        n = len(agent_prompts)
        tasks = "\n\n".join(f"Agent {i} original prompt:\n{p}" for i, p in enumerate(agent_prompts))
        layout = "\n".join(f"<agent_{i}>\n(agent {i}'s output)\n</agent_{i}>" for i in range(n))
        return (
            f"Write the outputs of {n} cooperating agents, each answering its own prompt.\n\n"
            f"{tasks}\n\nAnswer with one tagged section per agent and nothing else:\n{layout}\n"
        )

    def parse_completion(
        self, completion: str, batch_item: Mapping[str, Any], num_agents: int
    ) -> list[str]:
        """The text inside each ``<agent_i>`` section (whitespace-stripped)."""
        outputs: list[str] = []
        for i in range(num_agents):
            found = re.search(
                rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", str(completion), re.I | re.S
            )
            outputs.append(found.group(1).strip() if found else "")
        if not any(
            re.search(rf"<\s*agent_{i}\s*>", str(completion), re.I) for i in range(num_agents)
        ):
            raise CentralizedComparatorParseError(
                f"no <agent_i> section in the joint completion {str(completion)[:80]!r}"
            )
        return outputs


def check_adapter(adapter: Any) -> None:
    """Raise ``TypeError`` unless ``adapter`` has callable ``build_prompt`` and
    ``parse_completion``."""
    for name in ("build_prompt", "parse_completion"):
        if not callable(getattr(adapter, name, None)):
            raise TypeError(
                f"centralized_adapter.{name} must be callable (got {type(adapter).__name__}); "
                "pass an object with build_prompt(item, agent_prompts) and "
                "parse_completion(completion, item, num_agents), e.g. "
                "TaggedCentralizedComparatorAdapter()."
            )


def split_roles(
    adapter: Any, completion: str, item: Mapping[str, Any], num_roles: int
) -> list[str]:
    """``num_roles`` role outputs of one joint completion (``""`` each when the adapter
    raises :class:`CentralizedComparatorParseError`).

    Raises:
        TypeError, ValueError: the adapter returned something other than ``num_roles``
            strings.
    """
    try:
        outputs = adapter.parse_completion(completion, dict(item), num_roles)
    except CentralizedComparatorParseError:
        return [""] * num_roles
    if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence):
        raise TypeError(
            f"centralized_adapter.parse_completion must return a list of {num_roles} strings, "
            f"got {type(outputs).__name__}"
        )
    outputs = list(outputs)
    if len(outputs) != num_roles or not all(isinstance(o, str) for o in outputs):
        raise ValueError(
            f"centralized_adapter.parse_completion must return {num_roles} strings, got {outputs!r}"
        )
    return outputs


class CentralizedReward:
    """The task reward of a one-agent (joint policy) run: each joint completion is split
    into role outputs and scored as that joint action by the role-level reward.

    Args:
        adapter: the centralized adapter.
        role_reward: the batched reward over ``num_roles`` agents
            (:class:`comlrl.trainers._callbacks.CompatReward`).
        num_roles: the number of roles.
    """

    is_joint_reward = True

    def __init__(self, adapter: Any, role_reward: Any, num_roles: int) -> None:
        check_adapter(adapter)
        self.adapter = adapter
        self.role_reward = role_reward
        self.num_roles = num_roles

    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint completions (``completions``: one agent's ``[1][K]`` texts)."""
        roles: list[list[str]] = [[] for _ in range(self.num_roles)]
        for text, example in zip(completions[0], examples, strict=True):
            for r, output in enumerate(split_roles(self.adapter, text, example, self.num_roles)):
                roles[r].append(output)
        result: RewardBatch = self.role_reward(roles, examples)
        return result
