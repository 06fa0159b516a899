"""The agent interface: anything that samples ``G`` completions per prompt in one batched call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from comlrl.core.prompts import Prompt
from comlrl.core.records import Completion

__all__ = ["Agent", "SamplingParams"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How an agent samples its completions.

    Attributes:
        num_generations: ``G``, completions sampled per prompt (the group size), ``>= 1``.
        max_new_tokens: completion token limit, ``>= 1``.
        temperature: softmax temperature, ``> 0``; log-probs are those of the tempered policy.
        top_p: nucleus sampling mass in ``(0, 1]``; ``1.0`` samples from the full softmax.
        top_k: keep only the ``top_k`` most likely tokens; ``0`` disables the filter.
    """

    num_generations: int = 4
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {self.num_generations}.")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}.")

    @classmethod
    def from_config(
        cls, config: Any, num_generations: int, *, max_new_tokens: int | None = None
    ) -> SamplingParams:
        """The sampling a run's settings ask for, with ``num_generations`` completions per
        prompt: ``max_new_tokens``, ``temperature``, ``top_p`` and ``top_k`` read from
        ``config`` (any object with those attributes: a recipe's config, CoMLRL 1.4.3's
        trainer args; ``top_k=None`` means 0). ``max_new_tokens`` here replaces the
        config's.

        Raises:
            AttributeError: ``config`` lacks one of the four attributes.
            ValueError: a value out of range (see the class).
        """
        return cls(
            num_generations=int(num_generations),
            max_new_tokens=int(max_new_tokens or config.max_new_tokens),
            temperature=float(config.temperature),
            top_p=float(config.top_p),
            top_k=int(config.top_k or 0),
        )


@runtime_checkable
class Agent(Protocol):
    """One policy in the team.

    An agent turns ``P`` prompts into ``P`` groups of ``G`` completions with one batched
    call (never a Python loop over prompts or samples).
    """

    name: str

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """Sample ``params.num_generations`` completions for each prompt.

        Args:
            prompts: ``P`` prompts: strings, or :class:`~comlrl.core.ChatPrompt` s (an
                agent with a chat template applies it to their messages, one without
                feeds :func:`~comlrl.core.prompt_text`; see :mod:`comlrl.core.prompts`).
            params: sampling settings; ``G = params.num_generations``.

        Returns:
            ``P`` lists of ``G`` :class:`Completion` records, each with token ids and
            behaviour log-probs of the tempered sampling policy.
        """
        ...
