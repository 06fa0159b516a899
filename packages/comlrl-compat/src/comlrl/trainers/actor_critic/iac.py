"""CoMLRL 1.4.3's ``IACConfig`` / ``IACTrainer``: independent actor-critic, each agent with
its own critic (a separate model, or a value head on the agent's model with
``use_separate_critic=False``), run by :class:`comlrl.algos.IACTrainer`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from comlrl.trainers.actor_critic.ac_base import ActorCriticTrainerBase, check_actor_critic_config

__all__ = ["IACConfig", "IACTrainer"]


@dataclass
class IACConfig:
    """CoMLRL 1.4.3's ``IACConfig``: its fields, defaults and checks.

    Units as :class:`comlrl.trainers.reinforce.magrpo.MAGRPOConfig`; ``value_clip_range``
    in reward units; ``critic_learning_rate`` None = ``agent_learning_rate``;
    ``value_head_hidden_dim`` sizes the value heads on the agents,
    ``critic_value_head_hidden_dim`` those of separate critics (None: linear heads).

    Raises:
        ValueError: see :func:`~comlrl.trainers.actor_critic.ac_base.check_actor_critic_config`.
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
        check_actor_critic_config(self)


class IACTrainer(ActorCriticTrainerBase):
    """CoMLRL 1.4.3's ``IACTrainer`` (its arguments).

    Args:
        agent_model: a name/path (``args.num_agents`` copies) or, for one agent, a model.
        critic_model: with ``use_separate_critic``, a name/path loaded once per agent (or
            a model for one agent).
        critics: instead, ``A`` critic models (names/paths or objects; an agent's own
            model object is copied).
        agents, tokenizer, model_config, train_dataset, eval_dataset, reward_func,
            reward_processor, formatters, external_transition, wandb_config: as
            :class:`comlrl.trainers.reinforce.magrpo.MAGRPOTrainer`.
        metrics_callback: not supported (raises).
        args: an :class:`IACConfig`.

    Raises:
        UnsupportedFieldError: ``metrics_callback``.
        ValueError: missing or inconsistent agents, critics, tokenizers or callbacks
            (1.4.3's messages).
    """

    config_cls: type = IACConfig
    algorithm_name = "IAC"
    method = "iac"
