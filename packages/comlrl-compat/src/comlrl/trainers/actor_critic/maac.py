"""CoMLRL 1.4.3's ``MAACConfig`` / ``MAACTrainer``: one centralised critic for every agent
(Lowe et al. 2017; Foerster et al. 2018), reading every agent's prompt (``"v"``) or the
joint action (``"q"``), run by :class:`comlrl.algos.MAACTrainer`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from comlrl.trainers.actor_critic.ac_base import ActorCriticTrainerBase, check_actor_critic_config

__all__ = ["MAACConfig", "MAACTrainer"]


@dataclass
class MAACConfig:
    """CoMLRL 1.4.3's ``MAACConfig``: its fields, defaults and checks (units as
    :class:`comlrl.trainers.actor_critic.iac.IACConfig`).

    Raises:
        ValueError: see :func:`~comlrl.trainers.actor_critic.ac_base.check_actor_critic_config`.
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
        check_actor_critic_config(self)


class MAACTrainer(ActorCriticTrainerBase):
    """CoMLRL 1.4.3's ``MAACTrainer``: arguments and errors as
    :class:`~comlrl.trainers.actor_critic.iac.IACTrainer`, with one critic
    (``critic_model`` or ``critics=[one]``); its value head's hidden width is
    ``model_config["critic_value_head_hidden_dim"]`` (1.4.3's place for it)."""

    config_cls: type = MAACConfig
    algorithm_name = "MAAC"
    method = "maac"

    def _critic_head_dim(self) -> int | None:
        return self.model_config.get("critic_value_head_hidden_dim")
