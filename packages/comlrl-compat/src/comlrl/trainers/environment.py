"""CoMLRL 1.4.3's callbacks (``reward_func``, ``reward_processor``, ``formatters``,
``external_transition``) as the environment the ``comlrl.algos`` recipes play:
:class:`CompatReward` (a batched joint reward), :func:`build_formatters` and
:class:`CompatEnvironment` (later turns' prompts from the transition, through the
formatters)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.algos import AGENT_REWARDS_KEY, CallbackEnvironment
from comlrl.core import RewardBatch, RewardFunctionError, check_rewards
from comlrl.utils.formatters import Formatter
from comlrl.utils.formatters import build_formatters as _build_formatters
from comlrl.utils.reward_utils import reward_values

__all__ = ["CompatReward", "CompatEnvironment", "Formatter", "build_formatters"]


class CompatReward:
    """A CoMLRL 1.4.3 ``reward_func`` as a batched :class:`comlrl.core.JointReward`.

    Each joint action is scored by its own call with one-element lists ``c_a = [text]``,
    as 1.4.3 calls it, in the form the signature asks for
    (:func:`comlrl.utils.reward_utils.reward_values`: ``f(c_1, ..., c_A)``,
    ``f(prompts, c_1, ..., c_A)``, ``f([c_1, ..., c_A])``, ``f(*cs)``, with
    ``batch_items=[example]`` / ``prompts=[prompt_of(example)]`` when declared). The first
    returned value goes through ``processor``. With ``per_agent`` (IAC, MAAC), ``A``
    returned values are agent ``a``'s rewards, each processed and kept in the reward info
    under :data:`comlrl.algos.AGENT_REWARDS_KEY`; the joint reward is their mean.

    Args:
        func: the user's reward function.
        num_agents: ``A``.
        prompt_of: ``example -> prompt`` for the ``prompts`` argument.
        processor: ``float -> float`` applied to each reward (``reward_processor``).
        per_agent: keep ``A`` returned values as per-agent rewards.

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
        per_agent: bool = False,
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
        self.per_agent = per_agent
        self.__name__ = getattr(func, "__name__", type(func).__name__)
        try:
            self.signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):
            self.signature = None

    def __call__(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions (agent-major texts ``[A][K]``, ``K`` examples).

        Raises:
            RewardFunctionError: the function raised, returned nothing, or a processed
                reward is not a finite number (NaN/inf are errors, not replaced).
        """
        values: list[Any] = []
        infos: list[dict[str, Any]] = [{} for _ in examples]
        for k, example in enumerate(examples):
            texts = [[str(completions[a][k])] for a in range(self.num_agents)]
            shown = [t[0] for t in texts]
            try:
                raw = reward_values(
                    self.func,
                    [self.prompt_of(example)],
                    texts,
                    num_agents=self.num_agents,
                    batch_items=[example],
                    signature=self.signature,
                )
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
            if self.per_agent and self.num_agents > 1 and len(raw) == self.num_agents:
                own = [self._process(r) for r in raw]
                checked = check_rewards(own, [[s] * len(own) for s in shown], [example] * len(own))
                infos[k][AGENT_REWARDS_KEY] = checked
                values.append(sum(checked) / len(checked))
            else:
                values.append(self._process(raw[0]))
        return RewardBatch(check_rewards(values, completions, examples), infos)

    def _process(self, value: Any) -> Any:
        return self.processor(float(value)) if self.processor is not None else value


def build_formatters(formatters: Any, num_agents: int) -> list[Formatter]:
    """``A`` formatters from CoMLRL's ``formatters`` argument
    (:func:`comlrl.utils.formatters.build_formatters`; a formatter's own
    ``external_prompts`` default applies on the first turn).

    Raises:
        ValueError: as :func:`comlrl.utils.formatters.build_formatters`.
    """
    built = _build_formatters(formatters, num_agents, pass_none_external_prompts=False)
    return [_as_text(f) for f in built]


def _as_text(fmt: Formatter) -> Formatter:
    def formatter(example: Mapping[str, Any], external_prompts: Any = None) -> str:
        return str(fmt(example, external_prompts=external_prompts))

    formatter.__wrapped__ = getattr(fmt, "__wrapped__", fmt)  # type: ignore[attr-defined]
    return formatter


class CompatEnvironment(CallbackEnvironment):
    """CoMLRL 1.4.3's multi-turn contract as a :class:`comlrl.algos.CallbackEnvironment`.

    Turn 0: agent ``a``'s prompt is ``formatters[a](example)``. After a joint action,
    ``external_transition(prompt=example["prompt"], agent_completions=..., num_agents=A,
    prompt_history_per_agent=..., response_history_per_agent=...)`` returns ``A`` external
    prompts; agent ``a``'s next prompt is that text itself with ``passthrough``, else
    ``formatters[a]`` applied to a copy of the example whose ``"prompt"`` is the external
    prompt (with ``external_prompts=`` when the formatter declares it).

    Args:
        formatters: ``A`` formatters from :func:`build_formatters`.
        reward: the batched joint reward (:class:`CompatReward`, or any object with
            ``is_joint_reward = True``).
        transition: ``external_transition``; None: single-turn.
        passthrough: CoMLRL's ``external_prompt_passthrough``.
    """

    def __init__(
        self,
        formatters: Sequence[Formatter],
        reward: Any,
        transition: Callable[..., Sequence[str]] | None = None,
        passthrough: bool = False,
    ) -> None:
        self.compat_formatters = list(formatters)
        super().__init__(self.compat_formatters, reward, transition)
        self.passthrough = passthrough
        self._joint_reward = reward

    @property
    def joint_reward(self) -> Any:
        """The batched joint reward this environment scores with (``is_joint_reward``)."""
        return self._joint_reward

    def use_reward(self, reward: Any) -> None:
        """Score with ``reward`` (a batched joint reward) from now on: MARLHF's RL stage
        swaps the task's reward for the fitted reward model's.

        Raises:
            TypeError: ``reward`` is not a batched joint reward (``is_joint_reward``).
        """
        if not getattr(reward, "is_joint_reward", False):
            raise TypeError(
                f"use_reward needs a batched joint reward (is_joint_reward = True), got "
                f"{type(reward).__name__}"
            )
        self._joint_reward = reward

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> Any:
        """Score ``K`` joint actions (agent-major texts ``[A][K]``, ``K`` examples) with
        :attr:`joint_reward`."""
        return self._joint_reward(completions, examples)

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
