"""Records that flow through one CoMLRL training step.

The vocabulary follows the Dec-POMDP view used across the library (see ``docs/architecture.md``):
each of the ``A`` agents sees its own *prompt* (observation) and writes a *completion*
(action); one completion per agent forms a *joint action*, which earns one joint *reward*.
A *group* is the ``G`` sibling completions an agent sampled for the same prompt.

These records are plain dataclasses with no dependency on torch. Fields documented as
tensors hold ``torch.Tensor`` objects when produced by :mod:`comlrl.algos`, but nothing here
imports torch, so environments and reward code can use them without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from comlrl.core.prompts import Prompt
from comlrl.core.tools import ToolResult

__all__ = ["Completion", "JointAction", "Feedback", "TurnRecord"]


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled completion of one agent for one prompt.

    Attributes:
        text: decoded completion text, special tokens removed, truncated at the first EOS.
        token_ids: completion token ids, shape ``[L]`` (int64 tensor or list of int), ``L``
            tokens up to and including the EOS token when one was emitted.
        logprobs: behaviour log-probabilities of ``token_ids`` under the sampling policy,
            shape ``[L]``, float32, natural log (nats). ``None`` when the agent did not
            record them (the trainer then recomputes them before the update).
        finished: ``True`` when the completion ended with an EOS token, ``False`` when it
            was cut at the token limit.
        tool_results: the tool calls made inside the completion, in order, with what each
            returned (:mod:`comlrl.core.tools`); empty for a completion without tools.
            With tools, :attr:`text` is the model's own text only (its segments joined,
            each segment after a call starting a new line as it did after the
            observation the model read; observations left out: a reward never reads a
            tool result as the model's answer), ``token_ids`` hold the whole sampled
            sequence (model tokens and observation tokens) and ``logprobs`` are 0 on
            observation tokens.
        transcript: with tools, the completion as the model read it: its own text with each
            observation in place; ``""`` without tools (then it is :attr:`text`).
    """

    text: str
    token_ids: Any = None
    logprobs: Any = None
    finished: bool = True
    tool_results: tuple[ToolResult, ...] = ()
    transcript: str = ""

    @property
    def num_tokens(self) -> int:
        """Number of completion tokens ``L`` (0 when ``token_ids`` is absent)."""
        return 0 if self.token_ids is None else len(self.token_ids)


@dataclass(frozen=True, slots=True)
class JointAction:
    """One completion per agent, scored together by the joint reward.

    Attributes:
        indices: for each of the ``A`` agents, the index ``g`` (``0 <= g < G``) of the
            completion it contributes from its group.
        completions: the ``A`` completion texts, in agent order.
    """

    indices: tuple[int, ...]
    completions: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.indices) != len(self.completions):
            raise ValueError(
                f"JointAction has {len(self.indices)} indices but {len(self.completions)} "
                "completions; give exactly one completion index per agent."
            )

    @property
    def num_agents(self) -> int:
        """Number of agents ``A`` in the joint action."""
        return len(self.indices)


@dataclass(frozen=True, slots=True)
class Feedback:
    """What the environment tells the agents after a joint action (multi-turn tasks).

    Attributes:
        texts: one feedback string per agent, inserted into that agent's next prompt.
        done: ``True`` when the episode ends after this turn (task solved, or no further
            turn makes sense).
        info: free-form diagnostics (test verdicts, judge scores) kept in rollout logs.

    Raises:
        TypeError: ``texts`` is one string (it must hold one string per agent) or holds a
            non-string.
    """

    texts: tuple[str, ...]
    done: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.texts, str) or not all(isinstance(t, str) for t in self.texts):
            raise TypeError(
                f"Feedback.texts must be one string per agent (a tuple of str), got "
                f"{self.texts!r}; e.g. Feedback(texts=(text_for_agent_1, text_for_agent_2))."
            )


@dataclass(slots=True)
class TurnRecord:
    """Everything one turn of one example produced, for logging and for the update.

    Shapes use ``A`` agents, ``G`` completions per prompt and ``K`` joint actions
    (``K = G`` for ``joint_mode="align"``, ``K = G**A`` for ``"cross"``).

    Attributes:
        example: the task example (one dataset row) this turn belongs to.
        turn: turn index, 0-based.
        prompts: ``A`` prompts, one per agent: ``str`` or :class:`~comlrl.core.ChatPrompt`
            (see :mod:`comlrl.core.prompts`).
        completions: ``A`` lists of ``G`` completions.
        joint_actions: the ``K`` joint actions that were scored.
        rewards: ``K`` joint rewards (float, task units; typically in ``[0, 1]``).
        infos: ``K`` per-joint-action diagnostics from the reward function (may be empty).
        returns: ``A`` lists of ``G`` per-completion returns, filled by the trainer.
        advantages: ``A`` lists of ``G`` per-completion advantages, filled by the trainer.
    """

    example: Mapping[str, Any]
    turn: int
    prompts: Sequence[Prompt]
    completions: Sequence[Sequence[Completion]]
    joint_actions: Sequence[JointAction]
    rewards: Sequence[float]
    infos: Sequence[Mapping[str, Any]] = ()
    returns: Sequence[Sequence[float]] | None = None
    advantages: Sequence[Sequence[float]] | None = None
