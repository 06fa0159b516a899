"""The end-to-end runs of the actor-critic recipes (``algo=iac``, ``algo=maac``): the
group-baseline run (:func:`~comlrl.algos.recipes.group_baseline.run.run_policy_gradient`:
the same task, agents and outputs) with an actor-critic trainer."""

from __future__ import annotations

from comlrl.algos.recipes.actor_critic.config import ActorCriticConfig
from comlrl.algos.recipes.group_baseline.run import run_policy_gradient
from comlrl.algos.recipes.run_steps import RunOutputs, RunResult

__all__ = ["run_iac", "run_maac"]


def run_iac(config: ActorCriticConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=iac``: :class:`~comlrl.algos.IACTrainer` (a critic per agent) on
    ``config.task``; raises as :func:`run_policy_gradient`."""
    from comlrl.algos.recipes.actor_critic.trainer import IACTrainer

    return run_policy_gradient(
        config, outputs, IACTrainer, f"IAC ({config.critic_mode} {config.critic_type}-critics)"
    )


def run_maac(config: ActorCriticConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=maac``: :class:`~comlrl.algos.MAACTrainer` (one centralised critic) on
    ``config.task``; raises as :func:`run_policy_gradient`."""
    from comlrl.algos.recipes.actor_critic.trainer import MAACTrainer

    return run_policy_gradient(
        config, outputs, MAACTrainer, f"MAAC (centralised {config.critic_type}-critic)"
    )
