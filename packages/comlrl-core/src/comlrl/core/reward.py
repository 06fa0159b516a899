"""Joint reward functions: the batched interface, the CoMLRL-style adapter, and checks.

A joint reward scores ``K`` joint actions at once. Internally every reward is a
:class:`JointReward`: it receives, for each of the ``A`` agents, the ``K`` completion texts
(agent-major, so ``completions[a][k]`` is agent ``a``'s part of joint action ``k``) and the
``K`` task examples, and returns a :class:`RewardBatch` of ``K`` floats.

User code may instead write CoMLRL's form::

    def reward_func(completions_agent1, completions_agent2, *, batch_items=None):
        return [float(...) for c1, c2 in zip(completions_agent1, completions_agent2)]

and pass it through :func:`as_joint_reward`, which calls it once per prompt with that
prompt's joint actions. If the function declares a keyword ``example`` it receives the
example (one dataset row, a mapping); ``batch_items`` receives ``[example]`` as in CoMLRL.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "RewardBatch",
    "JointReward",
    "RewardFunctionError",
    "as_joint_reward",
    "check_reward_arity",
    "check_rewards",
]


@dataclass(slots=True)
class RewardBatch:
    """Rewards for ``K`` joint actions.

    Attributes:
        rewards: ``K`` floats, one per joint action (task units).
        infos: ``K`` dicts of diagnostics (e.g. sandbox verdicts); empty dicts when none.
    """

    rewards: list[float]
    infos: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.infos:
            self.infos = [{} for _ in self.rewards]
        if len(self.infos) != len(self.rewards):
            raise ValueError(
                f"RewardBatch has {len(self.rewards)} rewards but {len(self.infos)} infos; "
                "give one info dict per reward."
            )


@runtime_checkable
class JointReward(Protocol):
    """The batched joint-reward interface used by the trainers."""

    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions.

        Args:
            completions: ``A`` sequences of ``K`` completion texts (agent-major).
            examples: ``K`` task examples, the one each joint action answers.

        Returns:
            A :class:`RewardBatch` with ``K`` rewards.
        """
        ...


class RewardFunctionError(RuntimeError):
    """A reward function raised, returned the wrong number of values, or returned NaN/inf.

    Attributes:
        index: index of the offending joint action within the batch (``None`` if unknown).
        completions: the offending joint action's completion texts, one per agent.
        example: the task example it answered.
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        completions: Sequence[str] | None = None,
        example: Mapping[str, Any] | None = None,
    ) -> None:
        self.index = index
        self.completions = tuple(completions) if completions is not None else None
        self.example = example
        details = []
        if index is not None:
            details.append(f"joint action #{index}")
        if completions is not None:
            shown = [c if len(c) <= 200 else c[:200] + "..." for c in completions]
            details.append(f"completions={shown!r}")
        if example is not None:
            keys = {k: example[k] for k in list(example)[:3]}
            details.append(f"example (first keys)={_short(keys)}")
        super().__init__(message + ("\n  " + "\n  ".join(details) if details else ""))


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def check_rewards(
    rewards: Sequence[float],
    completions: Sequence[Sequence[str]],
    examples: Sequence[Mapping[str, Any]],
) -> list[float]:
    """Validate ``K`` rewards: right count, real numbers, finite.

    A real number is anything with ``__float__`` (``int``, ``float``, NumPy scalars, 0-d
    tensors) except booleans; strings are rejected even when they spell a number
    (``"1.0"``), because a reward function that returns text is almost always a bug.

    Args:
        rewards: the ``K`` values a reward function returned.
        completions: ``A`` sequences of ``K`` completion texts it was given.
        examples: the ``K`` examples it was given.

    Returns:
        The rewards as a list of Python floats.

    Raises:
        RewardFunctionError: on ``None`` or another non-sequence, a count mismatch, a
            non-number (string, bool, None, ...), NaN or inf; the message names the
            offending joint action, its completions and its example.
    """
    k = len(examples)
    if rewards is None or isinstance(rewards, (str, bytes)) or not hasattr(rewards, "__iter__"):
        raise RewardFunctionError(
            f"reward function returned {_short(rewards)} ({type(rewards).__name__}) instead of "
            f"a list of {k} floats; return one float per joint action (did it miss a `return`?)"
        )
    values = list(rewards)
    if len(values) != k:
        raise RewardFunctionError(
            f"reward function returned {len(values)} values for {k} joint actions; "
            "return exactly one float per joint action."
        )
    out: list[float] = []
    for i, value in enumerate(values):
        kind = type(value).__name__
        try:
            if kind in ("bool", "bool_") or not hasattr(type(value), "__float__"):
                raise TypeError(kind)
            number = float(value)
        except (TypeError, ValueError):
            hint = {
                "str": "; return a number, not text (e.g. float(score))",
                "bool": "; return 1.0 / 0.0 instead of True / False",
                "bool_": "; return 1.0 / 0.0 instead of True / False",
                "NoneType": "; every joint action needs a score (use 0.0 or a penalty)",
            }.get(kind, "; return one float per joint action")
            raise RewardFunctionError(
                f"reward function returned {_short(value)} ({kind}) for joint action #{i}, "
                f"which is not a number{hint}",
                index=i,
                completions=[c[i] for c in completions],
                example=examples[i],
            ) from None
        if not math.isfinite(number):
            raise RewardFunctionError(
                f"reward function returned {number} (not finite); return a finite float or "
                "map failures to a finite penalty",
                index=i,
                completions=[c[i] for c in completions],
                example=examples[i],
            )
        out.append(number)
    return out


class _PerPromptReward:
    """Adapter from CoMLRL's ``reward_func(c1, c2, ..., batch_items=...)`` form."""

    def __init__(self, func: Callable[..., Sequence[float]]) -> None:
        self.func = func
        try:
            params = inspect.signature(func).parameters
        except (TypeError, ValueError):  # builtins, C callables
            params = {}  # type: ignore[assignment]
        has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self.pass_example = "example" in params or has_var_kw
        self.pass_batch_items = "batch_items" in params or has_var_kw
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        rewards: list[float] = []
        start = 0
        k = len(examples)
        while start < k:
            stop = start + 1
            while stop < k and examples[stop] is examples[start]:
                stop += 1
            example = examples[start]
            chunk = [list(c[start:stop]) for c in completions]
            kwargs: dict[str, Any] = {}
            if self.pass_example:
                kwargs["example"] = example
            if self.pass_batch_items:
                kwargs["batch_items"] = [example]
            try:
                values = self.func(*chunk, **kwargs)
            except Exception as exc:  # re-raised with the sample that caused it
                raise RewardFunctionError(
                    f"reward function {self.__name__!r} raised {type(exc).__name__}: {exc}",
                    index=start,
                    completions=[c[0] for c in chunk],
                    example=example,
                ) from exc
            if isinstance(values, (int, float)):
                values = [values]
            if (
                values is None
                or isinstance(values, (str, bytes))
                or not hasattr(values, "__iter__")
            ):
                raise RewardFunctionError(
                    f"reward function {self.__name__!r} returned {_short(values)} "
                    f"({type(values).__name__}) instead of a list of {stop - start} floats; "
                    "return one float per joint action (did it miss a `return`?)",
                    index=start,
                    completions=[c[0] for c in chunk],
                    example=example,
                )
            values = list(values)
            if len(values) != stop - start:
                raise RewardFunctionError(
                    f"reward function {self.__name__!r} returned {len(values)} values for "
                    f"{stop - start} joint actions of one prompt; return one float per joint "
                    "action (per element of each completions list).",
                    index=start,
                    completions=[c[0] for c in chunk],
                    example=example,
                )
            rewards.extend(check_rewards(values, chunk, [example] * (stop - start)))
            start = stop
        return RewardBatch(rewards)


def check_reward_arity(func: Callable[..., Any], num_agents: int) -> None:
    """Check, before any generation, that a reward function in CoMLRL's per-agent form
    takes one completions list per agent: ``func(c_1, ..., c_A)`` (plus ``example=`` /
    ``batch_items=`` when it declares them). Joint rewards (``is_joint_reward``) and
    callables without a readable signature pass unchecked.

    Raises:
        TypeError: ``func`` cannot be called with ``num_agents`` completions lists; the
            message names the function, its signature and the call it will get.
    """
    if getattr(func, "is_joint_reward", False):
        return
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: None for k in ("example", "batch_items") if k in params or has_var_kw}
    try:
        sig.bind(*([[]] * num_agents), **kwargs)
    except TypeError as exc:
        name = getattr(func, "__qualname__", None) or type(func).__name__
        lists = ", ".join(f"completions_agent{i + 1}" for i in range(num_agents))
        raise TypeError(
            f"reward function {name}{sig} cannot take the call it will get with "
            f"{num_agents} agents: {name}({lists}) ({exc}); give it one completions list "
            "per agent (it returns one float per joint action)."
        ) from None


def as_joint_reward(func: Callable[..., Any]) -> JointReward:
    """Wrap a user reward function as a batched :class:`JointReward`.

    Accepts either an object already following :class:`JointReward` (marked by an
    attribute ``is_joint_reward = True``, as the task suites' rewards are) or a function in
    CoMLRL's per-agent form ``reward_func(completions_agent1, ..., completions_agentA)``
    returning one float per joint action. The wrapper calls the latter once per prompt (all
    joint actions that share an example), passing ``example=`` and/or ``batch_items=`` when
    the function declares them, and checks every value with :func:`check_rewards`.

    Raises:
        TypeError: when ``func`` is not callable.
    """
    if not callable(func):
        raise TypeError(f"reward function must be callable, got {type(func).__name__}: {func!r}")
    if getattr(func, "is_joint_reward", False):
        return func  # type: ignore[return-value]
    return _PerPromptReward(func)
