"""``comlrl train algo=marlhf``: sample reward-gap pairs, fit the joint reward model
(saved so a resumed run skips the fit), then the group-baseline recipe on its reward."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from comlrl.algos.cli.run_configs import MARLHFRunConfig
from comlrl.algos.cli.run_steps import (
    RunRequest,
    _err,
    _load,
    _quiet_transformers,
    _start_outputs,
    announce,
    load_agents,
    load_eval_split,
    preflight,
    resuming_line,
    stopped,
)
from comlrl.algos.recipes.preference.config import MADPOConfig
from comlrl.algos.training.config import ConfigError

__all__ = [
    "run_marlhf",
    "REWARD_MODEL_DIR",
]


def run_marlhf(
    config: MARLHFRunConfig,
    request: RunRequest,
    *,
    algo: str = "marlhf",
    num_models: int | None = None,
    joint: Callable[[Any], tuple[list[Any], Any]] | None = None,
    rl_config: Any = None,
) -> int:
    """``algo=marlhf``: :class:`~comlrl.algos.MARLHFTrainer`: sample reward-gap pairs on
    ``config.task``, fit the joint reward model (rows in ``reward_model_metrics.jsonl``,
    weights in ``final/reward_model``), then the group-baseline recipe on its reward.

    ``algo=centralized_marlhf`` loads ``num_models`` (1) models, takes the one policy's
    ``(formatters, reward)`` from ``joint(task)`` instead of the task's own, and runs the
    RL phase with ``rl_config`` (the policy's one-agent config)."""
    import torch
    from comlrl.algos.recipes.preference.marlhf.trainer import MARLHFTrainer
    from comlrl.algos.training import lifecycle
    from comlrl.algos.training.checkpoint import CheckpointError
    from comlrl.algos.training.data import JsonlWriter
    from comlrl.algos.training.run_summary import read_metrics, summary_line
    from comlrl.core import RewardFunctionError

    backbone_name = config.reward_model or config.model_for(0)
    n_models = config.num_agents if num_models is None else num_models
    who = f"{config.num_agents} agents"
    if n_models != config.num_agents:
        who = f"{n_models} policy for {config.num_agents} roles"
    try:
        task, examples = preflight(config, [*config.models, backbone_name], refuse_tools=algo)
    except ConfigError as exc:
        return _err(str(exc))
    try:
        eval_examples = None
        if config.eval_every:
            eval_examples = load_eval_split(task, config.eval_split)
        _quiet_transformers()
        announce(
            config,
            len(examples),
            f"MARLHF: {config.num_collect_batches} batches of pairs, reward model "
            f"{backbone_name}, then {config.num_steps} steps of estimator {config.estimator} "
            "on its reward",
            who,
        )
        torch.manual_seed(config.seed)
        agents = load_agents(config, n_models, **config.generation_options())
        backbone, backbone_tok = _load(backbone_name, config, config.seed + 104_729)
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
        out = _start_outputs(config, algo, request)
        saved_rm = out / "checkpoints" / REWARD_MODEL_DIR
        fitted = request.resume_from is not None and (saved_rm / "head.safetensors").is_file()
        if fitted:
            _load_reward_model(marlhf, saved_rm)  # the pairs and the fit are done
    except (OSError, ValueError) as exc:  # before training: ConfigError, CheckpointError, loads
        task.close()
        return _err(str(exc))
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
            _save_reward_model(marlhf, saved_rm)
        _save_reward_model(marlhf, out / "final" / "reward_model")
        try:
            trainer = marlhf.rl_trainer(rl_config or config, eval_dataset=eval_examples)
        except ConfigError as exc:
            return _err(str(exc))
        if joint is not None:  # config.yaml: this recipe, the task it played
            from comlrl.algos.training.lifecycle import run_record

            trainer.record = run_record(config, algo=algo, task=task)
        if request.resume_from is not None:
            try:
                step = trainer.resume(request.resume_from)
            except CheckpointError as exc:
                return _err(f"cannot resume from {request.resume_from}: {exc}")
            print(resuming_line(out, step, config.num_steps, request.resume_from))
        history = trainer.train()
    except (RewardFunctionError, lifecycle.TrainingInterrupted) as exc:
        return stopped(exc)
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
    print(line)
    return 0


#: Folder under ``output_dir/checkpoints`` with MARLHF's fitted reward model: a resumed
#: run's RL phase reads its reward from it instead of sampling pairs and fitting again.
REWARD_MODEL_DIR = "reward_model"


def _save_reward_model(marlhf: Any, path: Path) -> None:
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


def _load_reward_model(marlhf: Any, path: Path) -> None:
    """Load what :func:`_save_reward_model` wrote into ``marlhf.reward_model`` in place.

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
