"""The centralized recipes' run configs and end-to-end runs (``algo=centralized_magrpo |
centralized_madpo | centralized_marlhf | centralized_madpo_iter |
centralized_marlhf_iter``): one joint policy plays every role of a task (:mod:`comlrl.algos.rollout.joint_policy`), trained with the MAGRPO group baseline,
with DPO on pairs of its joint responses (MADPO with one agent: the joint DPO loss on the
log-probability of the whole joint response), with MAGRPO on a reward model fit on those
pairs' joint texts (MARLHF with one agent), or with the iterative forms of the last two
(rounds of pairs against a comparator of joint responses)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from comlrl.algos.recipes.group_baseline.recipe import run_policy_gradient
from comlrl.algos.recipes.launch import RunOutputs, RunResult, load_eval_split
from comlrl.algos.recipes.preference.iterative.config import MADPOIterRunConfig, MARLHFIterRunConfig
from comlrl.algos.recipes.preference.iterative.recipe import run_madpo_iter, run_marlhf_iter
from comlrl.algos.recipes.preference.madpo.config import MADPORunConfig
from comlrl.algos.recipes.preference.madpo.recipe import run_madpo
from comlrl.algos.recipes.preference.marlhf.config import MARLHFRunConfig
from comlrl.algos.recipes.preference.marlhf.recipe import run_marlhf
from comlrl.algos.training.config.rl import TrainConfig
from pydantic import BaseModel, model_validator

__all__ = [
    "CentralizedRunConfig",
    "CentralizedMADPORunConfig",
    "run_centralized_magrpo",
    "run_centralized_madpo",
    "CentralizedMARLHFRunConfig",
    "run_centralized_marlhf",
    "build_centralized_trainer",
    "build_centralized_madpo_trainer",
    "CentralizedMADPOIterRunConfig",
    "run_centralized_madpo_iter",
    "CentralizedMARLHFIterRunConfig",
    "run_centralized_marlhf_iter",
]


class CentralizedRunConfig(TrainConfig):
    """:class:`~comlrl.algos.training.config.rl.TrainConfig` for centralized collaboration:
    ``num_agents`` is the task's role count, ``models`` names the *one* joint policy, and
    ``role_format`` says how it is asked for and answers with every role's output.
    ``max_new_tokens`` is the budget of the whole joint response; ``num_generations``
    counts joint responses.

    Attributes:
        role_format: ``sentences`` (:class:`~comlrl.algos.rollout.joint_policy.SentenceRoles`:
            the roles' prompts as one text, the response's sentences split among the roles
            in order; the default, for base story models such as stories260k, which never
            write tags) or ``tagged`` (:class:`~comlrl.algos.rollout.joint_policy.TaggedRoles`:
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
    from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
    from comlrl.algos.rollout.environment import TaskEnvironment
    from comlrl.algos.rollout.joint_policy import ROLE_FORMATS, centralized_callbacks
    from comlrl.algos.training.run.lifecycle import run_record

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


def run_centralized_magrpo(
    config: CentralizedRunConfig, outputs: RunOutputs | None = None
) -> RunResult:
    """``algo=centralized_magrpo``: :func:`build_centralized_trainer` on ``config.task``
    (the joint policy's final weights in ``final/agent_0``)."""
    return run_policy_gradient(
        config,
        outputs,
        build_centralized_trainer,
        f"centralized MAGRPO (one joint policy, {config.role_format} role format)",
        num_models=1,
        refuse_tools="centralized_magrpo",
    )


class CentralizedMADPORunConfig(MADPORunConfig):
    """:class:`~comlrl.algos.recipes.preference.madpo.config.MADPORunConfig` for centralized collaboration:
    ``num_agents`` is the task's role count, ``models`` names the *one* joint policy, and
    ``role_format`` is as :class:`CentralizedRunConfig`'s. ``num_candidates`` counts joint
    responses per prompt and ``max_new_tokens`` is the budget of a whole joint response.
    Each step pairs the joint responses of a prompt by the gap of the task's joint reward
    on their parsed role outputs and takes one DPO step (Rafailov et al. 2023, eq. 7) on
    the log-probability of the whole joint response against a frozen copy of the policy.
    """

    output_dir: str = "runs/centralized_madpo"
    role_format: Literal["sentences", "tagged"] = "sentences"

    @model_validator(mode="after")
    def _one_policy(self) -> CentralizedMADPORunConfig:
        if len(self.models) != 1:
            raise ValueError(
                f"centralized MADPO trains one joint policy but models lists "
                f"{len(self.models)}: {self.models!r}; give one model"
            )
        return self

    def policy_config(self) -> MADPORunConfig:
        """The joint policy's own config: these settings for one agent."""
        data = self.model_dump(exclude={"role_format"})
        data["num_agents"] = 1
        return MADPORunConfig.model_validate(data)


def build_centralized_madpo_trainer(
    agents: Sequence[Any],
    config: CentralizedMADPORunConfig,
    task: Any,
    examples: Sequence[Mapping[str, Any]],
    eval_examples: Sequence[Mapping[str, Any]] | None,
) -> Any:
    """A :class:`~comlrl.algos.MADPOTrainer` whose one agent is the joint policy: its
    prompt is the role format's joint prompt of the task's role prompts and its reward the
    task's joint reward of the parsed role outputs (held-out reward the same way)."""
    from comlrl.algos.recipes.preference.madpo.recipe import MADPOTrainer

    formatters, reward = _joint_inputs(task, config.num_agents, config.role_format)
    return MADPOTrainer(
        agents,
        config.policy_config(),
        dataset=examples,
        formatters=formatters,
        reward_func=reward,
        eval_dataset=eval_examples,
    )


def _joint_inputs(task: Any, num_roles: int, role_format: str) -> tuple[list[Any], Any]:
    """The joint policy's one formatter and its reward on ``task``
    (:func:`~comlrl.algos.rollout.joint_policy.centralized_callbacks`)."""
    from comlrl.algos.rollout.environment import TaskEnvironment
    from comlrl.algos.rollout.joint_policy import ROLE_FORMATS, centralized_callbacks

    env = TaskEnvironment(task)
    joint_prompt, reward = centralized_callbacks(
        lambda ex: env.root(ex).prompts, env.reward, num_roles, ROLE_FORMATS[role_format]()
    )
    return [joint_prompt], reward


def run_centralized_madpo(
    config: CentralizedMADPORunConfig, outputs: RunOutputs | None = None
) -> RunResult:
    """``algo=centralized_madpo``: :func:`build_centralized_madpo_trainer` on
    ``config.task`` (the joint policy's final weights in ``final/agent_0``)."""
    return run_madpo(
        config,
        outputs,
        algo="centralized_madpo",
        label=f"centralized MADPO (one joint policy, {config.role_format} role format)",
        num_models=1,
        build=build_centralized_madpo_trainer,
    )


class CentralizedMARLHFRunConfig(MARLHFRunConfig):
    """:class:`~comlrl.algos.recipes.preference.marlhf.config.MARLHFRunConfig` for centralized
    collaboration: ``num_agents`` is the role count, ``models`` names the one joint
    policy, ``role_format`` as :class:`CentralizedRunConfig`'s. Pairs of joint responses
    (by the task's joint reward of their parsed roles) fit the joint reward model on the
    joint prompt and response; then MAGRPO trains the policy on that model's scores."""

    output_dir: str = "runs/centralized_marlhf"
    role_format: Literal["sentences", "tagged"] = "sentences"

    @model_validator(mode="after")
    def _one_policy(self) -> CentralizedMARLHFRunConfig:
        if len(self.models) != 1:
            raise ValueError(
                f"centralized MARLHF trains one joint policy but models lists "
                f"{len(self.models)}: {self.models!r}; give one model"
            )
        if self.num_turns != 1:
            raise ValueError(
                f"centralized MARLHF is single-turn; got num_turns={self.num_turns}, set num_turns=1"
            )
        return self

    def policy_config(self) -> MARLHFRunConfig:
        """The joint policy's own config (its RL phase): these settings for one agent."""
        data = self.model_dump(exclude={"role_format"})
        data["num_agents"] = 1
        for key in ("agent_devices", "reference_devices"):  # per role: the one policy's
            if isinstance(data.get(key), list):
                data[key] = data[key][:1]
        return MARLHFRunConfig.model_validate(data)


def run_centralized_marlhf(
    config: CentralizedMARLHFRunConfig, outputs: RunOutputs | None = None
) -> RunResult:
    """``algo=centralized_marlhf``: :func:`~comlrl.algos.recipes.preference.marlhf.recipe.run_marlhf` with one
    joint policy (its final weights in ``final/agent_0``, the reward model's in
    ``final/reward_model``)."""
    return run_marlhf(
        config,
        outputs,
        algo="centralized_marlhf",
        num_models=1,
        joint=lambda task: _joint_inputs(task, config.num_agents, config.role_format),
        rl_config=config.policy_config(),
    )


def _one_joint_policy(config: Any, recipe: str) -> None:
    """Raise ``ValueError`` unless ``config.models`` names one joint policy."""
    if len(config.models) != 1:
        raise ValueError(
            f"{recipe} trains one joint policy but models lists {len(config.models)}: "
            f"{config.models!r}; give one model"
        )


def _for_one_policy(config: Any, cls: type[BaseModel]) -> Any:
    """``config`` as ``cls`` for the joint policy alone (``num_agents=1``, per-role device
    lists cut to the policy's)."""
    data = config.model_dump(exclude={"role_format"})
    data["num_agents"] = 1
    for key in ("agent_devices", "reference_devices"):
        if isinstance(data.get(key), list):
            data[key] = data[key][:1]
    return cls.model_validate(data)


class CentralizedMADPOIterRunConfig(MADPOIterRunConfig):
    """:class:`~comlrl.algos.recipes.preference.iterative.config.MADPOIterRunConfig` for centralized
    collaboration: ``num_agents`` is the role count, ``models`` names the one joint
    policy, ``role_format`` as :class:`CentralizedRunConfig`'s. Each round compares the
    policy's joint responses with the comparator's (``comparator``: the policy itself, a
    frozen model, its past self, or an HTTP API) under the task's joint reward of the
    parsed roles, and trains on DPO steps over the whole joint response."""

    output_dir: str = "runs/centralized_madpo_iter"
    role_format: Literal["sentences", "tagged"] = "sentences"

    @model_validator(mode="after")
    def _one_policy(self) -> CentralizedMADPOIterRunConfig:
        _one_joint_policy(self, "centralized MADPO-Iter")
        return self

    def policy_config(self) -> MADPOIterRunConfig:
        """The joint policy's own config: these settings for one agent."""
        result: MADPOIterRunConfig = _for_one_policy(self, MADPOIterRunConfig)
        return result


def run_centralized_madpo_iter(
    config: CentralizedMADPOIterRunConfig, outputs: RunOutputs | None = None
) -> RunResult:
    """``algo=centralized_madpo_iter``: :func:`~comlrl.algos.recipes.preference.iterative.recipe.run_madpo_iter`
    with one joint policy (its final weights in ``final/agent_0``)."""
    return run_madpo_iter(
        config,
        outputs,
        algo="centralized_madpo_iter",
        num_models=1,
        joint=lambda task: _joint_inputs(task, config.num_agents, config.role_format),
        policy_config=config.policy_config(),
    )


class CentralizedMARLHFIterRunConfig(MARLHFIterRunConfig):
    """:class:`~comlrl.algos.recipes.preference.iterative.config.MARLHFIterRunConfig` for centralized
    collaboration (one joint policy, ``role_format``): each round's comparator pairs of
    joint responses refit the joint reward model on the joint prompt and response, then
    the policy takes MAGRPO steps on its scores."""

    output_dir: str = "runs/centralized_marlhf_iter"
    role_format: Literal["sentences", "tagged"] = "sentences"

    @model_validator(mode="after")
    def _one_policy(self) -> CentralizedMARLHFIterRunConfig:
        _one_joint_policy(self, "centralized MARLHF-Iter")
        return self

    def policy_config(self) -> MARLHFIterRunConfig:
        """The joint policy's own config (its RL steps): these settings for one agent."""
        result: MARLHFIterRunConfig = _for_one_policy(self, MARLHFIterRunConfig)
        return result


def run_centralized_marlhf_iter(
    config: CentralizedMARLHFIterRunConfig, outputs: RunOutputs | None = None
) -> RunResult:
    """``algo=centralized_marlhf_iter``: :func:`~comlrl.algos.recipes.preference.iterative.recipe.run_marlhf_iter`
    with one joint policy."""
    return run_marlhf_iter(
        config,
        outputs,
        algo="centralized_marlhf_iter",
        num_models=1,
        joint=lambda task: _joint_inputs(task, config.num_agents, config.role_format),
        policy_config=config.policy_config(),
    )
