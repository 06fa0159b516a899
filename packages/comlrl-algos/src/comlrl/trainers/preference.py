"""CoMLRL 1.4.3's preference trainers (``comlrl.trainers.preference``).

:class:`MADPOTrainer` runs :func:`comlrl.algos.recipes.preference.madpo_step`: per
prompt, ``preference_num_candidates`` joint actions are sampled and scored by the
reward, pairs are formed by reward gap (largest first, ``preference_pairs_per_sample``
kept) and every agent takes a step on its own term of the joint DPO loss (Rafailov et
al. 2023, eq. 7, with the joint log-ratio summed over agents) against a frozen reference.

:class:`MARLHFTrainer` is not available through this layer (its CoMLRL 1.4.3 pipeline —
offline reward-model training on a device of its own, then an RL trainer picked by
``rl_algorithm`` — has no one-to-one counterpart here); building one raises
:class:`~comlrl.trainers._base.UnsupportedFieldError` naming
:class:`comlrl.algos.MARLHFTrainer`, which runs MARLHF with its own arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.algos.recipes.preference import JointRewardModel  # ours (docs/compat.md)
from comlrl.trainers._base import JOINT_MODES, CompatTrainer, UnsupportedFieldError, _reject

__all__ = ["MADPOConfig", "MADPOTrainer", "MARLHFConfig", "MARLHFTrainer", "JointRewardModel"]


@dataclass
class MADPOConfig:
    """CoMLRL 1.4.3's ``MADPOConfig``: the same fields and defaults.

    Units as :class:`comlrl.trainers.reinforce.MAGRPOConfig`. Supported here:
    ``collaboration_mode="decentralized"``, ``pair_selection="reward_gap"``,
    ``num_turns=1``; other values raise :class:`UnsupportedFieldError` when the trainer is
    built. ``use_environment_step`` / ``environment_steps_per_pair`` only count logging
    steps in CoMLRL and are accepted. Fields shared with the MAGRPO config that MADPO does
    not use (``advantage_*``, ``discount``, ``early_termination_threshold``, ...) are
    accepted and ignored, as in CoMLRL 1.4.3.

    Raises:
        ValueError: a count below its minimum or an unknown ``pair_selection``.
    """

    num_train_epochs: int = 20
    agent_learning_rate: float = 5.0e-6
    logging_steps: int = 50
    num_agents: int = 2
    collaboration_mode: str = "decentralized"
    parallel_training: str = "none"
    agent_devices: str | Sequence[str] | None = None
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = 50
    num_turns: int = 1
    discount: float = 1.0
    joint_mode: str = "aligned"
    early_termination_threshold: float | None = None
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
    preference_num_candidates: int = 80
    preference_pairs_per_sample: int | None = 16
    pair_selection: str = "reward_gap"
    dpo_beta: float = 0.1
    use_environment_step: bool = True
    environment_steps_per_pair: int = 2

    def __post_init__(self) -> None:
        for name, low in (
            ("num_train_epochs", 1),
            ("num_agents", 1),
            ("rollout_buffer_size", 1),
            ("eval_batch_size", 1),
            ("num_turns", 1),
            ("logging_steps", 1),
            ("preference_num_candidates", 2),
            ("environment_steps_per_pair", 1),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)!r}")
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        if self.preference_pairs_per_sample is not None and self.preference_pairs_per_sample < 1:
            raise ValueError(
                f"preference_pairs_per_sample must be >= 1 or None, got {self.preference_pairs_per_sample!r}"
            )
        if self.dpo_beta <= 0:
            raise ValueError(f"dpo_beta must be > 0, got {self.dpo_beta!r}")
        self.pair_selection = str(self.pair_selection or "reward_gap").strip().lower()
        if self.pair_selection not in ("reward_gap", "all", "random"):
            raise ValueError(
                f"pair_selection={self.pair_selection!r}; use 'reward_gap', 'all' or 'random'"
            )


@dataclass
class MARLHFConfig(MADPOConfig):
    """CoMLRL 1.4.3's ``MARLHFConfig`` fields and defaults (for scripts that build one;
    :class:`MARLHFTrainer` is not available through this layer)."""

    rl_algorithm: str = "magrpo"
    num_generations: int = 4
    reward_model_name: str | None = None
    reward_model_device: str | None = "cuda:0"
    reward_learning_rate: float = 1.0e-5
    reward_num_train_epochs: int = 1
    reward_train_batch_size: int = 1
    reward_max_length: int | None = None
    reward_freeze_backbone: bool = False
    critic_model_name: str | None = None
    critic_learning_rate: float | None = None
    critic_devices: str | Sequence[str] | None = None
    use_separate_critic: bool = True
    critic_type: str = "v"
    value_loss_coef: float = 0.6
    value_clip_range: float | None = 0.2
    critic_value_head_hidden_dim: int | None = None
    value_head_hidden_dim: int | None = None


class MADPOTrainer(CompatTrainer):
    """CoMLRL 1.4.3's ``MADPOTrainer`` arguments, trained by
    :func:`comlrl.algos.recipes.preference.madpo_step` (see the module docstring).

    Args:
        agent_model, agents, num_agents, tokenizer, model_config, train_dataset,
            eval_dataset, reward_func, reward_processor, formatters, wandb_config,
            eval_logger, eval_aggregator: as :class:`comlrl.trainers.reinforce.MAGRPOTrainer`.
        external_transition: must be None (single-turn only here).
        args: a :class:`MADPOConfig`.
        centralized_comparator_adapter: not supported (raises when given).

    Raises:
        UnsupportedFieldError: a config value or argument this package does not implement.
        ValueError, TypeError: missing or malformed arguments (named in the message).
    """

    config_cls: type = MADPOConfig
    algorithm_name = "MADPO"

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
        centralized_comparator_adapter: Any = None,
    ) -> None:
        import math

        from comlrl.algos.recipes import preference
        from comlrl.trainers._base import _device

        cfg = args if args is not None else MADPOConfig()
        if isinstance(cfg, MADPOConfig):
            _reject(
                cfg,
                "collaboration_mode",
                cfg.collaboration_mode == "decentralized",
                "only decentralized MADPO is implemented; set collaboration_mode='decentralized'.",
            )
            _reject(
                cfg,
                "pair_selection",
                cfg.pair_selection == "reward_gap",
                "pairs are chosen by the largest reward gap; set pair_selection='reward_gap'.",
            )
            _reject(
                cfg, "num_turns", cfg.num_turns == 1, "MADPO is single-turn here; set num_turns=1."
            )
            _reject(
                cfg,
                "reference_kl_enabled",
                not cfg.reference_kl_enabled,
                "DPO already regularises towards the reference; set reference_kl_enabled=False.",
            )
        if centralized_comparator_adapter is not None:
            raise UnsupportedFieldError(
                "centralized_comparator_adapter is not supported by comlrl.trainers (no "
                "centralized collaboration mode)."
            )
        self._init_common(
            args=cfg,
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
        a = self.args
        k = int(a.preference_num_candidates)
        batch = int(a.train_batch_size or a.rollout_buffer_size)
        fields = {
            "num_agents": self.num_agents,
            "num_candidates": k,
            "max_new_tokens": int(a.max_new_tokens),
            "temperature": float(a.temperature),
            "top_p": float(a.top_p),
            "top_k": int(a.top_k or 0),
            "joint_mode": JOINT_MODES[str(a.joint_mode).lower()],
            "pairs_per_prompt": int(a.preference_pairs_per_sample or k * (k - 1) // 2),
            "beta": float(a.dpo_beta),
            "learning_rate": float(a.agent_learning_rate),
            "optimizer": "adamw",
            "weight_decay": 0.01,
            "max_grad_norm": None,
            "batch_size": batch,
            "num_steps": max(1, math.ceil(int(a.num_train_epochs) * len(self._train_rows) / batch)),
            "device": _device(a),
        }
        from comlrl.algos.config import ConfigError
        from pydantic import ValidationError

        try:
            config = preference.MADPOConfig(**fields)
        except ValidationError as exc:
            raise ConfigError(f"MADPOConfig does not translate:\n{exc}") from None
        self._run = preference.madpo_setup(
            self._hf_agents(), config, self.env, self._train_rows, None
        )
        self._eval_every = (
            max(1, math.ceil(int(a.eval_interval) / batch))
            if self._eval_rows is not None and a.eval_interval > 0 and a.eval_num_samples > 0
            else 0
        )

    def _train_step(self) -> dict[str, float]:
        from comlrl.algos.recipes import preference

        return preference.madpo_step(self._run)


class MARLHFTrainer:
    """Not available through the CoMLRL 1.4.3 layer; use :class:`comlrl.algos.MARLHFTrainer`.

    Raises:
        UnsupportedFieldError: always, naming the replacement.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedFieldError(
            "comlrl.trainers.MARLHFTrainer (CoMLRL 1.4.3's reward-model-then-RL pipeline) is "
            "not provided by this compatibility layer; use comlrl.algos.MARLHFTrainer "
            "(collect_pairs -> train_reward_model -> rl_trainer) with its own arguments."
        )
