"""The end-to-end runs of the iterative preference recipes (``algo=madpo_iter``,
``algo=marlhf_iter``): their run configs and the runs, rounds of fresh pairs against a
comparator policy (:mod:`comlrl.algos.recipes.preference.iterative.recipe`), from config to
final checkpoint and resumable, from Python as from ``comlrl train``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from comlrl.algos.recipes.preference.config import (
    IterativeMADPOConfig,
    IterativeSection,
    RewardModelConfig,
)
from comlrl.algos.recipes.preference.madpo.run import MADPORunConfig
from comlrl.algos.recipes.run_config import eval_on_start_follows
from comlrl.algos.recipes.run_steps import (
    RunOutputs,
    RunResult,
    announce,
    load_agents,
    load_eval_split,
    load_model,
    loss_summary,
    preflight,
    quiet_transformers,
    resuming_line,
    setup_errors,
)
from comlrl.algos.training.config import TrainConfig
from comlrl.core import SamplingParams
from pydantic import Field, model_validator

__all__ = ["MADPOIterRunConfig", "MARLHFIterRunConfig", "run_madpo_iter", "run_marlhf_iter"]


class MADPOIterRunConfig(MADPORunConfig, IterativeMADPOConfig):
    """``algo=madpo_iter``: :class:`~comlrl.algos.recipes.preference.madpo.run.MADPORunConfig` (agents,
    task, DPO and sampling settings; ``pairs_per_prompt`` current-vs-comparator pairs per
    prompt) plus the rounds (:class:`~comlrl.algos.recipes.preference.config.IterativeSection`:
    ``steps_per_round``, ``comparator``, ``replay_mode``, ...)."""

    output_dir: str = "runs/madpo_iter"

    @model_validator(mode="after")
    def _aligned(self) -> MADPOIterRunConfig:
        _check_aligned(self.joint_mode)
        return self


class MARLHFIterRunConfig(TrainConfig, IterativeSection):
    """``algo=marlhf_iter``: :class:`~comlrl.algos.training.config.TrainConfig` for the RL
    steps (MAGRPO on the learned reward) plus the rounds
    (:class:`~comlrl.algos.recipes.preference.config.IterativeSection`) and the reward model.

    Attributes:
        reward_model: the reward model's backbone (None: agent 0's model).
        reward: how it is fitted each round (from its initial weights).
        num_candidates: ``K``, current candidates per agent per prompt in a round (>= 1).
        pairs_per_prompt: current-vs-comparator pairs kept per prompt.
        scoring_reward: ``task`` (pairs ordered by the task reward) or ``reward_model``
            (by the previous round's reward model; round 0 has none and uses the task's).
        eval_every: on by default (every 40 steps and before the first): the evaluation
            (``eval.jsonl``) scores the agents with the task's reward on ``eval_split``.
    """

    output_dir: str = "runs/marlhf_iter"
    eval_every: int = Field(40, ge=0)
    eval_on_start: bool = True
    reward_model: str | None = None
    reward: RewardModelConfig = Field(default_factory=lambda: RewardModelConfig(learning_rate=1e-3))
    num_candidates: int = Field(4, ge=1)
    pairs_per_prompt: int = Field(1, ge=1)
    scoring_reward: Literal["task", "reward_model"] = "task"

    @model_validator(mode="before")
    @classmethod
    def _no_start_eval_when_off(cls, data: Any) -> Any:
        return eval_on_start_follows(data)

    @model_validator(mode="after")
    def _single_turn_aligned(self) -> MARLHFIterRunConfig:
        _check_aligned(self.joint_mode)
        if self.num_turns != 1:
            raise ValueError(f"marlhf_iter is single-turn; got num_turns={self.num_turns}")
        return self


def _check_aligned(joint_mode: str) -> None:
    if joint_mode != "align":
        raise ValueError(
            f"joint_mode={joint_mode!r}: the rounds compare current and comparator joint "
            "actions index by index; set joint_mode=align"
        )


def _loader(config: Any) -> Any:
    """``name -> model`` for ``comparator_models`` (frozen, loaded as the agents are)."""
    return lambda name: load_model(name, config, config.seed + 7919)[0]


#: ``task -> (formatters, reward)`` of one joint policy (the centralized recipes)
JointInputs = Callable[[Any], tuple[list[Any], Any]]


def run_madpo_iter(
    config: MADPOIterRunConfig,
    outputs: RunOutputs | None = None,
    *,
    algo: str = "madpo_iter",
    num_models: int | None = None,
    joint: JointInputs | None = None,
    policy_config: Any = None,
) -> RunResult:
    """``algo=madpo_iter``: MADPO-Iter on ``config.task``
    (:func:`~comlrl.algos.recipes.preference.iterative.recipe.train_madpo_iter`); with
    ``outputs.resume_from`` it continues that step checkpoint (rounds, replay and
    comparator included).

    ``algo=centralized_madpo_iter`` loads ``num_models`` (1) models, takes the one joint
    policy's ``(formatters, reward)`` from ``joint(task)`` instead of the task's own, and
    builds its MADPO run with ``policy_config`` (the policy's one-agent config).

    Raises:
        ConfigError: a bad config, task, model name, a model that does not load, a
            folder that holds another run (without ``outputs.overwrite``), or a checkpoint
            that does not fit, all before training.
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
    """
    from comlrl.algos.recipes.preference.iterative.checkpoint import madpo_iter_resume
    from comlrl.algos.recipes.preference.iterative.recipe import (
        MADPOIterRun,
        build_rounds,
        train_madpo_iter,
    )
    from comlrl.algos.recipes.preference.madpo.trainer import MADPOTrainer
    from comlrl.algos.training.reporting import reporters_for

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    outputs.check_folder()
    task, examples = preflight(
        config,
        [*config.models, *(config.comparator_models or [])],
        refuse_tools="madpo_iter",
    )
    try:
        with setup_errors():
            eval_examples = None
            if config.eval_split is not None:
                eval_examples = load_eval_split(task, config.eval_split, config.eval_limit)
            quiet_transformers()
            announce(
                config,
                len(examples),
                f"MADPO-Iter against the {config.comparator} comparator, "
                f"{config.num_rounds(config.num_steps)} rounds of {config.steps_per_round} steps",
                _who(config, num_models),
            )
            agents = load_agents(config, num_models, prompt_format=config.prompt_format)
            madpo = MADPOTrainer(
                agents,
                policy_config or config,
                dataset=examples,
                eval_dataset=eval_examples,
                **_task_inputs(task, joint),
            ).run
            rounds = build_rounds(
                config,
                madpo.agents,
                SamplingParams.from_config(config, config.num_candidates),
                pairs_per_prompt=config.pairs_per_prompt,
                num_rounds=config.num_rounds(config.num_steps),
                seed=config.seed,
                load=_loader(config),
            )
            run = MADPOIterRun(madpo, rounds)
            if outputs.resume_from is not None:
                step = madpo_iter_resume(run, outputs.resume_from, outputs.output_dir)
                print(
                    resuming_line(outputs.output_dir, step, config.num_steps, outputs.resume_from)
                )
    except BaseException:
        task.close()
        raise
    try:  # a bug from here on keeps its traceback
        history = train_madpo_iter(
            run,
            **outputs.loop_arguments({"algo": algo, **config.model_dump()}),
            overwrite=outputs.overwrite,
            reporters=lambda out: reporters_for(
                out,
                report_to=list(outputs.report_to),
                reward_curve=outputs.reward_curve,
                title=f"{config.task.name} - {', '.join(config.models)} - MADPO-Iter",
                wandb_project=outputs.wandb_project,
                record=config.model_dump(),
            ),
        )
    finally:
        task.close()
    out = outputs.output_dir
    return RunResult(history, loss_summary(history, out, "reward_mean"), out)


def _who(config: Any, num_models: int | None) -> str:
    """Who trains, for the run's first line: the agents, or one policy for the roles."""
    if num_models is None or num_models == config.num_agents:
        return f"{config.num_agents} agents"
    return f"{num_models} policy for {config.num_agents} roles"


def _task_inputs(task: Any, joint: JointInputs | None) -> dict[str, Any]:
    """The trainer's task arguments: the task itself, or a joint policy's formatters and
    reward on it."""
    if joint is None:
        return {"task": task}
    return dict(zip(("formatters", "reward_func"), joint(task), strict=True))


def run_marlhf_iter(
    config: MARLHFIterRunConfig,
    outputs: RunOutputs | None = None,
    *,
    algo: str = "marlhf_iter",
    num_models: int | None = None,
    joint: JointInputs | None = None,
    policy_config: Any = None,
) -> RunResult:
    """``algo=marlhf_iter``: MARLHF-Iter on ``config.task``
    (:func:`~comlrl.algos.recipes.preference.iterative.recipe.train_marlhf_iter`); the
    reward model's fit rows in ``reward_model_metrics.jsonl``, its last fit in
    ``final/reward_model``; with ``outputs.resume_from`` it continues that step checkpoint.
    ``algo=centralized_marlhf_iter`` as :func:`run_madpo_iter`'s centralized form: one
    joint policy, its RL steps with ``policy_config``.

    Raises:
        ConfigError: as :func:`run_madpo_iter`.
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
        RewardFunctionError: the reward function failed.
    """
    import torch
    from comlrl.algos.recipes.preference.config import MADPOConfig
    from comlrl.algos.recipes.preference.iterative.checkpoint import marlhf_iter_resume
    from comlrl.algos.recipes.preference.iterative.recipe import (
        MARLHFIterRun,
        build_rounds,
        train_marlhf_iter,
    )
    from comlrl.algos.recipes.preference.marlhf.run import save_reward_model
    from comlrl.algos.recipes.preference.marlhf.trainer import MARLHFTrainer
    from comlrl.algos.training import lifecycle
    from comlrl.algos.training.data import JsonlWriter
    from comlrl.algos.training.data_mixture import example_stream
    from comlrl.algos.training.run_summary import summary_line

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    if policy_config is not None:
        policy_config = outputs.apply(policy_config)
    outputs.check_folder()
    backbone_name = config.reward_model or config.model_for(0)
    task, examples = preflight(
        config,
        [*config.models, backbone_name, *(config.comparator_models or [])],
        refuse_tools="marlhf_iter",
    )
    try:
        with setup_errors():
            eval_examples = None
            if config.eval_every:
                eval_examples = load_eval_split(task, config.eval_split, config.eval_limit)
            quiet_transformers()
            announce(
                config,
                len(examples),
                f"MARLHF-Iter against the {config.comparator} comparator, "
                f"{config.num_rounds(config.num_steps)} rounds of a reward-model fit and "
                f"{config.steps_per_round} steps of estimator {config.estimator}",
                _who(config, num_models),
            )
            torch.manual_seed(config.seed)
            agents = load_agents(config, num_models, **config.generation_options())
            n_models = len(agents)
            backbone, backbone_tok = load_model(backbone_name, config, config.seed + 104_729)
            marlhf = MARLHFTrainer(
                agents,
                MADPOConfig(num_agents=n_models, seed=config.seed, device=config.device),
                reward_backbone=backbone,
                reward_tokenizer=backbone_tok,
                reward_config=config.reward,
                dataset=examples,
                **_task_inputs(task, joint),
            )
            rl = marlhf.rl_trainer(policy_config or config, eval_dataset=eval_examples)
            run = MARLHFIterRun(
                rl=rl.run,
                rounds=build_rounds(
                    config,
                    rl.run.agents,
                    SamplingParams.from_config(config, config.num_candidates),
                    pairs_per_prompt=config.pairs_per_prompt,
                    num_rounds=config.num_rounds(config.num_steps),
                    seed=config.seed,
                    load=_loader(config),
                ),
                task_env=marlhf.env,
                reward_env=rl.env,
                reward_model=marlhf.reward_model,
                reward_tokenizer=marlhf.reward_tokenizer,
                reward_config=config.reward,
                data=example_stream(examples, seed=config.seed + 1, task=config.task),
                section=config,
                batch_size=config.batch_size,
                scoring_reward=config.scoring_reward,
            )
            if outputs.resume_from is not None:
                step = marlhf_iter_resume(run, outputs.resume_from)
                print(
                    resuming_line(outputs.output_dir, step, config.num_steps, outputs.resume_from)
                )
    except BaseException:
        task.close()
        raise
    if outputs.overwrite and outputs.resume_from is None:
        lifecycle.clear_run_outputs(outputs.output_dir)
    out = rl.run.output_dir
    try:  # a bug from here on keeps its traceback
        history = train_marlhf_iter(
            run,
            record=lifecycle.run_record(config, algo=algo, task=task),
            save_final=lambda path: save_reward_model(marlhf, path / "reward_model"),
        )
    finally:
        task.close()
        if run.reward_model_rows:  # all of the run's fits (a resumed run's saved ones too)
            (out / "reward_model_metrics.jsonl").unlink(missing_ok=True)
            writer = JsonlWriter(out / "reward_model_metrics.jsonl")
            try:
                for row in run.reward_model_rows:
                    writer.write(row)
            finally:
                writer.close()
    line = summary_line(history, out) + " (reward: the learned reward model's)"
    return RunResult(history, line, out)
