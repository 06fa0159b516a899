"""Trainer objects for the preference recipes: thin fronts over
:mod:`comlrl.algos.recipes.preference.recipe`.

Each class checks its arguments and config when built (before any model work) and calls
the recipe's loop in :meth:`train`; the maths and the loops live in the recipe.

- :class:`SFTTrainer`, :class:`DPOTrainer`: one model on offline rows.
- :class:`MADPOTrainer`: ``A`` agents on a task (or CoMLRL's ``dataset`` + ``formatters``
  + ``reward_func`` form), pairs sampled online.
- :class:`MARLHFTrainer`: samples pairs like MADPO, fits a joint reward model, and hands
  it to an RL recipe as its reward function (:meth:`MARLHFTrainer.rl_trainer`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.algos.recipes.preference import recipe
from comlrl.algos.recipes.preference.recipe import (
    DPOConfig,
    JointPreferencePairs,
    JointRewardModel,
    MADPOConfig,
    RewardModelConfig,
    RewardModelReward,
    SFTConfig,
)
from comlrl.algos.rollout.environment import CallbackEnvironment, Environment, TaskEnvironment
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.config import ConfigError, TrainConfig
from comlrl.algos.training.steps import DataStream
from comlrl.core import SamplingParams, Task
from comlrl.core.prompts import prompt_text

__all__ = ["SFTTrainer", "DPOTrainer", "MADPOTrainer", "MARLHFTrainer"]


def _check_config(config: Any, cls: type) -> None:
    if not isinstance(config, cls):
        raise ConfigError(
            f"expected a {cls.__name__}, got {type(config).__name__}; build it with {cls.__name__}.build(...)"
        )


class SFTTrainer:
    """Supervised fine-tuning of ``model`` on ``prompt``/``completion`` rows
    (:func:`comlrl.algos.recipes.preference.recipe.train_sft`).

    Raises:
        ConfigError: a config of the wrong type, or rows without the string fields.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: SFTConfig,
        *,
        dataset: Sequence[Mapping[str, Any]],
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        _check_config(config, SFTConfig)
        keys = ("prompt", "completion")
        self.dataset = recipe._rows(dataset, keys, "SFT")
        self.eval_dataset = (
            recipe._rows(eval_dataset, keys, "SFT evaluation") if eval_dataset is not None else None
        )
        self.model, self.tokenizer, self.config = model, tokenizer, config

    def evaluate(self) -> dict[str, float]:
        """Held-out NLL (:func:`~comlrl.algos.recipes.preference.recipe.evaluate_sft`)."""
        if self.eval_dataset is None:
            raise ConfigError("no eval_dataset was given to SFTTrainer")
        return recipe.evaluate_sft(self.model, self.tokenizer, self.eval_dataset, self.config)

    def train(self, **outputs: Any) -> list[dict[str, float]]:
        """Run the loop; one metrics row per step. ``outputs`` (``output_dir``,
        ``save_every``, ``keep_last``, ``resume_from``, ``record``, ``progress``) as in
        :func:`~comlrl.algos.recipes.preference.recipe.train_sft`: with ``output_dir``, logs,
        step checkpoints, Ctrl-C at a step boundary and ``final/``; ``resume_from``
        continues a run exactly."""
        return recipe.train_sft(
            self.model, self.tokenizer, self.dataset, self.config, self.eval_dataset, **outputs
        )


class DPOTrainer:
    """DPO of ``model`` on ``prompt``/``chosen``/``rejected`` rows against ``ref_model``
    (default: a frozen deep copy of ``model`` made when training starts;
    :func:`comlrl.algos.recipes.preference.recipe.train_dpo`).

    Raises:
        ConfigError: a config of the wrong type, rows without the string fields, or
            ``ref_model is model``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: DPOConfig,
        *,
        dataset: Sequence[Mapping[str, Any]],
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        ref_model: Any | None = None,
    ) -> None:
        _check_config(config, DPOConfig)
        keys = ("prompt", "chosen", "rejected")
        self.dataset = recipe._rows(dataset, keys, "DPO")
        self.eval_dataset = (
            recipe._rows(eval_dataset, keys, "DPO evaluation") if eval_dataset is not None else None
        )
        if ref_model is model:
            raise ConfigError(
                "ref_model is the policy itself; pass a separate frozen copy or None."
            )
        self.model, self.tokenizer, self.config, self.ref_model = (
            model,
            tokenizer,
            config,
            ref_model,
        )

    def train(self, **outputs: Any) -> list[dict[str, float]]:
        """Run the loop; one metrics row per step. ``outputs`` as in
        :func:`~comlrl.algos.recipes.preference.recipe.train_dpo` (``resume_from``: build the
        trainer on the run's initial weights: the reference is their copy)."""
        return recipe.train_dpo(
            self.model,
            self.tokenizer,
            self.dataset,
            self.config,
            self.eval_dataset,
            ref_model=self.ref_model,
            **outputs,
        )


def _environment(
    num_agents: int,
    task: Task | None,
    dataset: Sequence[Mapping[str, Any]] | None,
    formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None,
    reward_func: Callable[..., Any] | None,
) -> tuple[Environment, list[Mapping[str, Any]]]:
    if task is not None:
        if formatters is not None or reward_func is not None:
            raise ConfigError("pass either task= or formatters= + reward_func=, not both.")
        return TaskEnvironment(task), list(dataset) if dataset is not None else list(
            task.load("train")
        )
    if formatters is None or reward_func is None or dataset is None:
        raise ConfigError(
            "without a task, pass dataset=, formatters= (one per agent) and reward_func=."
        )
    if len(formatters) != num_agents:
        raise ConfigError(
            f"{len(formatters)} formatters for {num_agents} agents; give one per agent."
        )
    return CallbackEnvironment(formatters, reward_func), list(dataset)


def _agents(agents: Sequence[Any]) -> list[Any]:
    from comlrl.algos.rollout.agent import HFAgent

    return [
        a if not isinstance(a, tuple) else HFAgent(a[0], a[1], name=f"agent_{i}")
        for i, a in enumerate(agents)
    ]


class MADPOTrainer:
    """Multi-agent DPO (:func:`comlrl.algos.recipes.preference.recipe.madpo_step`): each step
    samples ``K`` candidates per agent, pairs joint actions by reward gap and steps every
    agent on its own term of the joint DPO loss, against a frozen reference per agent.

    Args:
        agents: ``A`` :class:`~comlrl.algos.HFAgent` s or ``(model, tokenizer)`` pairs,
            each with its own model object.
        config: a :class:`MADPOConfig`.
        task: a single-turn use of a :class:`comlrl.core.Task` (its ``train`` split unless
            ``dataset`` is given); or ``dataset`` + ``formatters`` + ``reward_func``.
        eval_dataset: held-out examples (reward and held-out pair margin).
        ref_models: one frozen reference per agent (default: copies made at setup).

    Raises:
        ConfigError: as :func:`~comlrl.algos.recipes.preference.recipe.madpo_setup`, or a
            missing task / formatters / reward function.
    """

    def __init__(
        self,
        agents: Sequence[Any],
        config: MADPOConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        ref_models: Sequence[Any] | None = None,
    ) -> None:
        _check_config(config, MADPOConfig)
        self.config = config
        self.agents = _agents(agents)
        self.env, data = _environment(len(self.agents), task, dataset, formatters, reward_func)
        self.run = recipe.madpo_setup(
            self.agents, config, self.env, data, eval_dataset, ref_models=ref_models
        )

    def train_step(self) -> dict[str, float]:
        """One step; its metrics row."""
        return recipe.madpo_step(self.run)

    def evaluate(self) -> dict[str, float]:
        """Held-out reward and pair metrics."""
        return recipe.madpo_evaluate(self.run)

    def train(self, **outputs: Any) -> list[dict[str, float]]:
        """Run the steps up to ``config.num_steps`` (from the resumed step, if any);
        ``outputs`` (``output_dir``, ``save_every``, ``keep_last``, ``resume_from``,
        ``record``, ``progress``) as in
        :func:`~comlrl.algos.recipes.preference.recipe.train_madpo`."""
        return recipe.train_madpo(self.run, **outputs)

    def checkpoint(self, path: str | Path) -> Path:
        """Write a resumable step checkpoint now at ``path``
        (:func:`~comlrl.algos.recipes.preference.recipe.madpo_checkpoint`); returns it."""
        return recipe.madpo_checkpoint(self.run, path)

    def resume(self, checkpoint: str | Path, output_dir: str | Path | None = None) -> int:
        """Continue from a step checkpoint (agents, optimizers, data and random streams;
        :func:`~comlrl.algos.recipes.preference.recipe.madpo_resume`); returns its step. Build
        the trainer on the run's initial weights first: the reference models are copies
        of them.

        Raises:
            CheckpointError: the checkpoint is incomplete or does not fit this run.
        """
        return recipe.madpo_resume(self.run, checkpoint, output_dir)


class MARLHFTrainer:
    """MARLHF: learn a joint reward model from reward-gap preferences, then run RL on it.

    :meth:`collect_pairs` samples ``K`` candidates per agent on ``num_collect_batches``
    batches of the training prompts (the rollout machinery) and pairs the joint actions by
    the task reward's gap (as :class:`MADPOTrainer` does); :meth:`train_reward_model` fits
    :class:`JointRewardModel` (``reward_backbone`` + a linear head) with the
    Bradley-Terry loss; :meth:`reward_function` wraps it as a joint reward and
    :meth:`rl_trainer` builds any RL trainer (default
    :class:`~comlrl.algos.MultiAgentTrainer`) whose reward is the learned model.

    Args:
        agents, task, dataset, formatters, reward_func: as :class:`MADPOTrainer`; the
            reward function labels the pairs.
        config: a :class:`MADPOConfig` (sampling and pairing; its optimizer fields are
            unused here).
        reward_backbone: the reward model's LM (a ``transformers`` model; it is trained).
        reward_tokenizer: its tokenizer.
        reward_config: a :class:`RewardModelConfig`.
        num_collect_batches: batches of ``config.batch_size`` prompts to sample pairs from.
        eval_fraction: share of the pairs held out to evaluate the reward model.

    Raises:
        ConfigError: as :class:`MADPOTrainer`, or ``eval_fraction`` outside ``[0, 1)``.
    """

    def __init__(
        self,
        agents: Sequence[Any],
        config: MADPOConfig,
        *,
        reward_backbone: Any,
        reward_tokenizer: Any,
        reward_config: RewardModelConfig | None = None,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        num_collect_batches: int = 8,
        eval_fraction: float = 0.2,
    ) -> None:
        _check_config(config, MADPOConfig)
        reward_config = reward_config or RewardModelConfig()
        _check_config(reward_config, RewardModelConfig)
        if num_collect_batches < 1:
            raise ConfigError(f"num_collect_batches must be >= 1, got {num_collect_batches}")
        if not 0.0 <= eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        self.config, self.reward_config = config, reward_config
        self.agents = _agents(agents)
        self._source = {"task": task, "reward_func": reward_func}  # what config.yaml records
        self.env, self.dataset = _environment(
            len(self.agents), task, dataset, formatters, reward_func
        )
        if not self.dataset:
            raise ConfigError("the training dataset is empty")
        self.num_collect_batches, self.eval_fraction = num_collect_batches, eval_fraction
        self.reward_model = JointRewardModel(
            reward_backbone, freeze_backbone=reward_config.freeze_backbone
        )
        self.reward_tokenizer = reward_tokenizer
        self.pairs: list[JointPreferencePairs] = []

    def collect_pairs(self) -> list[JointPreferencePairs]:
        """Sample and pair joint actions (no training); returns one record per batch."""
        cfg = self.config
        run = recipe.MADPORun(
            config=cfg,
            agents=self.agents,
            ref_models=[],
            env=self.env,
            data=DataStream(self.dataset, seed=cfg.seed),
            optimizers=[],
            sampling=SamplingParams(
                num_generations=cfg.num_candidates,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
            ),
            tree=TreeSettings(num_turns=1, joint_mode=cfg.joint_mode),
            rng=random.Random(cfg.seed),
        )
        for i, agent in enumerate(self.agents):
            if hasattr(agent, "seed"):
                agent.seed(cfg.seed * 1_000_003 + i)
        self.pairs = []
        for _ in range(self.num_collect_batches):
            ro = rollout(
                run.agents,
                run.data.next_batch(cfg.batch_size),
                self.env,
                run.sampling,
                run.tree,
                rng=run.rng,
            )
            self.pairs.append(
                recipe.preference_pairs(
                    ro, min_gap=cfg.min_gap, pairs_per_prompt=cfg.pairs_per_prompt
                )
            )
        return self.pairs

    def train_reward_model(self) -> list[dict[str, float]]:
        """Fit the reward model on the collected pairs (collecting first if needed); the
        last ``eval_fraction`` of the batches are held out."""
        if not self.pairs:
            self.collect_pairs()
        held = int(round(len(self.pairs) * self.eval_fraction))
        train, held_out = self.pairs[: len(self.pairs) - held], self.pairs[len(self.pairs) - held :]
        return recipe.train_reward_model(
            self.reward_model, self.reward_tokenizer, train, self.reward_config, held_out or None
        )

    def reward_function(self) -> RewardModelReward:
        """The learned joint reward, for any recipe's ``reward_func``."""
        return RewardModelReward(
            self.reward_model,
            self.reward_tokenizer,
            lambda ex: [prompt_text(p) for p in self.env.root(ex).prompts],
            max_length=self.reward_config.max_length,
        )

    def rl_trainer(
        self, config: TrainConfig, trainer_cls: type | None = None, **kwargs: Any
    ) -> Any:
        """An RL trainer over the same agents and prompts, rewarded by the learned model.

        ``trainer_cls`` defaults to :class:`~comlrl.algos.MultiAgentTrainer`; it is called
        as ``trainer_cls(agents, config, dataset=..., formatters=..., reward_func=...,
        **kwargs)``, and with the default class evaluation (``eval_dataset=``,
        ``config.eval_every``) is scored by the task's own reward (``eval_env`` is this
        trainer's environment unless ``kwargs`` gives one): the learned reward is what the
        policy climbs, the task reward is whether that helped. Its ``config.yaml`` records
        ``algo: marlhf`` and the task (or reward function) the pairs were scored with.
        """
        from comlrl.algos.recipes.group_baseline.trainer import MultiAgentTrainer
        from comlrl.algos.training.lifecycle import run_record

        if trainer_cls is None:
            trainer_cls = MultiAgentTrainer
        formatters = [
            (lambda ex, a=a: self.env.root(ex).prompts[a]) for a in range(len(self.agents))
        ]
        if isinstance(trainer_cls, type) and issubclass(trainer_cls, MultiAgentTrainer):
            kwargs.setdefault("eval_env", self.env)
        trainer = trainer_cls(
            self.agents,
            config,
            dataset=self.dataset,
            formatters=formatters,
            reward_func=self.reward_function(),
            **kwargs,
        )
        if isinstance(trainer, MultiAgentTrainer):
            trainer.record = run_record(config, algo="marlhf", **self._source)
        return trainer
