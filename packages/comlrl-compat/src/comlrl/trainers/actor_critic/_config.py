"""CoMLRL 1.4.3's ``IACConfig`` and ``MAACConfig`` (re-exported by
:mod:`comlrl.trainers.actor_critic` and its 1.4.3 module paths ``.iac`` / ``.maac``), with
1.4.3's fields, defaults and checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from comlrl.trainers._fields import check_config_fields

__all__ = ["IACConfig", "MAACConfig"]


def _check_ac(cfg: Any) -> None:
    if cfg.rollout_buffer_size < 1:
        raise ValueError(f"rollout_buffer_size must be >= 1, got {cfg.rollout_buffer_size!r}")
    if cfg.train_batch_size is None:
        cfg.train_batch_size = cfg.rollout_buffer_size
    for name in (
        "train_batch_size",
        "num_agents",
        "num_turns",
        "num_generations",
        "eval_batch_size",
        "logging_steps",
    ):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)!r}")
    for name in ("eval_interval", "eval_num_samples"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)!r}")
    if cfg.num_turns > 1 and cfg.num_generations != 1:
        raise ValueError(
            f"num_turns={cfg.num_turns} needs num_generations=1 (as in CoMLRL 1.4.3), got "
            f"{cfg.num_generations}"
        )
    cfg.critic_type = (cfg.critic_type or "v").lower()
    if cfg.critic_type not in ("v", "q"):
        raise ValueError(f"critic_type={cfg.critic_type!r}; use 'v' (V(h)) or 'q' (Q(h, a))")
    if cfg.critic_learning_rate is None:
        cfg.critic_learning_rate = cfg.agent_learning_rate
    check_config_fields(cfg, critic_devices=True)


@dataclass
class IACConfig:
    """CoMLRL 1.4.3's ``IACConfig``: the same fields and defaults.

    Units as :class:`comlrl.trainers.reinforce.MAGRPOConfig`; ``value_clip_range`` in
    reward units; ``critic_learning_rate`` None = ``agent_learning_rate``. With
    ``use_separate_critic=False`` the value head sits on the agent's model
    (``value_head_hidden_dim``); otherwise each agent has a critic model
    (``critic_value_head_hidden_dim``).

    Raises:
        ValueError: a count below its minimum, ``num_turns > 1`` with
            ``num_generations != 1``, or an unknown ``critic_type``.
    """

    agent_learning_rate: float = 5e-6
    critic_learning_rate: float | None = 5e-6
    rollout_buffer_size: int = 8
    train_batch_size: int | None = None
    value_clip_range: float | None = 0.2
    value_loss_coef: float = 0.6
    advantage_normalization: bool = True
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = None
    num_train_epochs: int = 40
    use_separate_critic: bool = True
    critic_type: str = "v"
    critic_value_head_hidden_dim: int | None = None
    value_head_hidden_dim: int | None = None
    num_agents: int = 2
    num_turns: int = 2
    parallel_training: str = "none"
    agent_devices: str | Sequence[str] | None = None
    critic_devices: str | Sequence[str] | None = None
    external_prompt_passthrough: bool = False
    discount: float = 1.0
    num_generations: int = 1
    eval_interval: int = 16
    eval_num_samples: int = 4
    eval_batch_size: int = 1
    early_termination_threshold: float | None = -0.2
    logging_steps: int = 1
    reference_kl_enabled: bool = False
    reference_kl_coef: float = 0.1
    reference_devices: str | Sequence[str] | None = None

    def __post_init__(self) -> None:
        _check_ac(self)


@dataclass
class MAACConfig:
    """CoMLRL 1.4.3's ``MAACConfig``: the same fields and defaults (one centralised
    critic; units as :class:`IACConfig`).

    Raises:
        ValueError: as :class:`IACConfig`.
    """

    agent_learning_rate: float = 5e-6
    critic_learning_rate: float = 5e-6
    rollout_buffer_size: int = 8
    train_batch_size: int | None = None
    value_loss_coef: float = 0.6
    advantage_normalization: bool = True
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = None
    num_train_epochs: int = 40
    num_agents: int = 2
    num_generations: int = 1
    num_turns: int = 2
    parallel_training: str = "none"
    agent_devices: str | Sequence[str] | None = None
    critic_devices: str | Sequence[str] | None = None
    external_prompt_passthrough: bool = False
    discount: float = 1.0
    critic_type: str = "v"
    early_termination_threshold: float | None = -0.2
    eval_interval: int = 16
    eval_num_samples: int = 4
    eval_batch_size: int = 1
    logging_steps: int = 1
    reference_kl_enabled: bool = False
    reference_kl_coef: float = 0.1
    reference_devices: str | Sequence[str] | None = None

    def __post_init__(self) -> None:
        _check_ac(self)
