"""CoMLRL 1.4.3's REINFORCE-family trainers (``comlrl.trainers.reinforce``) on
:mod:`comlrl.algos.recipes.group_baseline.recipe`.

:class:`MAGRPOTrainer` (group-mean baseline; Shao et al. 2024 GRPO, Liu et al. 2025
Dr. GRPO), :class:`MARLOOTrainer` (leave-one-out baseline; Kool et al. 2019, Ahmadian et
al. 2024), :class:`MAReMaxTrainer` (group-max baseline, after Li et al. 2023 ReMax) and
:class:`MAREINFORCETrainer` (no baseline; Williams 1992) take CoMLRL 1.4.3's arguments and
config dataclasses with its defaults. The loss is ``-A_g * sum_t log pi(a_gt | h)`` per
completion (tokens after EOS masked), averaged over completions (``seq_sum``: divided by
the constant ``max_new_tokens``, which AdamW's scale invariance makes immaterial).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from comlrl.trainers._base import (
    ADVANTAGE_MODES,
    JOINT_MODES,
    CompatTrainer,
    UnsupportedFieldError,
    check_config_fields,
    common_train_config,
)
from comlrl.trainers._epochs143 import MAGRPOEpochs143
from comlrl.trainers._kl_hooks143 import ReferenceKLHooks143
from comlrl.trainers._resume143 import Resume143
from comlrl.trainers.reinforce._hooks143 import MAGRPOHooks143

# 1.4.3's tests replace this module's reference_kl_for_sequence (see _kl_hooks143)
from comlrl.utils.reference_kl import reference_kl_for_sequence  # noqa: F401

__all__ = [
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
]


#: pre-1.4.3 ``MAGRPOConfig`` fields (CoMLRL 1.2's config on ``transformers``'
#: ``TrainingArguments``, used by CoMLRL's README and "Quick Demo") -> their 1.4.3 fields.
#: ``per_device_train_batch_size`` was the number of examples per optimizer step (1.2
#: required 1), which is ``rollout_buffer_size`` in single-turn 1.4.3 runs.
LEGACY_CONFIG_FIELDS = {
    "learning_rate": "agent_learning_rate",
    "per_device_train_batch_size": "rollout_buffer_size",
    "termination_threshold": "early_termination_threshold",
}
#: pre-1.4.3 fields without a 1.4.3 counterpart -> what to do instead
_LEGACY_WITHOUT_COUNTERPART = {
    "output_dir": "pass the folder to trainer.save_model(output_dir) after train()",
}

_Config = TypeVar("_Config", bound=type)


def accepts_legacy_fields(cls: _Config) -> _Config:
    """Let the config dataclass ``cls`` take the pre-1.4.3 field names of
    :data:`LEGACY_CONFIG_FIELDS` (each with a ``DeprecationWarning`` naming its 1.4.3
    field); a pre-1.4.3 field without a counterpart raises :class:`UnsupportedFieldError`.

    Raises:
        TypeError: (when building) a legacy name and its 1.4.3 name are both given.
    """
    init: Callable[..., None] = getattr(cls, "__init__")  # noqa: B009 (mypy: see setattr)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for old, what in _LEGACY_WITHOUT_COUNTERPART.items():
            if old in kwargs:
                raise UnsupportedFieldError(
                    f"{cls.__name__}({old}=...) is a pre-1.4.3 field with no CoMLRL 1.4.3 "
                    f"counterpart; {what}."
                )
        for old, new in LEGACY_CONFIG_FIELDS.items():
            if old not in kwargs:
                continue
            if new in kwargs:
                raise TypeError(
                    f"{cls.__name__} got {old}= (its pre-1.4.3 name) and {new}=; pass {new}= only."
                )
            warnings.warn(
                f"{cls.__name__}({old}=...) is CoMLRL's pre-1.4.3 name; use {new}=.",
                DeprecationWarning,
                stacklevel=2,
            )
            kwargs[new] = kwargs.pop(old)
        init(self, *args, **kwargs)

    setattr(cls, "__init__", __init__)  # noqa: B010 (mypy rejects assigning a method)
    return cls


@accepts_legacy_fields
@dataclass
class MAGRPOConfig:
    """CoMLRL 1.4.3's ``MAGRPOConfig``: the same fields and defaults.

    Units: ``agent_learning_rate`` per optimizer step; ``num_train_epochs`` passes over the
    training set; ``max_new_tokens`` in tokens; ``eval_interval`` and ``eval_num_samples``
    in training / evaluation examples; ``train_batch_size`` (default ``rollout_buffer_size``):
    examples rolled out per step; single-turn each step is one optimizer step, multi-turn
    one per turn of each ``rollout_buffer_size`` tree nodes, as in 1.4.3.
    ``advantage_mode``: ``mean`` | ``raw`` | ``max`` | ``rloo``.
    ``advantage_normalization`` divides advantages by the group's std of returns
    (population std, eps 1e-6) without re-centring them. The defaults ``num_turns=2`` and
    ``early_termination_threshold=-0.2`` (1.4.3's) end every episode after turn 1 when no
    node's mean reward is below -0.2 (e.g. rewards in [0, 1]): turn 2 never runs and each
    return is the held ``r * (1 + discount)`` (the run warns; docs/compat.md). Set the
    threshold to None, or above the reward of unfinished work, to train turn 2. Fields that
    ``comlrl.trainers`` cannot honour raise :class:`UnsupportedFieldError` when the trainer
    is built (``parallel_training='mp'``, several ``agent_devices``,
    ``reference_devices``).

    Raises:
        ValueError: a count below its minimum, or an unknown ``advantage_mode`` /
            ``joint_mode``.
    """

    num_train_epochs: int = 20
    agent_learning_rate: float = 5.0e-6
    logging_steps: int = 50
    num_agents: int = 2
    parallel_training: str = "none"
    agent_devices: str | Sequence[str] | None = None
    num_generations: int = 4
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = 50
    num_turns: int = 2
    discount: float = 1.0
    joint_mode: str = "aligned"
    early_termination_threshold: float | None = -0.2
    external_prompt_passthrough: bool = False
    eval_interval: int = 16
    eval_num_samples: int = 4
    eval_batch_size: int = 1
    rollout_buffer_size: int = 2
    train_batch_size: int | None = None
    advantage_normalization: bool = True
    advantage_mode: str = "mean"
    reference_kl_enabled: bool = False
    reference_kl_coef: float = 0.1
    reference_devices: str | Sequence[str] | None = None

    def __post_init__(self) -> None:
        minimums = {
            "num_train_epochs": 1,
            "num_agents": 1,
            "num_generations": 2,
            "rollout_buffer_size": 1,
            "eval_interval": 0,
            "eval_num_samples": 0,
            "eval_batch_size": 1,
            "num_turns": 1,
            "logging_steps": 1,
        }
        for name, low in minimums.items():
            if getattr(self, name) < low:
                hint = (
                    " (a group baseline needs several samples)" if name == "num_generations" else ""
                )
                raise ValueError(f"{name} must be >= {low}{hint}, got {getattr(self, name)!r}")
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        if self.train_batch_size < 1:
            raise ValueError(f"train_batch_size must be >= 1, got {self.train_batch_size!r}")
        if str(self.advantage_mode).lower() not in ADVANTAGE_MODES:
            raise ValueError(
                f"advantage_mode={self.advantage_mode!r}; use one of {sorted(ADVANTAGE_MODES)}"
            )
        if str(self.joint_mode).lower() not in JOINT_MODES:
            raise ValueError(f"joint_mode={self.joint_mode!r}; use 'aligned' or 'cross'")
        check_config_fields(self)


@accepts_legacy_fields
@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """:class:`MAGRPOConfig` with ``advantage_mode="raw"`` (no baseline)."""

    advantage_mode: str = "raw"


@accepts_legacy_fields
@dataclass
class MARLOOConfig(MAGRPOConfig):
    """:class:`MAGRPOConfig` with ``advantage_mode="rloo"`` (leave-one-out baseline)."""

    advantage_mode: str = "rloo"


@accepts_legacy_fields
@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """:class:`MAGRPOConfig` with ``advantage_mode="max"`` (group-max baseline)."""

    advantage_mode: str = "max"


#: The PPO clip of the multi-turn schedule's later, off-policy optimizer steps (PPO's 0.2).
MULTI_TURN_CLIP_RATIO = 0.2


def advantage_scale(estimator: str, normalization: bool) -> str:
    """Our ``advantage_scale`` for CoMLRL's ``advantage_normalization``.

    ``"group"`` (divide by the group's population std of returns plus 1e-6, no
    re-centring) for the estimators with a baseline. ``reinforce`` (``advantage_mode="raw"``)
    has no baseline, so a zero-variance group would get ``r / 1e-6`` (``[1, 1, 1, 1] ->
    [1e6] * 4``, with no gradient clipping); CoMLRL 1.4.3 z-scores there, which gives 0 but
    turns MAREINFORCE into MAGRPO. Here ``raw`` is never scaled: its advantage is the return
    (docs/compat.md, "Differences").
    """
    if not normalization or estimator == "reinforce":
        return "none"
    return "group"


def group_baseline_config(
    args: MAGRPOConfig, num_agents: int, num_examples: int, has_eval: bool
) -> dict[str, Any]:
    """The :class:`comlrl.algos.TrainConfig` fields for a CoMLRL REINFORCE-family config.

    Multi-turn (``num_turns > 1``) updates follow 1.4.3's schedule: each step's tree nodes
    in 1.4.3's buffer order, one optimizer step per turn of each ``rollout_buffer_size``
    nodes, later ones with their importance ratio, PPO-clipped at
    :data:`MULTI_TURN_CLIP_RATIO` (``update_chunk_nodes``,
    :mod:`comlrl.algos.training.node_chunks`); single-turn, one step per
    ``train_batch_size`` examples is already 1.4.3's count."""
    fields = common_train_config(args, num_agents, num_examples, has_eval)
    estimator = ADVANTAGE_MODES[str(args.advantage_mode).lower()]
    fields.update(
        num_generations=int(args.num_generations),
        joint_mode=JOINT_MODES[str(args.joint_mode).lower()],
        estimator=estimator,
        advantage_scale=advantage_scale(estimator, bool(args.advantage_normalization)),
        loss_reduction="seq_sum",
        clip_ratio=None,
    )
    if int(args.num_turns) > 1:  # 1.4.3: one step per turn of each rollout_buffer_size nodes
        # later steps are off-policy; their importance ratio is PPO-clipped (1.4.3 drops the
        # ratio; unclipped it is unbounded: 20.7 measured with AdamW 1e-3)
        fields.update(
            update_chunk_nodes=int(args.rollout_buffer_size),
            update_chunk_split_turns=True,
            clip_ratio=MULTI_TURN_CLIP_RATIO,
        )
    return fields


class MAGRPOTrainer(MAGRPOEpochs143, Resume143, MAGRPOHooks143, ReferenceKLHooks143, CompatTrainer):
    """CoMLRL 1.4.3's ``MAGRPOTrainer`` arguments, trained by
    :mod:`comlrl.algos.recipes.group_baseline.recipe`.

    Args:
        agent_model: a model name/path; ``num_agents`` independent copies are loaded.
        agents: instead, ``A`` models (names/paths or ``transformers`` model objects).
        num_agents: ``A`` with ``agent_model`` (``args.num_agents`` is not read, as in
            CoMLRL 1.4.3).
        tokenizer: one tokenizer, one per agent, or None (loaded from the names).
        model_config: ``torch_dtype``/``dtype``, ``attn_implementation``,
            ``special_tokens``, nested ``model_kwargs``.
        train_dataset, eval_dataset: ``datasets.Dataset`` or lists of dicts.
        reward_func: any form listed in :class:`comlrl.trainers._callbacks.CompatReward`;
            it must return finite numbers.
        reward_processor: ``float -> float`` applied to every reward.
        formatters: None (``example["prompt"]``), one callable, or one per agent; a
            formatter with an ``external_prompts`` parameter receives later turns' prompts.
        external_transition: ``external_transition(prompt=, agent_completions=,
            num_agents=, prompt_history_per_agent=, response_history_per_agent=)`` -> ``A``
            prompts; required when ``args.num_turns > 1``.
        wandb_config: ``project``, ``entity``, ``name``, ``dir``, ``tags``,
            ``config_sections`` (``output.verbose`` turns the progress bar off).
        eval_logger, eval_aggregator: see :meth:`evaluate`.
        args: a :class:`MAGRPOConfig` (default: its defaults).
        model: CoMLRL's pre-1.4.3 name of ``agent_model`` (a ``DeprecationWarning``).
        dataset_type: pre-1.4.3, no 1.4.3 counterpart: raises when given.

    Raises:
        UnsupportedFieldError: a config value this package does not implement.
        ValueError, TypeError: missing or malformed arguments (named in the message).
        comlrl.algos.ConfigError: the translated config is inconsistent.
    """

    config_cls: type = MAGRPOConfig
    #: any REINFORCE-family config works; its advantage_mode picks the baseline (as in 1.4.3)
    accepted_config: type = MAGRPOConfig
    algorithm_name = "MAGRPO"
    _checkpoint_kind = "magrpo"  # train(checkpoint_dir=...) writes resumable checkpoints

    def __init__(
        self,
        agent_model: Any = None,
        agents: Sequence[Any] | None = None,
        num_agents: int = 2,
        tokenizer: Any = None,
        model_config: dict[str, Any] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Any = None,
        external_transition: Callable[..., Sequence[str]] | None = None,
        wandb_config: dict[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., Any] | None = None,
        args: Any = None,
        *,
        model: Any = None,
        dataset_type: str | None = None,
    ) -> None:
        from comlrl.algos.recipes.group_baseline import recipe as group_baseline
        from comlrl.algos.training.config import TrainConfig

        if dataset_type is not None:
            raise UnsupportedFieldError(
                f"MAGRPOTrainer(dataset_type={dataset_type!r}) is a pre-1.4.3 argument with no "
                "1.4.3 counterpart; remove it (the reward_func and formatters define the task)."
            )
        if model is not None:
            if agent_model is not None:
                raise TypeError(
                    "MAGRPOTrainer got model= (its pre-1.4.3 name) and agent_model=; pass "
                    "agent_model= only."
                )
            warnings.warn(
                "MAGRPOTrainer(model=...) is CoMLRL's pre-1.4.3 name; use agent_model=.",
                DeprecationWarning,
                stacklevel=2,
            )
            agent_model = model
        self._init_common(
            args=args,
            agent_model=agent_model,
            agents=agents,
            num_agents=num_agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            wandb_config=wandb_config,
        )
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        mode = str(self.args.advantage_mode).lower()
        if mode not in ADVANTAGE_MODES:
            raise UnsupportedFieldError(f"advantage_mode={self.args.advantage_mode!r}")
        self.advantage_mode: str = mode
        fields = group_baseline_config(
            self.args, self.num_agents, len(self._train_rows), self._eval_rows is not None
        )
        config = self._our_config(TrainConfig, fields)
        self._defer_run(
            lambda: group_baseline.setup(
                self._hf_agents(), config, self.env, self._train_rows, self._eval_rows
            )
        )

    def _train_step(self) -> dict[str, float]:
        from comlrl.algos.recipes.group_baseline import recipe as group_baseline

        return group_baseline.train_step(self._run)


class MAREINFORCETrainer(MAGRPOTrainer):
    """:class:`MAGRPOTrainer` with :class:`MAREINFORCEConfig`: advantage = return (no
    baseline; Williams 1992)."""

    config_cls = MAREINFORCEConfig
    algorithm_name = "MAREINFORCE"


class MARLOOTrainer(MAGRPOTrainer):
    """:class:`MAGRPOTrainer` with :class:`MARLOOConfig`: leave-one-out baseline
    ``b_g = mean of the other G-1 returns`` (Kool et al. 2019; Ahmadian et al. 2024)."""

    config_cls = MARLOOConfig
    algorithm_name = "MARLOO"


class MAReMaxTrainer(MAGRPOTrainer):
    """:class:`MAGRPOTrainer` with :class:`MAReMaxConfig`: baseline = the group's best
    return (after Li et al. 2023, ReMax)."""

    config_cls = MAReMaxConfig
    algorithm_name = "MAReMax"


from comlrl.trainers.reinforce.centralized_magrpo import (  # noqa: E402  (built on the classes above)
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
)
