"""CoMLRL 1.4.3's user callbacks (reward functions, formatters, ``external_transition``)
adapted to :mod:`comlrl.algos`' interfaces.

- :class:`CompatReward` calls a reward function in any of the signature forms CoMLRL 1.4.3
  accepts, once per joint action, applies ``reward_processor`` and returns a batched
  :class:`comlrl.core.RewardBatch`.
- :func:`build_formatters` turns ``None`` / one callable / ``A`` callables into ``A``
  per-agent formatters that take ``external_prompts=`` after the first turn.
- :class:`CompatEnvironment` is a :class:`comlrl.algos.rollout.environment.CallbackEnvironment` whose
  later-turn prompts come from ``external_transition`` run through the formatters (or
  used as they are with ``external_prompt_passthrough``), as CoMLRL 1.4.3 builds them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.algos.rollout.environment import CallbackEnvironment
from comlrl.core import RewardBatch, RewardFunctionError, check_rewards

__all__ = ["CompatReward", "CompatEnvironment", "Formatter", "build_formatters"]

#: ``formatter(example, external_prompts=None) -> prompt``.
Formatter = Callable[..., str]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _as_floats(raw: Any) -> list[Any]:
    """A reward function's return value as a list (tensor, list/tuple or one number)."""
    if hasattr(raw, "detach") and hasattr(raw, "tolist"):  # a torch tensor
        raw = raw.detach().cpu().tolist()
    if isinstance(raw, (list, tuple)):
        return list(raw)
    return [raw]


class CompatReward:
    """A CoMLRL 1.4.3 ``reward_func`` as a batched :class:`comlrl.core.JointReward`.

    Each joint action is scored by its own call with one-element lists per agent, exactly
    as CoMLRL 1.4.3 calls it. The call form is read from the signature:

    - ``f(*completions)`` (var-positional): ``f(c_1, ..., c_A)``;
    - ``A`` positional parameters: ``f(c_1, ..., c_A)``; ``A + 1``: ``f(prompts, c_1,
      ..., c_A)``; one parameter (and ``A > 1``): ``f([c_1, ..., c_A])``; one agent with
      two or more parameters: ``f(prompts, c_1)``; any other count: ``f(c_1, ..., c_A)``;
    - a parameter named ``batch_items`` (or ``**kwargs``) receives ``[example]``, and
      ``prompts`` (or ``**kwargs``), when not passed positionally, receives ``[prompt]``;
      ``batch_items`` (anywhere) and ``prompts`` (after the first place) are keywords,
      not counted as positional parameters (see docs/compat.md);
    - a callable without a readable signature is tried as ``f(*completions,
      batch_items=...)``, ``f(*completions)``, then ``f([completions])``; a ``TypeError``
      from the chosen form is retried as ``f(*completions)``.

    Here ``c_a = [text]`` and ``prompts = [prompt_of(example)]`` (agent 0's turn-0 prompt).
    The first returned value goes through ``processor``.

    Args:
        func: the user's reward function.
        num_agents: ``A``.
        prompt_of: ``example -> prompt`` for the ``prompts`` argument.
        processor: ``float -> float`` applied to each reward (CoMLRL's ``reward_processor``).

    Raises:
        TypeError: ``func`` or ``processor`` not callable.
    """

    is_joint_reward = True

    def __init__(
        self,
        func: Callable[..., Any],
        num_agents: int,
        prompt_of: Callable[[Mapping[str, Any]], str],
        processor: Callable[[float], float] | None = None,
    ) -> None:
        if not callable(func):
            raise TypeError(f"reward_func must be callable, got {type(func).__name__}: {func!r}")
        if processor is not None and not callable(processor):
            raise TypeError(
                f"reward_processor must be callable (float -> float), got {type(processor).__name__}"
            )
        self.func = func
        self.num_agents = num_agents
        self.prompt_of = prompt_of
        self.processor = processor
        self.__name__ = getattr(func, "__name__", type(func).__name__)
        try:
            self.signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):
            self.signature = None

    def call(
        self, prompts: list[str], completions: list[list[str]], batch_items: list[Mapping[str, Any]]
    ) -> list[Any]:
        """Call the user's function in its form; its values as a list (unprocessed)."""
        func = self.func
        if self.signature is None:
            for attempt in (
                lambda: func(*completions, batch_items=batch_items),
                lambda: func(*completions),
            ):
                try:
                    return _as_floats(attempt())
                except TypeError:
                    pass
            return _as_floats(func(completions))
        params = self.signature.parameters
        has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        has_var_pos = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values())
        # batch_items, and prompts after the first place, are keywords (docs/compat.md)
        positional = [
            p
            for i, p in enumerate(params.values())
            if p.kind in _POSITIONAL and p.name != "batch_items" and not (p.name == "prompts" and i)
        ]
        n, a = len(positional), self.num_agents
        kwargs: dict[str, Any] = {}
        if "batch_items" in params or has_var_kw:
            kwargs["batch_items"] = batch_items
        args: list[Any]
        used_prompts = False
        if has_var_pos:
            args = list(completions)
        elif a == 1:
            used_prompts = n != 1
            args = [prompts, completions[0]] if used_prompts else [completions[0]]
        elif n == a + 1:
            args, used_prompts = [prompts, *completions], True
        elif n == 1:
            args = [completions]
        else:
            args = list(completions)
        if not used_prompts and ("prompts" in params or has_var_kw):
            kwargs["prompts"] = prompts
        try:
            return _as_floats(func(*args, **kwargs))
        except TypeError as exc:
            try:
                return _as_floats(func(*completions))
            except TypeError:
                raise exc from None

    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions (agent-major texts ``[A][K]``, ``K`` examples).

        Raises:
            RewardFunctionError: the function raised, returned nothing, or a processed
                reward is not a finite number (NaN/inf are errors, not replaced).
        """
        values: list[Any] = []
        for k, example in enumerate(examples):
            texts = [[str(completions[a][k])] for a in range(self.num_agents)]
            shown = [t[0] for t in texts]
            try:
                raw = self.call([self.prompt_of(example)], texts, [example])
            except Exception as exc:
                raise RewardFunctionError(
                    f"reward function {self.__name__!r} raised {type(exc).__name__}: {exc}",
                    index=k,
                    completions=shown,
                    example=example,
                ) from exc
            if not raw:
                raise RewardFunctionError(
                    f"reward function {self.__name__!r} returned no value; return a list with "
                    "one float per joint action",
                    index=k,
                    completions=shown,
                    example=example,
                )
            value = raw[0]
            if self.processor is not None:
                value = self.processor(float(value))
            values.append(value)
        return RewardBatch(check_rewards(values, completions, examples))


def _default_formatter(example: Mapping[str, Any], external_prompts: Any = None) -> str:
    if external_prompts is not None:
        return str(external_prompts)
    return str(example.get("prompt", ""))


def _wrap(fmt: Callable[..., str]) -> Formatter:
    try:
        takes_external = "external_prompts" in inspect.signature(fmt).parameters
    except (TypeError, ValueError):
        takes_external = False

    def formatter(example: Mapping[str, Any], external_prompts: Any = None) -> str:
        if takes_external and external_prompts is not None:
            return fmt(example, external_prompts=external_prompts)
        return fmt(example)

    formatter.__wrapped__ = fmt  # type: ignore[attr-defined]
    return formatter


def build_formatters(formatters: Any, num_agents: int) -> list[Formatter]:
    """``A`` formatters from CoMLRL's ``formatters`` argument.

    ``None``: every agent reads ``example["prompt"]``; one callable: shared by all agents;
    a sequence: one per agent. A formatter that declares ``external_prompts`` receives the
    transition's prompt after the first turn (the example's ``"prompt"`` is then that
    prompt too); others are called with the example alone.

    Raises:
        ValueError: a sequence whose length is not ``num_agents``, or something that is
            neither None, a callable nor a sequence of callables.
    """
    if formatters is None:
        return [_default_formatter] * num_agents
    if callable(formatters):
        return [_wrap(formatters)] * num_agents
    if isinstance(formatters, Sequence) and not isinstance(formatters, (str, bytes)):
        if len(formatters) != num_agents:
            raise ValueError(
                f"{len(formatters)} formatters for num_agents={num_agents}; give one formatter "
                "per agent or a single one for all."
            )
        bad = [f for f in formatters if not callable(f)]
        if bad:
            raise ValueError(f"formatters must be callables, got {bad!r}")
        return [_wrap(f) for f in formatters]
    raise ValueError(
        f"formatters must be None, a callable or a list of callables, got {type(formatters).__name__}"
    )


class CompatEnvironment(CallbackEnvironment):
    """CoMLRL 1.4.3's multi-turn contract as an :class:`~comlrl.algos.rollout.environment.Environment`.

    Turn 0: agent ``a``'s prompt is ``formatters[a](example)``. After a joint action,
    ``external_transition(prompt=example["prompt"], agent_completions=..., num_agents=A,
    prompt_history_per_agent=..., response_history_per_agent=...)`` returns ``A`` external
    prompts; agent ``a``'s next prompt is that text itself with ``passthrough``, else
    ``formatters[a]`` applied to a copy of the example whose ``"prompt"`` is the external
    prompt (with ``external_prompts=`` when the formatter declares it).

    Args:
        formatters: ``A`` formatters from :func:`build_formatters`.
        reward: the batched reward (:class:`CompatReward`).
        transition: ``external_transition``; None: single-turn.
        passthrough: CoMLRL's ``external_prompt_passthrough``.
    """

    def __init__(
        self,
        formatters: Sequence[Formatter],
        reward: CompatReward,
        transition: Callable[..., Sequence[str]] | None = None,
        passthrough: bool = False,
    ) -> None:
        self.compat_formatters = list(formatters)
        super().__init__(self.compat_formatters, reward, transition)
        self.passthrough = passthrough

    def next_prompts(self, example: Mapping[str, Any], external: Sequence[str]) -> list[str]:
        """Agent ``a``'s next prompt from ``external_transition``'s ``external[a]`` (see
        the class docstring); called by :meth:`CallbackEnvironment.step`.

        Raises:
            ValueError: the transition did not return ``A`` prompts.
        """
        if not isinstance(external, (list, tuple)) or len(external) != self.num_agents:
            raise ValueError(
                f"external_transition must return a list of {self.num_agents} prompts (one per "
                f"agent), got {external!r}"
            )
        if self.passthrough:
            return list(external)
        prompts = []
        for fmt, ext in zip(self.compat_formatters, external):
            item = dict(example)
            item["prompt"] = ext
            prompts.append(fmt(item, external_prompts=ext))
        return prompts

    @property
    def reward(self) -> Any:
        """The batched joint reward every joint action is scored with."""
        return self._reward

    @reward.setter
    def reward(self, reward: Any) -> None:
        if not getattr(reward, "is_joint_reward", False):
            raise TypeError(
                f"the environment's reward must be a batched joint reward (is_joint_reward=True), "
                f"got {type(reward).__name__}"
            )
        self._reward = reward
