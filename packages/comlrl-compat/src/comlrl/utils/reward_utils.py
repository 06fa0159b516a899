"""CoMLRL 1.4.3's ``comlrl.utils.reward_utils``: calling a user's reward function in the
forms 1.4.3 accepts, and declaring its range.

:func:`reward_values` is what :class:`comlrl.trainers.environment.CompatReward`
uses for every joint action; :func:`set_reward_range` / :func:`resolve_reward_range`
attach and read a ``reward_range`` attribute (1.4.3 reads it for its reward histograms;
here it is validated and kept, nothing clips rewards to it).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "as_reward_list",
    "call_reward_function",
    "reward_values",
    "normalize_reward_lengths",
    "resolve_reward_range",
    "set_reward_range",
]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_Reward = TypeVar("_Reward", bound=Callable[..., Any])


def as_reward_list(raw: Any) -> list[Any]:
    """A reward function's return value as a list, values unconverted: a tensor
    (detached, ``tolist``), a list/tuple, or one value."""
    if hasattr(raw, "detach") and hasattr(raw, "tolist"):  # a torch tensor
        raw = raw.detach().cpu().tolist()
    if isinstance(raw, (list, tuple)):
        return list(raw)
    return [raw]


def call_reward_function(
    reward_func: Callable[..., Any],
    prompts: Sequence[str],
    agent_completions: Sequence[Sequence[str]],
    *,
    num_agents: int,
    batch_items: Sequence[Mapping[str, Any]] | None = None,
    signature: inspect.Signature | None = None,
) -> list[float]:
    """Call ``reward_func`` in the form its signature asks for (:func:`reward_values`);
    its values as floats.

    Raises:
        TypeError, ValueError: a returned value that ``float()`` rejects; whatever the
            reward function raises.
    """
    raw = reward_values(
        reward_func,
        prompts,
        agent_completions,
        num_agents=num_agents,
        batch_items=batch_items,
        signature=signature,
    )
    return [float(r) for r in raw]


def reward_values(
    reward_func: Callable[..., Any],
    prompts: Sequence[str],
    agent_completions: Sequence[Sequence[str]],
    *,
    num_agents: int,
    batch_items: Sequence[Mapping[str, Any]] | None = None,
    signature: inspect.Signature | None = None,
) -> list[Any]:
    """Call ``reward_func`` in the form its signature asks for; its values as a list
    (:func:`as_reward_list`, unconverted).

    With ``P`` positional parameters (not counting ``batch_items``, nor ``prompts`` after
    the first place: both go by keyword): ``*args`` or ``P == A``: ``f(c_1, ..., c_A)``;
    ``P == A + 1`` (or one agent with ``P != 1``): ``f(prompts, c_1, ...)``; ``P == 1``:
    ``f([c_1, ..., c_A])``; else ``f(c_1, ..., c_A)``; ``batch_items=`` / ``prompts=`` to
    parameters of those names or ``**kwargs``. A ``TypeError`` is retried as ``f(c_1, ...,
    c_A)`` (the first one is raised if that fails too). Without a readable signature:
    ``f(*cs, batch_items=...)``, ``f(*cs)``, then ``f(cs)``.
    """
    if signature is None:
        try:
            signature = inspect.signature(reward_func)
        except (TypeError, ValueError):
            signature = None
    if signature is None:
        if batch_items is not None:
            try:
                return as_reward_list(reward_func(*agent_completions, batch_items=batch_items))
            except TypeError:
                pass
        try:
            return as_reward_list(reward_func(*agent_completions))
        except TypeError:
            return as_reward_list(reward_func(agent_completions))
    params = signature.parameters
    kinds = [p.kind for p in params.values()]
    has_var_kw = inspect.Parameter.VAR_KEYWORD in kinds
    has_var_pos = inspect.Parameter.VAR_POSITIONAL in kinds
    # batch_items, and prompts after the first place, are passed by keyword: not counted
    n = sum(
        1
        for i, p in enumerate(params.values())
        if p.kind in _POSITIONAL and p.name != "batch_items" and not (p.name == "prompts" and i)
    )
    kwargs: dict[str, Any] = {}
    if batch_items is not None and ("batch_items" in params or has_var_kw):
        kwargs["batch_items"] = batch_items
    args: list[Any]
    used_prompts = False
    if has_var_pos:
        args = list(agent_completions)
    elif num_agents == 1:
        used_prompts = n != 1
        args = [prompts, agent_completions[0]] if used_prompts else [agent_completions[0]]
    elif n == num_agents + 1:
        args, used_prompts = [prompts, *agent_completions], True
    elif n == 1:
        args = [agent_completions]
    else:
        args = list(agent_completions)
    if not used_prompts and ("prompts" in params or has_var_kw):
        kwargs["prompts"] = prompts
    try:
        return as_reward_list(reward_func(*args, **kwargs))
    except TypeError as exc:
        try:
            return as_reward_list(reward_func(*agent_completions))
        except TypeError:
            raise exc from None


def normalize_reward_lengths(
    rewards: Sequence[float], *, num_agents: int, num_generations: int, algorithm: str
) -> list[float]:
    """The rewards of one call, checked: one agent: as given; several agents: one value
    (repeated for every agent), ``num_agents`` values, or ``num_generations`` values.

    Raises:
        ValueError: ``num_generations < 1`` or any other count (named with ``algorithm``).
    """
    values = [float(r) for r in rewards]
    if num_agents == 1:
        return values
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations!r}")
    if len(values) == 1:
        return values * num_agents
    if len(values) in (num_agents, num_generations):
        return values
    raise ValueError(
        f"{algorithm}: the reward function returned {len(values)} values; return 1 or "
        f"{num_agents} (one per agent) values per prompt for multi-agent {algorithm}."
    )


def resolve_reward_range(reward_func: Callable[..., Any]) -> tuple[float, float] | None:
    """``reward_func.reward_range`` as ``(minimum, maximum)`` floats, or None when unset.

    Raises:
        ValueError: not a two-item sequence, a non-finite bound, or ``minimum >= maximum``.
    """
    declared = getattr(reward_func, "reward_range", None)
    if declared is None:
        return None
    if (
        isinstance(declared, (str, bytes))
        or not isinstance(declared, Sequence)
        or len(declared) != 2
    ):
        raise ValueError(
            f"reward_func.reward_range must be a two-item sequence (minimum, maximum), got "
            f"{declared!r}"
        )
    low, high = float(declared[0]), float(declared[1])
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise ValueError(
            f"reward_func.reward_range must hold finite values, minimum < maximum, got {declared!r}"
        )
    return low, high


def set_reward_range(reward_func: _Reward, minimum: float, maximum: float) -> _Reward:
    """Declare ``reward_func``'s raw output range (``reward_range`` attribute); returns it.

    Raises:
        ValueError: as :func:`resolve_reward_range`.
    """
    reward_func.reward_range = (float(minimum), float(maximum))  # type: ignore[attr-defined]
    resolve_reward_range(reward_func)
    return reward_func
