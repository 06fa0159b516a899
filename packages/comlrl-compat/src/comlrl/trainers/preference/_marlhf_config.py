"""CoMLRL 1.4.3's ``MARLHFConfig`` (re-exported by
:mod:`comlrl.trainers.preference.marlhf`, its 1.4.3 module path), the MARLHF settings this
package refuses, and the IAC/MAAC fields a MARLHF config passes on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.trainers._fields import JOINT_MODES, _reject
from comlrl.trainers.preference.madpo import MADPOConfig

__all__ = ["RL_ALGORITHMS", "MARLHFConfig"]


#: CoMLRL 1.4.3's ``rl_algorithm`` names (and its one alias) -> the MAGRPO family's
#: ``advantage_mode``; ``iac`` / ``maac`` run the actor-critic trainers.
RL_ALGORITHMS = {"magrpo": "mean", "mareinforce": "raw", "maremax": "max", "marloo": "rloo"}
_RL_ALIASES = {"mareforce": "mareinforce"}
_ACTOR_CRITIC = ("iac", "maac")


@dataclass
class MARLHFConfig(MADPOConfig):
    """CoMLRL 1.4.3's ``MARLHFConfig``: :class:`MADPOConfig`'s fields plus the reward-model
    and RL-stage fields, with its defaults.

    ``rl_algorithm``: ``magrpo`` | ``mareinforce`` (alias ``mareforce``) | ``maremax`` |
    ``marloo`` (the MAGRPO family: sets ``advantage_mode``, as 1.4.3 does) | ``iac`` |
    ``maac``. Reward model: ``reward_model_name`` (None: the agents' model),
    ``reward_model_device`` (None: the agents' device), ``reward_learning_rate`` (per
    AdamW step), ``reward_num_train_epochs`` (passes over the pairs),
    ``reward_train_batch_size`` (pairs per step), ``reward_max_length`` (tokens of each
    joint text; None: no limit), ``reward_freeze_backbone`` (train the head only). The
    critic fields are read by ``iac`` / ``maac`` as in
    :class:`comlrl.trainers.actor_critic.IACConfig`.

    Raises:
        ValueError: as :class:`MADPOConfig`, an unknown ``rl_algorithm`` or
            ``critic_type``, ``num_generations < 2`` for the MAGRPO family, or a
            non-positive learning rate, count or coefficient.
    """

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

    def _check_turns(self) -> None:
        """CoMLRL 1.4.3 builds a multi-turn MARLHFConfig and refuses it at ``train()``;
        MARLHFTrainer refuses it when built (before any model loads)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        algorithm = str(self.rl_algorithm or "magrpo").strip().lower()
        algorithm = _RL_ALIASES.get(algorithm, algorithm)
        if algorithm not in RL_ALGORITHMS and algorithm not in _ACTOR_CRITIC:
            raise ValueError(
                f"rl_algorithm={self.rl_algorithm!r}; use one of "
                f"{sorted([*RL_ALGORITHMS, *_ACTOR_CRITIC])}"
            )
        self.rl_algorithm = algorithm
        if algorithm in RL_ALGORITHMS:
            if self.num_generations < 2:
                raise ValueError(
                    f"num_generations must be >= 2 for rl_algorithm={algorithm!r} (a group "
                    f"baseline needs several samples), got {self.num_generations!r}"
                )
            self.advantage_mode = RL_ALGORITHMS[algorithm]
        elif self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {self.num_generations!r}")
        for name in ("reward_learning_rate", "value_loss_coef"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("reward_num_train_epochs", "reward_train_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("reward_max_length", "critic_learning_rate", "value_clip_range"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {value!r}")
        if self.reward_model_device is not None:
            self.reward_model_device = str(self.reward_model_device)
        self.critic_type = str(self.critic_type or "v").strip().lower()
        if self.critic_type not in ("v", "q"):
            raise ValueError(f"critic_type={self.critic_type!r}; use 'v' or 'q'")


#: ``reward_max_length=None``: keep every token of a joint text
_NO_LIMIT = 1 << 30


def _check_marlhf(cfg: MARLHFConfig) -> None:
    from comlrl.trainers.preference.iterative import MARLHFIterConfig  # defined on top of this one

    if isinstance(cfg, MARLHFIterConfig):
        from comlrl.trainers._iterative import check_iterative_supported

        check_iterative_supported(cfg)
        return
    _reject(cfg, "num_turns", cfg.num_turns == 1, "MARLHF is single-turn; set num_turns=1.")
    _reject(
        cfg,
        "pair_selection",
        cfg.pair_selection == "reward_gap",
        "pairs are chosen by the largest reward gap; set pair_selection='reward_gap'.",
    )
    _reject(
        cfg,
        "joint_mode",
        JOINT_MODES[str(cfg.joint_mode).lower()] == "align",
        "the reward model scores aligned joint actions (as in 1.4.3); set joint_mode='aligned'.",
    )


def _actor_critic_fields(a: MARLHFConfig, num_agents: int) -> dict[str, Any]:
    """The IAC/MAAC config fields a MARLHF config passes on (1.4.3's mapping)."""
    names = (
        "agent_learning_rate", "rollout_buffer_size", "train_batch_size", "value_loss_coef",
        "advantage_normalization", "max_new_tokens", "temperature", "top_p", "top_k",
        "num_train_epochs", "num_generations", "num_turns", "parallel_training",
        "agent_devices", "critic_devices", "external_prompt_passthrough", "discount",
        "critic_type", "early_termination_threshold", "eval_interval", "eval_num_samples",
        "eval_batch_size", "logging_steps", "reference_kl_enabled", "reference_kl_coef",
        "reference_devices",
    )  # fmt: skip
    fields = {n: getattr(a, n) for n in names}
    fields["critic_learning_rate"] = a.critic_learning_rate or a.agent_learning_rate
    fields["num_agents"] = num_agents
    return fields
