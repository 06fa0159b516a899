"""Centralized collaboration: one joint policy writes every role's output.

A task written for ``A`` cooperating agents (roles) can also be played by *one* policy
that sees every role's prompt in one joint prompt and writes one joint completion, which
a *role format* splits back into the ``A`` role outputs; the task's own joint reward then
scores those outputs as one joint action. The policy learns on the joint text only
(CoMLRL's centralized collaboration mode; CoMLRL 1.4.3's ``CentralizedMAGRPOTrainer`` and
its ``centralized_adapter``: ``build_prompt(item, agent_prompts) -> str`` and
``parse_completion(completion, item, num_agents) -> A strings``).

- :class:`RoleFormat`: that adapter protocol (any object with the two methods works).
- :class:`TaggedRoles`: ask for ``<agent_i> ... </agent_i>`` sections and read them back
  (for instruction-following chat models).
- :class:`SentenceRoles`: the roles' prompts in order as one text; the joint completion's
  sentences split into ``A`` consecutive runs (for base models such as the built-in
  stories260k, which never write tags).
- :func:`split_roles`: one joint completion -> ``A`` role outputs, checked.
- :func:`centralized_callbacks`: a role-level :class:`~comlrl.algos.rollout.environment.Environment`
  as the one-agent ``(formatter, reward)`` pair any recipe takes in CoMLRL's form.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from comlrl.algos.rollout.environment import CallbackEnvironment, TaskEnvironment
from comlrl.core import RewardBatch, Task
from comlrl.core.prompts import prompt_text

__all__ = [
    "RoleFormat",
    "RoleParseError",
    "TaggedRoles",
    "SentenceRoles",
    "ROLE_FORMATS",
    "joint_environment",
    "check_role_format",
    "split_roles",
    "CentralizedReward",
    "centralized_callbacks",
]


class RoleParseError(ValueError):
    """A joint completion could not be split into role outputs; :func:`split_roles` then
    gives every role ``""`` (as CoMLRL 1.4.3 does)."""


class RoleFormat(Protocol):
    """How one joint policy is asked for, and answers with, every role's output."""

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        """One prompt asking for every role's output, from the roles' own prompts."""
        ...

    def parse_completion(
        self, completion: str, batch_item: dict[str, Any], num_agents: int
    ) -> Sequence[str]:
        """``num_agents`` role outputs of one joint completion; raise
        :class:`RoleParseError` when none can be found."""
        ...


@dataclass(frozen=True)
class TaggedRoles:
    """Ask for each role's output between ``<agent_i>`` and ``</agent_i>`` (``i`` from 0)
    and read the sections back (case-insensitive, whitespace-stripped); a missing section
    is ``""``.

    Raises:
        RoleParseError: (from :meth:`parse_completion`) no ``<agent_i>`` tag at all.
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
        """The text inside each ``<agent_i>`` section."""
        text = str(completion)
        outputs: list[str] = []
        for i in range(num_agents):
            found = re.search(rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", text, re.I | re.S)
            outputs.append(found.group(1).strip() if found else "")
        if not any(re.search(rf"<\s*agent_{i}\s*>", text, re.I) for i in range(num_agents)):
            raise RoleParseError(f"no <agent_i> section in the joint completion {text[:80]!r}")
        return outputs


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class SentenceRoles:
    """The roles' prompts joined in order by ``separator`` as one text to continue; the
    joint completion's sentences (split after ``.``, ``!`` or ``?`` and whitespace) go to
    the roles in order, in ``A`` consecutive runs whose sizes differ by at most one (the
    earlier roles take the extra sentences). With fewer sentences than roles the later
    roles get ``""``; an empty completion gives every role ``""``.

    Made for base story models (the built-in stories260k): role 0 writes the beginning,
    the last role the ending, of one story.
    """

    separator: str = " "

    def build_prompt(self, batch_item: Mapping[str, Any], agent_prompts: Sequence[str]) -> str:
        """The roles' prompts, stripped, joined by :attr:`separator`."""
        return self.separator.join(str(p).strip() for p in agent_prompts)

    def parse_completion(
        self, completion: str, batch_item: Mapping[str, Any], num_agents: int
    ) -> list[str]:
        """``num_agents`` runs of consecutive sentences (each run joined by one space)."""
        sentences = [s for s in _SENTENCE_END.split(str(completion).strip()) if s]
        base, extra = divmod(len(sentences), num_agents)
        outputs, start = [], 0
        for i in range(num_agents):
            size = base + (1 if i < extra else 0)
            outputs.append(" ".join(sentences[start : start + size]))
            start += size
        return outputs


#: the role formats ``comlrl train algo=centralized_magrpo role_format=NAME`` offers
ROLE_FORMATS: Mapping[str, Callable[[], Any]] = {"tagged": TaggedRoles, "sentences": SentenceRoles}


def check_role_format(role_format: Any) -> None:
    """Raise ``TypeError`` unless ``role_format`` has callable ``build_prompt`` and
    ``parse_completion``."""
    for name in ("build_prompt", "parse_completion"):
        if not callable(getattr(role_format, name, None)):
            raise TypeError(
                f"centralized_adapter.{name} must be callable (got {type(role_format).__name__}); "
                "pass an object with build_prompt(item, agent_prompts) and "
                "parse_completion(completion, item, num_agents), e.g. TaggedRoles()."
            )


def split_roles(
    role_format: Any, completion: str, item: Mapping[str, Any], num_roles: int
) -> list[str]:
    """``num_roles`` role outputs of one joint completion (``""`` each when the format
    raises :class:`RoleParseError`).

    Raises:
        TypeError: the format returned something other than a list of strings.
        ValueError: it returned other than ``num_roles`` strings.
    """
    try:
        outputs = role_format.parse_completion(completion, dict(item), num_roles)
    except RoleParseError:
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
    """The joint reward of a one-agent (joint policy) run: each joint completion is split
    into role outputs (:func:`split_roles`) and scored as that joint action by the
    role-level reward.

    Args:
        role_format: the :class:`RoleFormat`.
        role_reward: a batched joint reward over ``num_roles`` agents:
            ``role_reward(completions [A][K], examples [K]) -> RewardBatch``.
        num_roles: ``A``.

    Raises:
        TypeError: (when built) a ``role_format`` without the two methods.
    """

    is_joint_reward = True

    def __init__(self, role_format: Any, role_reward: Any, num_roles: int) -> None:
        check_role_format(role_format)
        self.role_format = role_format
        self.role_reward = role_reward
        self.num_roles = num_roles

    def split(self, completion: str, example: Mapping[str, Any]) -> list[str]:
        """The role outputs of one joint completion."""
        return split_roles(self.role_format, completion, example, self.num_roles)

    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint completions (``completions``: the one agent's ``[1][K]`` texts)."""
        roles: list[list[str]] = [[] for _ in range(self.num_roles)]
        for text, example in zip(completions[0], examples, strict=True):
            for r, output in enumerate(self.split(text, example)):
                roles[r].append(output)
        result: RewardBatch = self.role_reward(roles, examples)
        return result


def centralized_callbacks(
    role_prompts: Callable[[Mapping[str, Any]], Sequence[Any]],
    role_reward: Any,
    num_roles: int,
    role_format: Any,
) -> tuple[Callable[[Mapping[str, Any]], str], CentralizedReward]:
    """The joint policy's formatter and reward from a role-level task.

    Args:
        role_prompts: ``example -> A`` role prompts (strings or chat prompts; rendered as
            plain text), e.g. ``lambda ex: env.root(ex).prompts``.
        role_reward: the role-level batched joint reward (e.g. ``env.reward``).
        num_roles: ``A``.
        role_format: the :class:`RoleFormat`.

    Returns:
        ``(formatter, reward)``: ``formatter(example)`` is the joint prompt,
        ``reward`` a :class:`CentralizedReward`; pass them as one agent's ``formatters=[...]``
        and ``reward_func=``.

    Raises:
        TypeError: a ``role_format`` without the two methods.
        ValueError: (from the formatter) ``build_prompt`` returned an empty or non-string
            prompt, or ``role_prompts`` gave other than ``A`` prompts.
    """
    reward = CentralizedReward(role_format, role_reward, num_roles)

    def joint_prompt(example: Mapping[str, Any]) -> str:
        prompts = [prompt_text(p) for p in role_prompts(example)]
        if len(prompts) != num_roles:
            raise ValueError(f"{len(prompts)} role prompts for {num_roles} roles")
        prompt = role_format.build_prompt(example, prompts)
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(
                f"centralized_adapter.build_prompt returned {prompt!r}; it must build a "
                "non-empty prompt."
            )
        return prompt

    return joint_prompt, reward


def joint_environment(task: Task, num_roles: int, role_format: str) -> CallbackEnvironment:
    """The one joint policy's environment on a role-level ``task``: its one prompt is the
    ``role_format``'s joint prompt of the task's ``num_roles`` role prompts, its reward the
    task's joint reward of the parsed role outputs (:func:`centralized_callbacks`).

    Raises:
        KeyError: ``role_format`` is not one of :data:`ROLE_FORMATS`.
    """
    env = TaskEnvironment(task)
    joint_prompt, reward = centralized_callbacks(
        lambda ex: env.root(ex).prompts, env.reward, num_roles, ROLE_FORMATS[role_format]()
    )
    return CallbackEnvironment([joint_prompt], reward)
