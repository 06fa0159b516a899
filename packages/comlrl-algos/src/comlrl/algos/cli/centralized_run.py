"""``comlrl train algo=centralized_magrpo``: one joint policy plays every role of a task
(:mod:`comlrl.algos.rollout.centralized`), trained with the MAGRPO group baseline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from comlrl.algos.cli.run_steps import RunRequest, load_eval_split
from comlrl.algos.training.config import TrainConfig
from pydantic import model_validator

__all__ = ["CentralizedRunConfig", "run_centralized_magrpo", "build_centralized_trainer"]


class CentralizedRunConfig(TrainConfig):
    """:class:`~comlrl.algos.training.config.TrainConfig` for centralized collaboration:
    ``num_agents`` is the task's role count, ``models`` names the *one* joint policy, and
    ``role_format`` says how it is asked for and answers with every role's output.
    ``max_new_tokens`` is the budget of the whole joint response; ``num_generations``
    counts joint responses.

    Attributes:
        role_format: ``sentences`` (:class:`~comlrl.algos.rollout.centralized.SentenceRoles`:
            the roles' prompts as one text, the response's sentences split among the roles
            in order; the default, for base story models such as stories260k, which never
            write tags) or ``tagged`` (:class:`~comlrl.algos.rollout.centralized.TaggedRoles`:
            ``<agent_i>`` sections, for chat models that follow the layout).
    """

    output_dir: str = "runs/centralized_magrpo"
    role_format: Literal["sentences", "tagged"] = "sentences"

    @model_validator(mode="after")
    def _one_policy(self) -> CentralizedRunConfig:
        if len(self.models) != 1:
            raise ValueError(
                f"centralized MAGRPO trains one joint policy but models lists "
                f"{len(self.models)}: {self.models!r}; give one model"
            )
        if self.num_turns != 1:
            raise ValueError(
                f"centralized MAGRPO is single-turn; got num_turns={self.num_turns}, set num_turns=1"
            )
        return self

    def policy_config(self) -> TrainConfig:
        """The joint policy's own config: these settings for one agent."""
        data = self.model_dump(exclude={"role_format"})
        data["num_agents"] = 1
        for key in ("agent_devices", "reference_devices"):  # per role: the one policy's
            if isinstance(data.get(key), list):
                data[key] = data[key][:1]
        return TrainConfig.model_validate(data)


def build_centralized_trainer(
    agents: Sequence[Any],
    config: CentralizedRunConfig,
    *,
    task: Any,
    dataset: Sequence[Mapping[str, Any]],
) -> Any:
    """A :class:`~comlrl.algos.MultiAgentTrainer` whose one agent is the joint policy:
    its prompt is the role format's joint prompt of the task's role prompts and its reward
    the task's joint reward of the parsed role outputs. Evaluation (``eval_every``) plays
    the same way on ``eval_split``. ``config.yaml`` records ``algo: centralized_magrpo``.

    Raises:
        ConfigError: as :class:`~comlrl.algos.MultiAgentTrainer`, or a missing eval split.
    """
    from comlrl.algos.recipes.group_baseline.trainer import MultiAgentTrainer
    from comlrl.algos.rollout.centralized import ROLE_FORMATS, centralized_callbacks
    from comlrl.algos.rollout.environment import TaskEnvironment
    from comlrl.algos.training.lifecycle import run_record

    env = TaskEnvironment(task)
    joint_prompt, reward = centralized_callbacks(
        lambda ex: env.root(ex).prompts,
        env.reward,
        config.num_agents,
        ROLE_FORMATS[config.role_format](),
    )
    eval_dataset = load_eval_split(task, config.eval_split) if config.eval_every else None
    trainer = MultiAgentTrainer(
        agents,
        config.policy_config(),
        dataset=dataset,
        formatters=[joint_prompt],
        reward_func=reward,
        eval_dataset=eval_dataset,
    )
    trainer.record = run_record(config, algo="centralized_magrpo", task=task)
    trainer.task = task  # closed when training ends
    return trainer


def run_centralized_magrpo(config: CentralizedRunConfig, request: RunRequest) -> int:
    """``algo=centralized_magrpo``: :func:`build_centralized_trainer` on ``config.task``
    (the joint policy's final weights in ``final/agent_0``)."""
    from comlrl.algos.cli.runs import run_policy_gradient

    return run_policy_gradient(
        config,
        request,
        build_centralized_trainer,
        f"centralized MAGRPO (one joint policy, {config.role_format} role format)",
        num_models=1,
    )
