"""MARLHF, one class (:class:`MARLHFRecipe`): learn a joint reward model from reward-gap
preferences, then run RL on it.

1. :meth:`~MARLHFRecipe.collect_pairs`: ``K`` candidates per agent on
   ``num_collect_batches`` batches of the training prompts (the rollout machinery), the
   joint actions paired by the task reward's gap (as MADPO pairs them);
2. :meth:`~MARLHFRecipe.train_reward_model`: :class:`~comlrl.algos.recipes.preference.marlhf.reward_model.JointRewardModel`
   (the backbone + a linear head on the last token of the joint response) fitted with the
   Bradley-Terry loss; saved under ``checkpoints/reward_model`` (a resumed run skips 1 and 2)
   and ``final/reward_model``;
3. the RL phase: the group-baseline recipe (composed:
   :meth:`~MARLHFRecipe.rl_recipe`) on the same agents and prompts, its reward the learned
   model (:meth:`~MARLHFRecipe.reward_function`), its evaluation scored by the task's own
   reward. The loop driver drives this class; its steps are the RL phase's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from comlrl.algos.recipes.group_baseline.recipe import GroupBaselineRecipe
from comlrl.algos.recipes.launch import load_eval_split, load_model, preflight
from comlrl.algos.recipes.preference.marlhf.config import MARLHFConfig
from comlrl.algos.recipes.preference.marlhf.reward_model import (
    REWARD_MODEL_DIR,
    JointRewardModel,
    RewardModelReward,
    load_reward_model,
    save_reward_model,
    train_reward_model,
)
from comlrl.algos.recipes.preference.pairs import JointPreferencePairs, preference_pairs
from comlrl.algos.rollout.agent import as_agents
from comlrl.algos.rollout.environment import Environment, Transition, build_environment
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.config.rl import ConfigError, RLConfig
from comlrl.algos.training.loop import Collective, Schedule, StepResult, run_loop
from comlrl.algos.training.run.data import JsonlWriter
from comlrl.algos.training.run.data_mixture import example_stream
from comlrl.algos.training.run.lifecycle import run_record
from comlrl.algos.training.run.outputs import RunOutputs
from comlrl.algos.training.run.reporting import read_metrics
from comlrl.algos.training.run.summary import summary_line
from comlrl.core import SamplingParams, Task
from comlrl.core.prompts import prompt_text

__all__ = ["MARLHFRecipe", "MARLHFTrainer"]


class MARLHFRecipe:
    """MARLHF: a joint reward model learnt from reward-gap preferences, then RL on it (see
    the module docstring).

    Args:
        agents, task, dataset, formatters, reward_func, transition, environment: as the
            group-baseline recipe's; the environment's reward labels the pairs.
        config: a :class:`~comlrl.algos.recipes.preference.marlhf.config.MARLHFConfig` (its
            ``reward_model`` section: the backbone, the pairs, the fit).
        eval_dataset: examples the RL phase's evaluation plays (scored by the task).
        reward_backbone, reward_tokenizer: the reward model's LM (a ``transformers`` model;
            it is trained) and tokenizer; default: ``config.backbone`` loaded with seed
            ``config.seed + 104729``.
        reward_model: instead of ``reward_backbone``, a ready
            :class:`~comlrl.algos.recipes.preference.marlhf.reward_model.JointRewardModel`
            (e.g. one shared with other code, or a subclass); it is trained.
        outputs, record: where the run writes and what ``config.yaml`` holds.

    Raises:
        ConfigError: a config of another type, an empty dataset, both ``reward_backbone``
            and ``reward_model``, or what the environment builder refuses.
    """

    algo: ClassVar[str] = "marlhf"

    def __init__(
        self,
        agents: Sequence[Any],
        config: MARLHFConfig,
        *,
        task: Task | None = None,
        dataset: Sequence[Mapping[str, Any]] | None = None,
        formatters: Sequence[Callable[[Mapping[str, Any]], Any]] | None = None,
        reward_func: Callable[..., Any] | None = None,
        transition: Transition | None = None,
        environment: Environment | None = None,
        eval_dataset: Sequence[Mapping[str, Any]] | None = None,
        reward_backbone: Any = None,
        reward_tokenizer: Any = None,
        reward_model: JointRewardModel | None = None,
        outputs: RunOutputs | None = None,
        record: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(config, MARLHFConfig):
            raise ConfigError(
                f"expected a MARLHFConfig, got {type(config).__name__}; build it with "
                "MARLHFConfig(...)"
            )
        self.config = config
        self.agents = as_agents(agents, **config.generation_options())
        self.task = task
        try:
            self.env, self.dataset = build_environment(
                len(self.agents), task=task, dataset=dataset, formatters=formatters,
                reward_func=reward_func, transition=transition, environment=environment,
                split=config.task.split,
            )  # fmt: skip
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not self.dataset:
            raise ConfigError("the training dataset is empty")
        if reward_model is not None and reward_backbone is not None:
            raise ConfigError(
                "give the reward model as reward_backbone= (an LM; a linear head is added) "
                "or reward_model= (a JointRewardModel), not both"
            )
        if reward_model is None and reward_backbone is None:
            reward_backbone, reward_tokenizer = load_model(
                config.backbone, config, config.seed + 104_729
            )
        self.reward_model = (
            reward_model
            if reward_model is not None
            else JointRewardModel(
                reward_backbone, freeze_backbone=config.reward_model.freeze_backbone
            )
        )
        if reward_tokenizer is None:
            raise ConfigError("reward_tokenizer= is needed with a reward model given here")
        self.reward_tokenizer = reward_tokenizer
        self.outputs = outputs if outputs is not None else RunOutputs.of(config)
        self.record = self.outputs.record(
            record
            if record is not None
            else run_record(config, algo=self.algo, task=task, reward_func=reward_func)
        )
        self.eval_dataset = eval_dataset
        self.pairs: list[JointPreferencePairs] = []
        #: the RL phase (built once the reward model is fit, or read back on resume)
        self.rl: GroupBaselineRecipe | None = None

    # --- what the launcher asks of the recipe (comlrl.algos.recipes.launch) ------------

    @classmethod
    def inputs(cls, config: Any) -> tuple[Any, list[Any], list[Any] | None]:
        """The task and its examples and, with evaluation on, ``eval_split``; the agents'
        and the backbone's names checked; a task whose agents call tools is refused."""
        models = [*config.models, config.backbone, *cls.more_models(config)]
        task, examples = preflight(config, models, refuse_tools=cls.algo)
        try:
            evals = (
                load_eval_split(task, config.eval_split, config.eval_limit)
                if config.eval_every
                else None
            )
        except BaseException:
            task.close()
            raise
        return task, examples, evals

    @classmethod
    def more_models(cls, config: Any) -> list[str]:
        """Models the run loads besides the agents' and the backbone (none)."""
        return []

    @classmethod
    def describe(cls, config: Any) -> str:
        """What the run does: pairs, the reward model, the RL steps."""
        rm = config.reward_model
        return (
            f"MARLHF: {rm.num_collect_batches} batches of pairs, reward model "
            f"{config.backbone}, then {config.num_steps} steps of estimator "
            f"{config.estimator} on its reward"
        )

    @classmethod
    def agent_options(cls, config: Any) -> dict[str, Any]:
        """The generation backend and prompt format of every agent."""
        return dict(config.generation_options())

    @property
    def output_dir(self) -> Path:
        """Where metrics, the reward model's rows and checkpoints go."""
        return self.outputs.output_dir

    @property
    def global_step(self) -> int:
        """RL steps taken so far."""
        return self.rl.global_step if self.rl is not None else 0

    # --- the pairs and the reward model --------------------------------------------------

    def collect_pairs(self) -> list[JointPreferencePairs]:
        """Sample and pair joint actions on ``num_collect_batches`` batches (no training);
        returns one record per batch."""
        cfg, rm = self.config, self.config.reward_model
        data = example_stream(self.dataset, seed=cfg.seed, task=cfg.task)
        sampling = SamplingParams.from_config(cfg, rm.num_generations)
        tree = TreeSettings(num_turns=1, joint_mode=cfg.joint_mode)
        rng = random.Random(cfg.seed)
        for i, agent in enumerate(self.agents):
            if hasattr(agent, "seed"):
                agent.seed(cfg.seed * 1_000_003 + i)
        self.pairs = []
        for _ in range(rm.num_collect_batches):
            ro = rollout(
                self.agents, data.next_batch(cfg.batch_size), self.env, sampling, tree, rng=rng
            )
            self.pairs.append(
                preference_pairs(ro, min_gap=rm.min_gap, pairs_per_prompt=rm.pairs_per_prompt)
            )
        return self.pairs

    def train_reward_model(self) -> list[dict[str, float]]:
        """Fit the reward model on the collected pairs (collecting first if needed); the
        last ``eval_fraction`` of the batches are held out. Returns the fit's rows."""
        if not self.pairs:
            self.collect_pairs()
        held = int(round(len(self.pairs) * self.config.reward_model.eval_fraction))
        train, held_out = self.pairs[: len(self.pairs) - held], self.pairs[len(self.pairs) - held :]
        return train_reward_model(
            self.reward_model,
            self.reward_tokenizer,
            train,
            self.config.reward_model,
            held_out or None,
        )

    def reward_function(self) -> RewardModelReward:
        """The learned joint reward, for any recipe's ``reward_func``."""
        return RewardModelReward(
            self.reward_model,
            self.reward_tokenizer,
            lambda ex: [prompt_text(p) for p in self.env.root(ex).prompts],
            max_length=self.config.reward_model.max_length,
        )

    def rl_recipe(
        self, config: RLConfig | None = None, eval_dataset: Sequence[Any] | None = None
    ) -> GroupBaselineRecipe:
        """The RL phase: the group-baseline recipe on the same agents and prompts, rewarded
        by the learned model, evaluated (``eval_dataset``, default the one this recipe was
        given; ``config.eval_every``) in this recipe's environment (the task's reward): the
        learned reward is what the policy climbs, the task reward is whether that helped.
        ``config``: the RL config (default this recipe's). ``config.yaml`` records this
        recipe's record."""
        formatters = [
            (lambda ex, a=a: self.env.root(ex).prompts[a]) for a in range(len(self.agents))
        ]
        return GroupBaselineRecipe(
            self.agents,
            config if config is not None else self.config,
            dataset=self.dataset,
            formatters=formatters,
            reward_func=self.reward_function(),
            eval_env=self.env,
            eval_dataset=eval_dataset if eval_dataset is not None else self.eval_dataset,
            outputs=self.outputs,
            record=self.record,
        )

    def fit(self) -> list[dict[str, float]]:
        """Pairs and the reward model's fit; the fit's rows go to
        ``reward_model_metrics.jsonl`` and the model to ``checkpoints/reward_model``."""
        out = self.output_dir
        out.mkdir(parents=True, exist_ok=True)
        (out / "reward_model_metrics.jsonl").unlink(missing_ok=True)
        self.collect_pairs()
        rows = self.train_reward_model()
        writer = JsonlWriter(out / "reward_model_metrics.jsonl")
        try:
            for row in rows:
                writer.write(row)
        finally:
            writer.close()
        save_reward_model(
            self.reward_model, self.reward_tokenizer, out / "checkpoints" / REWARD_MODEL_DIR
        )
        return rows

    # --- the loop: the RL phase's steps -------------------------------------------------

    def _rl(self) -> GroupBaselineRecipe:
        if self.rl is None:
            raise RuntimeError("the RL phase starts once the reward model is fit: call train()")
        return self.rl

    def step(self) -> StepResult:
        """One RL step on the learned reward."""
        return self._rl().step()

    def evaluate(self) -> dict[str, float]:
        """The agents' evaluation row, scored by the task's own reward."""
        return self._rl().evaluate()

    def checkpoint(self, path: str | Path | None = None) -> Path:
        """The RL phase's step checkpoint (the reward model is in ``checkpoints/reward_model``)."""
        return self._rl().checkpoint(path)

    def resume(self, path: str | Path) -> int:
        """Continue from the RL phase's step checkpoint ``path``: the reward model saved in
        ``checkpoints/reward_model`` is read back (the pairs and the fit are not done again;
        without it they are), the RL phase put back at its step, which is returned.

        Raises:
            CheckpointError: the checkpoint or the saved reward model does not fit.
        """
        saved = self.output_dir / "checkpoints" / REWARD_MODEL_DIR
        if (saved / "head.safetensors").is_file():
            load_reward_model(self.reward_model, saved)
        else:
            self.fit()
        self.rl = self.rl_recipe()
        return self.rl.resume(path)

    def save_final(self, path: Path) -> None:
        """The agents in ``path/agent_<i>`` and the reward model in ``path/reward_model``."""
        self._rl().save_final(path)
        if self._rl().is_main:
            save_reward_model(
                self.reward_model, self.reward_tokenizer, Path(path) / REWARD_MODEL_DIR
            )

    def schedule(self) -> Schedule:
        """The RL phase's schedule, labelled ``marlhf``."""
        return Schedule(**{**vars(self._rl().schedule()), "desc": self.algo})

    def collective(self) -> Collective:
        """The RL phase's."""
        return self._rl().collective()

    def train(self) -> list[dict[str, float]]:
        """Pairs, the reward model's fit (skipped when :meth:`resume` read it back), then
        the RL phase under the loop driver; returns the RL phase's rows. Closes the task.

        Raises:
            ConfigError: ``output_dir`` holds another run (without ``outputs.overwrite``).
            TrainingInterrupted: Ctrl-C or SIGTERM, after the step checkpoint.
            RewardFunctionError: the task's reward function failed.
        """
        try:
            if self.rl is None:
                self.outputs.check_folder()
                self.outputs.clear_earlier_run()
                self.fit()
                self.rl = self.rl_recipe()
            return run_loop(self, self.outputs)
        finally:
            self.close()

    def summary(self, history: Sequence[Mapping[str, Any]]) -> str:
        """The RL phase's closing line (its reward is the learned model's), and the task's
        reward on ``eval_split`` first -> last (``eval.jsonl``)."""
        out = self.output_dir
        line = summary_line(history, out) + " (reward: the learned reward model's)"
        evals = read_metrics(out / "eval.jsonl")
        if evals:
            line += (
                f"; task reward on {self.config.eval_split} (eval.jsonl): step "
                f"{evals[0]['step']} {float(evals[0]['reward_mean']):.3f} -> step "
                f"{evals[-1]['step']} {float(evals[-1]['reward_mean']):.3f}"
            )
        return line

    def close(self) -> None:
        """Stop the RL phase's worker threads and close the task (safe to call twice)."""
        if self.rl is not None:
            self.rl.close()
        if self.task is not None:
            self.task.close()


class MARLHFTrainer(MARLHFRecipe):
    """The MARLHF recipe (:class:`MARLHFRecipe`) under its public name."""
