"""MARLHF's trainer object: sample reward-gap pairs like MADPO, fit the joint reward model,
and hand it to an RL recipe as its reward function (:meth:`MARLHFTrainer.rl_trainer`).

The end-to-end run of MARLHF (``algo=marlhf``), its two phases and the reward model's
checkpoint: sample reward-gap pairs on the task, fit the joint reward model (saved under
``checkpoints/reward_model``, so a resumed run skips the pairs and the fit), then the
group-baseline recipe on its reward. From Python it is the run ``comlrl train algo=marlhf``
makes::

    from comlrl.algos import MARLHFRunConfig, RunOutputs, run_marlhf

    config = MARLHFRunConfig(output_dir="runs/marlhf", save_every=20)
    result = run_marlhf(config)  # both phases; result.history: the RL phase's rows
    # after Ctrl-C (TrainingInterrupted): the RL phase continues, the reward model is read
    result = run_marlhf(config, RunOutputs.of(config, resume=True))
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.algos.recipes.launch import (
    RunOutputs,
    RunResult,
    announce,
    load_agents,
    load_eval_split,
    load_model,
    preflight,
    quiet_transformers,
    resuming_line,
    setup_errors,
    start_outputs,
)
from comlrl.algos.recipes.preference.inputs import as_agents, check_config, environment
from comlrl.algos.recipes.preference.madpo.config import MADPOConfig
from comlrl.algos.recipes.preference.madpo.recipe import MADPORun
from comlrl.algos.recipes.preference.marlhf.config import MARLHFRunConfig, RewardModelConfig
from comlrl.algos.recipes.preference.marlhf.reward_model import (
    JointRewardModel,
    RewardModelReward,
    train_reward_model,
)
from comlrl.algos.recipes.preference.pairs import JointPreferencePairs, preference_pairs
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.config.rl import ConfigError, RLConfig
from comlrl.algos.training.run.data_mixture import example_stream
from comlrl.core import SamplingParams, Task
from comlrl.core.prompts import prompt_text

__all__ = [
    "MARLHFTrainer",
    "run_marlhf",
    "REWARD_MODEL_DIR",
    "save_reward_model",
    "load_reward_model",
]


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
        from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
        from comlrl.algos.training.run.lifecycle import run_record

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


def run_marlhf(
    config: MARLHFRunConfig,
    outputs: RunOutputs | None = None,
    *,
    algo: str = "marlhf",
    num_models: int | None = None,
    joint: Callable[[Any], tuple[list[Any], Any]] | None = None,
    rl_config: Any = None,
) -> RunResult:
    """``algo=marlhf``: :class:`~comlrl.algos.MARLHFTrainer`: sample reward-gap pairs on
    ``config.task``, fit the joint reward model (rows in ``reward_model_metrics.jsonl``,
    weights in ``final/reward_model`` and ``checkpoints/reward_model``), then the
    group-baseline recipe on its reward. With ``outputs.resume_from`` a run whose reward
    model was saved skips the pairs and the fit and continues its RL phase from that step
    checkpoint.

    ``algo=centralized_marlhf`` loads ``num_models`` (1) models, takes the one policy's
    ``(formatters, reward)`` from ``joint(task)`` instead of the task's own, and runs the
    RL phase with ``rl_config`` (the policy's one-agent config).

    Raises:
        ConfigError: a bad config, task, model name, a model that does not load, a
            folder that holds another run (without ``outputs.overwrite``), before training.
        CheckpointError: the step checkpoint or saved reward model does not fit.
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
        RewardFunctionError: the reward function failed.
    """
    import torch
    from comlrl.algos.recipes.preference.marlhf.recipe import MARLHFTrainer
    from comlrl.algos.training.run.checkpoint import CheckpointError
    from comlrl.algos.training.run.data import JsonlWriter
    from comlrl.algos.training.run.reporting import read_metrics
    from comlrl.algos.training.run.summary import summary_line

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    if rl_config is not None:
        rl_config = outputs.apply(rl_config)
    outputs.check_folder()
    backbone_name = config.reward_model or config.model_for(0)
    n_models = config.num_agents if num_models is None else num_models
    who = f"{config.num_agents} agents"
    if n_models != config.num_agents:
        who = f"{n_models} policy for {config.num_agents} roles"
    task, examples = preflight(config, [*config.models, backbone_name], refuse_tools=algo)
    try:
        with setup_errors():
            eval_examples = None
            if config.eval_every:
                eval_examples = load_eval_split(task, config.eval_split)
            quiet_transformers()
            announce(
                config,
                len(examples),
                f"MARLHF: {config.num_collect_batches} batches of pairs, reward model "
                f"{backbone_name}, then {config.num_steps} steps of estimator "
                f"{config.estimator} on its reward",
                who,
            )
            torch.manual_seed(config.seed)
            agents = load_agents(config, n_models, **config.generation_options())
            backbone, backbone_tok = load_model(backbone_name, config, config.seed + 104_729)
            pairing = MADPOConfig.build(
                num_agents=n_models,
                num_candidates=config.num_candidates,
                max_new_tokens=config.max_new_tokens,
                temperature=config.temperature,
                top_p=config.top_p,
                top_k=config.top_k,
                joint_mode=config.joint_mode,
                min_gap=config.min_gap,
                pairs_per_prompt=config.pairs_per_prompt,
                batch_size=config.batch_size,
                seed=config.seed,
                device=config.device,
            )
            marlhf = MARLHFTrainer(
                agents,
                pairing,
                reward_backbone=backbone,
                reward_tokenizer=backbone_tok,
                reward_config=config.reward,
                dataset=examples,
                **(
                    {"task": task}
                    if joint is None
                    else dict(zip(("formatters", "reward_func"), joint(task), strict=True))
                ),
                num_collect_batches=config.num_collect_batches,
                eval_fraction=config.eval_fraction,
            )
            out = start_outputs(config, algo, outputs)
            saved_rm = out / "checkpoints" / REWARD_MODEL_DIR
            fitted = outputs.resume_from is not None and (saved_rm / "head.safetensors").is_file()
            if fitted:
                load_reward_model(marlhf, saved_rm)  # the pairs and the fit are done
    except BaseException:
        task.close()
        raise
    try:  # a bug from here on keeps its traceback (and the run its last checkpoint)
        if not fitted:
            (out / "reward_model_metrics.jsonl").unlink(missing_ok=True)
            marlhf.collect_pairs()
            writer = JsonlWriter(out / "reward_model_metrics.jsonl")
            try:
                for row in marlhf.train_reward_model():
                    writer.write(row)
            finally:
                writer.close()
            save_reward_model(marlhf, saved_rm)
        save_reward_model(marlhf, out / "final" / "reward_model")
        trainer = marlhf.rl_trainer(rl_config or config, eval_dataset=eval_examples)
        if joint is not None:  # config.yaml: this recipe, the task it played
            from comlrl.algos.training.run.lifecycle import run_record

            trainer.record = run_record(config, algo=algo, task=task)
        if outputs.resume_from is not None:
            try:
                step = trainer.resume(outputs.resume_from)
            except CheckpointError as exc:
                raise CheckpointError(f"cannot resume from {outputs.resume_from}: {exc}") from None
            print(resuming_line(out, step, config.num_steps, outputs.resume_from))
        history = trainer.train()
    finally:
        task.close()
    line = summary_line(history, out) + " (reward: the learned reward model's)"
    evals = read_metrics(out / "eval.jsonl")
    if evals:
        line += (
            f"; task reward on {config.eval_split} (eval.jsonl): step {evals[0]['step']} "
            f"{float(evals[0]['reward_mean']):.3f} -> step {evals[-1]['step']} "
            f"{float(evals[-1]['reward_mean']):.3f}"
        )
    return RunResult(history, line, out)


#: Folder under ``output_dir/checkpoints`` with MARLHF's fitted reward model: a resumed
#: run's RL phase reads its reward from it instead of sampling pairs and fitting again.
REWARD_MODEL_DIR = "reward_model"


def save_reward_model(marlhf: Any, path: Path) -> None:
    """The reward model's backbone and tokenizer (Hugging Face format) and its linear head
    (``head.safetensors``: ``weight [1, H]``, ``bias [1]``, float32), written atomically
    (a temporary sibling folder, then renamed)."""
    from comlrl.algos.training.run.saving import atomic_folder
    from safetensors.torch import save_file

    model = marlhf.reward_model
    with atomic_folder(path) as tmp:
        model.backbone.save_pretrained(tmp)
        marlhf.reward_tokenizer.save_pretrained(tmp)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()},
            str(tmp / "head.safetensors"),
        )


def load_reward_model(marlhf: Any, path: Path) -> None:
    """Load what :func:`save_reward_model` wrote into ``marlhf.reward_model`` in place.

    Raises:
        CheckpointError: the folder cannot be read or does not fit the reward model.
    """
    from comlrl.algos.training.run.checkpoint import CheckpointError
    from safetensors.torch import load_file

    model = marlhf.reward_model
    backbone = model.backbone
    try:
        saved = type(backbone).from_pretrained(str(path), dtype=next(backbone.parameters()).dtype)
        backbone.load_state_dict(saved.state_dict(), strict=True)
        model.head.load_state_dict(load_file(str(path / "head.safetensors")))
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"could not load the reward model {str(path)!r}: {exc}") from None
    model.eval()
