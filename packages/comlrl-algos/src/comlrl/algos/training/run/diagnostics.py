"""Warnings for runs that cannot learn, said once and clearly instead of training silently.

- :func:`gspo_reduction_problem` (when the update's settings are made): GSPO's sequence-level
  ratio with a loss reduction that weighs completions by their length.
- :func:`warn_if_cannot_learn` (before the first step, from the recipe's ``setup``):
  ``learning_rate=0`` (a control run: the weights stay as loaded),
  ``num_generations=1`` with a group baseline (every advantage is 0), and prompts that
  with ``max_new_tokens`` do not fit the model's context (``max_position_embeddings``),
  with how many prompts are affected.
- :class:`LearningSignalWatch` (a reporter in the training loop): every joint action has
  earned the same reward for ``patience`` steps in a row, so group baselines give all-zero
  advantages and nothing is updated.
- :class:`EarlyEndWatch` (a reporter too): with ``num_turns > 1``, every episode ended
  after its first turn by ``early_termination_threshold`` for ``patience`` steps in a row
  (e.g. CoMLRL 1.4.3's defaults ``num_turns=2``, threshold ``-0.2``, with rewards that are
  never below it), so later turns never run and every return is the held first-turn reward.

Each warning is a :class:`TrainingWarning` (a ``UserWarning``), so
``warnings.filterwarnings("error", category=TrainingWarning)`` turns them into errors and
``"ignore"`` silences them.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.core.prompts import prompt_text

__all__ = [
    "TrainingWarning",
    "warn_training",
    "LearningSignalWatch",
    "EarlyEndWatch",
    "ContextOverflow",
    "context_length",
    "context_overflow",
    "group_size_problem",
    "gspo_reduction_problem",
    "warn_if_cannot_learn",
]

#: The most examples whose prompts :func:`warn_if_cannot_learn` tokenizes.
MAX_CHECKED_EXAMPLES = 2000


class TrainingWarning(UserWarning):
    """The run as configured will learn little or nothing; the message says why and what to do."""


def warn_training(message: str) -> None:
    """Warn with ``message`` as a :class:`TrainingWarning` (for the caller's caller)."""
    warnings.warn(message, TrainingWarning, stacklevel=3)


def group_size_problem(num_generations: int, estimator: str) -> str | None:
    """Why ``num_generations`` cannot give a learning signal with ``estimator``, or ``None``.

    With one completion per group, a group baseline (mean, leave-one-out, max) equals the
    completion's own return, so every advantage is 0. REINFORCE has no baseline.
    """
    if num_generations == 1 and estimator != "reinforce":
        return (
            f"num_generations=1 with estimator={estimator!r}: each group holds one completion, "
            "so its baseline equals its own return and every advantage is 0; the models will "
            "not change. Use num_generations >= 2 (e.g. 4), or estimator=reinforce."
        )
    return None


def gspo_reduction_problem(importance_level: str, loss_reduction: str) -> str | None:
    """Why ``importance_level="sequence"`` with ``loss_reduction`` is not GSPO's objective,
    or ``None`` (any reduction with token-level ratios; ``seq_mean_token_mean`` with GSPO's).

    GSPO (Zheng et al. 2025, arXiv 2507.18071, eq. 5) averages one clipped term per
    completion over the group. The loss gives that term to each of the completion's
    tokens, so ``seq_mean_token_mean`` is GSPO's mean over completions, while
    ``token_mean`` (and ``seq_sum``) weigh each completion by its number of tokens.
    """
    if importance_level != "sequence" or loss_reduction == "seq_mean_token_mean":
        return None
    return (
        f"importance_level=sequence (GSPO) with loss_reduction={loss_reduction}: each "
        "completion's sequence-level term is weighed by its length, which is not GSPO's "
        "objective (a mean over completions, Zheng et al. 2025 eq. 5). Set "
        "loss_reduction=seq_mean_token_mean (a pretrained model's default with "
        "importance_level=sequence) unless the length weighting is meant."
    )


def context_length(model: Any) -> int | None:
    """The model's context in tokens (``config.max_position_embeddings`` or GPT-2's
    ``n_positions``), or ``None`` when the config does not say."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class ContextOverflow:
    """Prompts of one agent that with ``max_new_tokens`` exceed its model's context.

    Attributes:
        agent: agent index.
        context: the model's context in tokens.
        count: prompts whose tokens + ``max_new_tokens`` exceed ``context``.
        checked: prompts checked.
        longest: tokens of the longest prompt.
        example_indices: indices (into the checked examples) of the affected prompts.
    """

    agent: int
    context: int
    count: int
    checked: int
    longest: int
    example_indices: tuple[int, ...]


def context_overflow(
    prompts: Sequence[str], tokenizer: Any, context: int, max_new_tokens: int, agent: int = 0
) -> ContextOverflow:
    """Count the ``prompts`` whose token count plus ``max_new_tokens`` exceeds ``context``."""
    lengths = [len(ids) for ids in tokenizer(list(prompts))["input_ids"]] if prompts else []
    over = tuple(i for i, n in enumerate(lengths) if n + max_new_tokens > context)
    return ContextOverflow(
        agent=agent,
        context=context,
        count=len(over),
        checked=len(lengths),
        longest=max(lengths, default=0),
        example_indices=over,
    )


def _high_learning_rate(config: Any, agents: Sequence[Any]) -> str | None:
    """:func:`~comlrl.algos.training.config.model_defaults.learning_rate_warning` for the models
    the agents really hold (a Python run may hand pretrained agents to a config that names
    the built-in model); models built in memory without a name are not judged."""
    from comlrl.algos.training.config.model_defaults import learning_rate_warning
    from comlrl.algos.training.run.lifecycle import IN_MEMORY, agent_model_names

    learning_rate = getattr(config, "learning_rate", None)
    model_for = getattr(config, "model_for", None)
    if learning_rate is None or model_for is None:
        return None
    names = [n for n in agent_model_names(agents, model_for) if not n.endswith(IN_MEMORY)]
    return learning_rate_warning(names, float(learning_rate))


def warn_if_cannot_learn(
    config: Any,
    agents: Sequence[Any],
    env: Any,
    dataset: Sequence[Mapping[str, Any]],
    *,
    group_baseline: bool = True,
) -> list[str]:
    """Warn (:class:`TrainingWarning`) about settings that stop a run from learning.

    Checks ``config.learning_rate`` (0: a control run whose weights stay as loaded; 1e-4
    or more on an agent holding a pretrained model: :mod:`comlrl.algos.training.config.model_defaults`),
    ``config.num_generations`` against ``config.estimator``
    (:func:`group_size_problem`; only with ``group_baseline``: a recipe whose baseline
    is a critic, IAC/MAAC, does not use the estimator), and the turn-0 prompts of the first
    :data:`MAX_CHECKED_EXAMPLES` examples against each agent's context (agents without a
    ``tokenizer`` or a context length are skipped).

    Returns:
        The warning messages (empty when all is well).
    """
    messages = []
    high = _high_learning_rate(config, agents)
    if high is not None:
        messages.append(high)
    if getattr(config, "learning_rate", None) == 0:
        messages.append(
            "learning_rate=0: a control run; every rollout and update runs but the weights "
            "stay as loaded, so the reward can only change by sampling noise."
        )
    problem = (
        group_size_problem(config.num_generations, config.estimator) if group_baseline else None
    )
    if problem is not None:
        messages.append(problem)
    examples = [dataset[i] for i in range(min(len(dataset), MAX_CHECKED_EXAMPLES))]
    found: list[ContextOverflow] = []
    if examples:
        roots = None
        for a, agent in enumerate(agents):
            tokenizer = getattr(agent, "tokenizer", None)
            context = context_length(getattr(agent, "model", None))
            if not callable(tokenizer) or context is None:  # nothing to count the tokens with
                continue
            if roots is None:
                roots = [env.root(ex).prompts for ex in examples]
            # the text the model sees (chat template or plain text), as the agent renders it
            render = getattr(agent, "render", None)
            prompts = [p[a] for p in roots]
            texts = render(prompts) if callable(render) else [prompt_text(p) for p in prompts]
            result = context_overflow(texts, tokenizer, context, config.max_new_tokens, agent=a)
            if result.count:
                found.append(result)
    if found:
        affected = set().union(*(set(r.example_indices) for r in found))
        per_agent = ", ".join(
            f"agent {r.agent}: {r.count} (longest prompt {r.longest} tokens)" for r in found
        )
        context = min(r.context for r in found)
        messages.append(
            f"{len(affected)} of {len(examples)} prompts do not fit the model's context of "
            f"{context} tokens with max_new_tokens={config.max_new_tokens} ({per_agent}); "
            "their completions are cut short or come from positions the model never saw. "
            "Use a model with a longer context, lower max_new_tokens, or a task with shorter "
            "prompts (e.g. the default coop_story for builtin:stories260k)."
        )
    for message in messages:
        warn_training(message)
    return messages


class LearningSignalWatch:
    """Warn once when every joint action earned the same reward ``patience`` steps in a row.

    A step counts when every ``turn_<t>/reward_std`` (or ``reward_std``) in its metrics row
    is 0. The watch has the reporter interface (``log(row)``, ``close()``).

    Args:
        patience: consecutive zero-variance steps before the warning.
    """

    def __init__(self, patience: int = 10) -> None:
        self.patience = patience
        self.run_length = 0
        self.warned = False

    def log(self, row: Mapping[str, Any]) -> None:
        stds = [float(v) for k, v in row.items() if k.endswith("reward_std")]
        if stds and all(s == 0.0 for s in stds):
            self.run_length += 1
        else:
            self.run_length = 0
        if self.run_length >= self.patience and not self.warned:
            self.warned = True
            warn_training(
                f"every joint action has earned the same reward ({row.get('reward_mean')}) for "
                f"{self.run_length} steps in a row (steps {int(row['step']) - self.run_length + 1}"
                f"-{int(row['step'])}): group baselines give all-zero advantages, so the models "
                "are not being updated. Look at samples.jsonl: the reward may be saturated or "
                "impossible for this model, or the completions may all be empty; raise "
                "temperature or num_generations, or give the reward partial credit."
            )

    def close(self) -> None:
        return None


class EarlyEndWatch:
    """Warn once when ``early_termination_threshold`` ends every episode after its first
    turn ``patience`` steps in a row, in a run of ``num_turns > 1``.

    A step counts when its metrics row has no turn-1 nodes (no ``turn_1/num_nodes``, or 0).
    Such a run is single-turn training in effect, and each first-turn reward is *held* for
    the skipped turns (:func:`comlrl.estimators.returns.tree_returns`): its return is
    ``r * (1 + gamma + ... + gamma^(T-1))``, ``2 r`` for CoMLRL 1.4.3's defaults
    (``num_turns=2``, ``discount=1``). Group std scaling cancels that factor; unscaled
    advantages (``advantage_scale=none``, REINFORCE) are multiplied by it. The watch has
    the reporter interface (``log(row)``, ``close()``).

    Args:
        num_turns: the run's turn limit ``T``.
        threshold: its ``early_termination_threshold`` (None: the watch never warns).
        gamma: its discount, for the factor the message states.
        patience: consecutive such steps before the warning.
    """

    def __init__(
        self, num_turns: int, threshold: float | None, gamma: float = 1.0, patience: int = 3
    ) -> None:
        self.num_turns = num_turns
        self.threshold = threshold
        self.gamma = gamma
        self.patience = patience
        self.run_length = 0
        self.warned = False

    def log(self, row: Mapping[str, Any]) -> None:
        if self.num_turns < 2 or self.threshold is None or self.warned:
            return
        later = float(row.get("turn_1/num_nodes", 0.0))
        self.run_length = self.run_length + 1 if later == 0 else 0
        if self.run_length < self.patience:
            return
        self.warned = True
        factor = sum(self.gamma**k for k in range(self.num_turns))
        warn_training(
            f"early_termination_threshold={self.threshold} ended every episode after its first "
            f"turn for {self.run_length} steps in a row (num_turns={self.num_turns}): the later "
            "turns never ran, and each first-turn reward is held for the skipped turns, so "
            f"every return is {factor:g} x the reward (group std scaling cancels the factor; "
            "unscaled advantages are multiplied by it). An episode ends when its reward is "
            "above the threshold; if the rewards are never below it (e.g. pass rates >= 0), "
            "raise it above the reward of unfinished work (e.g. 0.99 for a pass rate) or set "
            "it to None to run every turn."
        )

    def close(self) -> None:
        return None
