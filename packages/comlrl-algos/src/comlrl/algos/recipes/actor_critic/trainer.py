"""Trainer objects for the actor-critic recipes: a thin front over
:mod:`comlrl.algos.recipes.actor_critic.recipe`.

``IACTrainer(agents, config, task=...)`` / ``MAACTrainer(...)`` take the same task or
CoMLRL-style ``dataset`` + ``formatters`` + ``reward_func`` (+ ``transition``) arguments
as :class:`~comlrl.algos.recipes.group_baseline.trainer.MultiAgentTrainer`, an
:class:`~comlrl.algos.recipes.actor_critic.recipe.ActorCriticConfig`, and optionally ready-made
``critics`` (:class:`~comlrl.algos.models.value.Critic`). The loop and the maths live in the
recipe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.algos.models.value import Critic
from comlrl.algos.recipes.actor_critic import recipe as actor_critic
from comlrl.algos.recipes.actor_critic.recipe import ActorCriticConfig, Method
from comlrl.algos.recipes.group_baseline.trainer import MultiAgentTrainer
from comlrl.algos.rollout.environment import Environment, Transition
from comlrl.algos.training.config import ConfigError
from comlrl.core import Task

__all__ = ["IACTrainer", "MAACTrainer"]


class _ActorCriticTrainer(MultiAgentTrainer):
    method: Method = "iac"
    uses_estimator = False

    def __init__(
        self,
        agents: Sequence[Any],
        config: ActorCriticConfig,
        *,
        critics: Sequence[Critic] | None = None,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        transition: Transition | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        environment: Environment | None = None,
    ) -> None:
        if not isinstance(config, ActorCriticConfig):
            raise ConfigError(
                f"{type(self).__name__} needs an ActorCriticConfig (it has the critic's "
                f"settings), got {type(config).__name__}; build one with the same fields but the "
                "group-baseline ones (estimator, advantage_scale, advantage_eps, "
                "update_chunk_nodes, update_chunk_split_turns)."
            )
        # critic_devices must fit the agents' placement before setup moves any model
        actor_critic.critic_placement(
            config, self.method, actor_critic.planned_agent_devices(config, len(agents))
        )
        super().__init__(
            agents,
            config,
            task=task,
            dataset=dataset,
            formatters=formatters,
            reward_func=reward_func,
            transition=transition,
            eval_dataset=eval_dataset,
            environment=environment,
        )
        self.ac_run = actor_critic.attach(self.run, config, self.method, critics)

    @property
    def critics(self) -> list[Critic]:
        """The critics: one per agent (IAC) or one (MAAC)."""
        return self.ac_run.critics

    def train_step(self) -> dict[str, float]:
        """One step of :func:`comlrl.algos.recipes.actor_critic.recipe.train_step`."""
        return actor_critic.train_step(self.ac_run)

    def save(self, tag: str) -> list[Path]:
        """Agents, value heads and critics under ``output_dir/<tag>``
        (:func:`comlrl.algos.recipes.actor_critic.recipe.save`)."""
        return actor_critic.save(self.ac_run, tag)

    def evaluate(self) -> dict[str, float]:
        """One evaluation row of the agents (critics are not used)."""
        return actor_critic.evaluate(self.ac_run)

    def resume(self, checkpoint: str | Path) -> int:
        """Continue from a step checkpoint (:func:`comlrl.algos.recipes.actor_critic.recipe.resume`:
        actors, critics, optimizers, data and random streams); returns its step.

        Raises:
            CheckpointError: the checkpoint is incomplete or does not fit this run.
        """
        return actor_critic.resume(self.ac_run, checkpoint)

    def checkpoint(self) -> Path:
        """Write a resumable step checkpoint now
        (:func:`comlrl.algos.recipes.actor_critic.recipe.checkpoint`); returns its folder."""
        return actor_critic.checkpoint(self.ac_run)

    def train(self, *, overwrite: bool = False) -> list[dict[str, float]]:
        """Run :func:`comlrl.algos.recipes.actor_critic.recipe.train`; closes the task after.
        ``overwrite`` as in :meth:`MultiAgentTrainer.train`."""
        try:
            return actor_critic.train(self.ac_run, record=self.record, overwrite=overwrite)
        finally:
            if self.task is not None:
                self.task.close()


class IACTrainer(_ActorCriticTrainer):
    """Independent actor-critic: each agent has its own critic that sees only its own prompt
    (``critic_type="v"``) or prompt and completion (``"q"``): a separate model
    (``critic_mode="separate"``) or a value head on the agent's model (``"shared"``).
    Advantages are GAE (Schulman et al. 2016) per turn; the actor takes PPO-clipped
    policy-gradient steps (Schulman et al. 2017)."""

    method = "iac"
    algo = "iac"


class MAACTrainer(_ActorCriticTrainer):
    """Multi-agent actor-critic with one centralised critic that reads every agent's prompt
    (``"v"``) and the joint action (``"q"``) — centralised training, decentralised execution
    (Lowe et al. 2017, MADDPG; Foerster et al. 2018, COMA). Same advantages and updates as
    :class:`IACTrainer`, with every agent credited from the shared critic."""

    method = "maac"
    algo = "maac"
