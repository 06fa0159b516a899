"""The end-to-end run of MARLHF (``algo=marlhf``), its two phases and the reward model's
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

from collections.abc import Callable
from pathlib import Path
from typing import Any

from comlrl.algos.recipes.preference.config import MADPOConfig, RewardModelConfig
from comlrl.algos.recipes.run_config import eval_on_start_follows
from comlrl.algos.recipes.run_steps import (
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
from comlrl.algos.training.config import TrainConfig
from pydantic import Field, model_validator

__all__ = [
    "MARLHFRunConfig",
    "run_marlhf",
    "REWARD_MODEL_DIR",
    "save_reward_model",
    "load_reward_model",
]


class MARLHFRunConfig(TrainConfig):
    """MARLHF from the command line: :class:`~comlrl.algos.training.config.TrainConfig` for the RL
    phase (MAGRPO by default, on the learned reward) plus how preference pairs are sampled
    and the joint reward model is fit (:class:`~comlrl.algos.MARLHFTrainer`).

    Attributes:
        reward_model: the reward model's backbone (None: agent 0's model).
        reward: the reward model's training settings
            (:class:`~comlrl.algos.recipes.preference.config.RewardModelConfig`).
        num_candidates: ``K``, candidates per agent per prompt when sampling pairs (>= 2).
        min_gap: smallest task-reward gap that makes a pair.
        pairs_per_prompt: pairs kept per prompt, largest gap first.
        num_collect_batches: batches of ``batch_size`` prompts to sample pairs from.
        eval_fraction: share of the pair batches held out to evaluate the reward model.
        eval_every: as in ``TrainConfig``, but on by default (every 40 steps, and before
            the first step: ``eval_on_start``): the RL phase climbs the learned reward, and
            the evaluation rows (``eval.jsonl``) score the agents with the task's own reward
            on ``eval_split``, which says whether that helped.
    """

    output_dir: str = "runs/marlhf"
    eval_every: int = Field(40, ge=0)
    eval_on_start: bool = True
    reward_model: str | None = None
    reward: RewardModelConfig = Field(default_factory=lambda: RewardModelConfig(learning_rate=1e-3))
    num_candidates: int = Field(4, ge=2)
    min_gap: float = Field(0.0, ge=0)
    pairs_per_prompt: int = Field(1, ge=1)
    num_collect_batches: int = Field(8, ge=1)
    eval_fraction: float = Field(0.2, ge=0, lt=1)

    @model_validator(mode="before")
    @classmethod
    def _no_start_eval_when_off(cls, data: Any) -> Any:
        return eval_on_start_follows(data)


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
    from comlrl.algos.recipes.preference.marlhf.trainer import MARLHFTrainer
    from comlrl.algos.training.checkpoint import CheckpointError
    from comlrl.algos.training.data import JsonlWriter
    from comlrl.algos.training.reporting import read_metrics
    from comlrl.algos.training.run_summary import summary_line

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
            from comlrl.algos.training.lifecycle import run_record

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
    from comlrl.algos.training.saving import atomic_folder
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
    from comlrl.algos.training.checkpoint import CheckpointError
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
