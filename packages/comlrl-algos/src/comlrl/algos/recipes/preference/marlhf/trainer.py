"""MARLHF's trainer object: sample reward-gap pairs like MADPO, fit the joint reward model,
and hand it to an RL recipe as its reward function (:meth:`MARLHFTrainer.rl_trainer`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl.algos.recipes.preference.config import MADPOConfig, RewardModelConfig
from comlrl.algos.recipes.preference.inputs import as_agents, check_config, environment
from comlrl.algos.recipes.preference.madpo.recipe import MADPORun
from comlrl.algos.recipes.preference.marlhf.reward_model import (
    JointRewardModel,
    RewardModelReward,
    train_reward_model,
)
from comlrl.algos.recipes.preference.pairs import JointPreferencePairs, preference_pairs
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.config import ConfigError, RLConfig
from comlrl.algos.training.data_mixture import example_stream
from comlrl.core import SamplingParams, Task
from comlrl.core.prompts import prompt_text

__all__ = ["MARLHFTrainer"]


class MARLHFTrainer:
    """MARLHF: learn a joint reward model from reward-gap preferences, then run RL on it.

    :meth:`collect_pairs` samples ``K`` candidates per agent on ``num_collect_batches``
    batches of the training prompts (the rollout machinery) and pairs the joint actions by
    the task reward's gap (as :class:`MADPOTrainer` does); :meth:`train_reward_model` fits
    :class:`JointRewardModel` (``reward_backbone`` + a linear head) with the
    Bradley-Terry loss; :meth:`reward_function` wraps it as a joint reward and
    :meth:`rl_trainer` builds any RL trainer (default
    :class:`~comlrl.algos.MultiAgentTrainer`) whose reward is the learned model.
    ``comlrl.trainers.MARLHFTrainer`` (CoMLRL 1.4.3's arguments) runs the same algorithm:
    this trainer's pairs and reward model, then its RL trainer on the learned reward.

    Args:
        agents, task, dataset, formatters, reward_func: as :class:`MADPOTrainer`; the
            reward function labels the pairs.
        config: a :class:`MADPOConfig` (sampling and pairing; its optimizer fields are
            unused here).
        reward_backbone: the reward model's LM (a ``transformers`` model; it is trained).
        reward_model: instead of ``reward_backbone``, a ready :class:`JointRewardModel`
            (e.g. one shared with other code, or a subclass); it is trained.
        reward_tokenizer: its tokenizer.
        reward_config: a :class:`RewardModelConfig`.
        num_collect_batches: batches of ``config.batch_size`` prompts to sample pairs from.
        eval_fraction: share of the pairs held out to evaluate the reward model.

    Raises:
        ConfigError: as :class:`MADPOTrainer`, ``eval_fraction`` outside ``[0, 1)``, or
            not exactly one of ``reward_backbone`` and ``reward_model``.
    """

    def __init__(
        self,
        agents: Sequence[Any],
        config: MADPOConfig,
        *,
        reward_backbone: Any = None,
        reward_tokenizer: Any,
        reward_model: JointRewardModel | None = None,
        reward_config: RewardModelConfig | None = None,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], str]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        num_collect_batches: int = 8,
        eval_fraction: float = 0.2,
    ) -> None:
        check_config(config, MADPOConfig)
        reward_config = reward_config or RewardModelConfig()
        check_config(reward_config, RewardModelConfig)
        if num_collect_batches < 1:
            raise ConfigError(f"num_collect_batches must be >= 1, got {num_collect_batches}")
        if not 0.0 <= eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        self.config, self.reward_config = config, reward_config
        self.agents = as_agents(agents)
        self._source = {"task": task, "reward_func": reward_func}  # what config.yaml records
        self.env, self.dataset = environment(
            len(self.agents), task, dataset, formatters, reward_func
        )
        if not self.dataset:
            raise ConfigError("the training dataset is empty")
        self.num_collect_batches, self.eval_fraction = num_collect_batches, eval_fraction
        if (reward_backbone is None) == (reward_model is None):
            raise ConfigError(
                "give the reward model as reward_backbone= (an LM; a linear head is added) "
                "or reward_model= (a JointRewardModel), exactly one of them"
            )
        self.reward_model = (
            reward_model
            if reward_model is not None
            else JointRewardModel(reward_backbone, freeze_backbone=reward_config.freeze_backbone)
        )
        self.reward_tokenizer = reward_tokenizer
        self.pairs: list[JointPreferencePairs] = []

    def collect_pairs(self) -> list[JointPreferencePairs]:
        """Sample and pair joint actions (no training); returns one record per batch."""
        cfg = self.config
        run = MADPORun(
            config=cfg,
            agents=self.agents,
            ref_models=[],
            env=self.env,
            data=example_stream(self.dataset, seed=cfg.seed, task=getattr(cfg, "task", None)),
            optimizers=[],
            sampling=SamplingParams.from_config(cfg, cfg.num_candidates),
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
                preference_pairs(ro, min_gap=cfg.min_gap, pairs_per_prompt=cfg.pairs_per_prompt)
            )
        return self.pairs

    def train_reward_model(self) -> list[dict[str, float]]:
        """Fit the reward model on the collected pairs (collecting first if needed); the
        last ``eval_fraction`` of the batches are held out."""
        if not self.pairs:
            self.collect_pairs()
        held = int(round(len(self.pairs) * self.eval_fraction))
        train, held_out = self.pairs[: len(self.pairs) - held], self.pairs[len(self.pairs) - held :]
        return train_reward_model(
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

    def rl_trainer(self, config: RLConfig, trainer_cls: type | None = None, **kwargs: Any) -> Any:
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
