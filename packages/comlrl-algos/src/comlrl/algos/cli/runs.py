"""End-to-end command-line runs of the registered recipes (:mod:`.registry`).

Each ``run_*`` function takes its recipe's validated config and a :class:`RunRequest` and
returns the exit code of ``comlrl train``: 0 done, 1 the reward function failed, 2 a bad
config or data (reported before any model loads where it can be), 130 interrupted. Each
one checks the task or data, loads the agents or model, trains through the library's own
recipe or trainer, writes one row per step to ``output_dir/metrics.jsonl`` and the final
weights to ``output_dir/final/`` (Hugging Face format, loadable by ``comlrl eval`` and
``from_pretrained``), and prints a closing summary line.

The ``*RunConfig`` classes are the library configs plus what a command-line run needs
(model names, task or data file, ``output_dir``, dtype); the library configs are unchanged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from comlrl.algos.models.loading import DEFAULT_MODEL
from comlrl.algos.recipes.preference.recipe import (
    DPOConfig,
    MADPOConfig,
    RewardModelConfig,
    SFTConfig,
)
from comlrl.algos.training.config import ConfigError, TaskConfig, TrainConfig
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "RunRequest",
    "SFTRunConfig",
    "DPORunConfig",
    "MADPORunConfig",
    "MARLHFRunConfig",
    "read_jsonl_rows",
    "run_group_baseline",
    "run_iac",
    "run_maac",
    "run_madpo",
    "run_marlhf",
    "run_sft",
    "run_dpo",
]


@dataclass(frozen=True)
class RunRequest:
    """What ``comlrl train`` decided before a recipe runs.

    Attributes:
        clear_earlier: ``--overwrite`` on an ``output_dir`` that holds a run: delete its
            outputs once the models have loaded (so a failed load deletes nothing).
        resume_from: the step checkpoint of ``--resume`` (recipes registered
            ``resumable``).
    """

    clear_earlier: bool = False
    resume_from: Path | None = None


def _err(message: str) -> int:
    print(f"comlrl: {message}", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------- configs


class _CommandLineRun(BaseModel):
    """Fields of a command-line run that the library configs leave to the caller."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    output_dir: str = Field(
        "runs/default", description="Where metrics.jsonl, config.yaml and final/ go."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    prompt_format: Literal["auto", "chat", "raw"] = Field(
        "auto",
        description="chat: the tokenizer's chat template on the task's prompt messages; raw: "
        "the prompt text; auto: chat when the tokenizer has a chat template.",
    )
    trust_remote_code: bool = False
    progress: bool = True
    save_every: int = Field(
        0, ge=0, description="Step checkpoint every N steps and at the last; 0 = only on Ctrl-C."
    )
    keep_last: int | None = Field(
        None, ge=1, description="Keep the newest N step checkpoints (None = all); final/ stays."
    )

    def run_outputs(self, request: RunRequest, algo: str) -> dict[str, Any]:
        """The run-output arguments of the preference recipes' ``train_*`` functions: where
        this run writes (``config.yaml`` records ``algo`` for ``--resume``), how often it
        checkpoints, and the step checkpoint ``--resume`` continues from."""
        return {
            "output_dir": Path(self.output_dir),
            "save_every": self.save_every,
            "keep_last": self.keep_last,
            "resume_from": request.resume_from,
            "record": {"algo": algo, **self.model_dump()},
            "progress": self.progress,
        }


class _OneModelRun(_CommandLineRun):
    #: the string fields every ``data`` / ``eval_data`` row must have.
    row_keys: ClassVar[tuple[str, ...]] = ()
    models: list[str] = Field(
        default_factory=lambda: [DEFAULT_MODEL],
        description=f"The one model to train (HF id, local path, or {DEFAULT_MODEL!r}).",
    )
    data: str | None = Field(None, description="JSON-lines file of training rows.")
    eval_data: str | None = Field(None, description="JSON-lines file of held-out rows.")

    @model_validator(mode="after")
    def _one_model_and_data(self) -> _OneModelRun:
        if len(self.models) != 1:
            raise ValueError(
                f"this recipe trains one model but models lists {len(self.models)}: "
                f"{self.models!r}; give one (--model NAME once, or models=[NAME])"
            )
        keys = self.row_keys
        example = json.dumps({k: "..." for k in keys})
        if self.data is None:
            raise ValueError(
                f"needs data=PATH.jsonl, a JSON-lines file with one {example} row per line "
                "(there is no built-in data set for it: the built-in coop_story task has "
                "seeds and a reward, not reference texts)"
            )
        for key, path in (("data", self.data), ("eval_data", self.eval_data)):
            if path is not None and not Path(path).expanduser().is_file():
                raise ValueError(
                    f"{key}={path!r}: no such file; give a JSON-lines file of {example} rows"
                )
        return self


class SFTRunConfig(SFTConfig, _OneModelRun):
    """:class:`~comlrl.algos.recipes.preference.recipe.SFTConfig` plus the command line's model,
    ``data`` / ``eval_data`` files of ``{"prompt", "completion"}`` rows, and outputs."""

    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "completion")
    output_dir: str = "runs/sft"


class DPORunConfig(DPOConfig, _OneModelRun):
    """:class:`~comlrl.algos.recipes.preference.recipe.DPOConfig` plus the command line's model,
    ``data`` / ``eval_data`` files of ``{"prompt", "chosen", "rejected"}`` rows, and outputs."""

    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected")
    output_dir: str = "runs/dpo"


class MADPORunConfig(MADPOConfig, _CommandLineRun):
    """:class:`~comlrl.algos.recipes.preference.recipe.MADPOConfig` plus the agents' models, the
    task and outputs. ``learning_rate`` defaults to 1e-3, ``num_steps`` to 60 and
    ``optimizer`` to RAdam (Liu et al. 2020), which suit the built-in 260K-parameter
    stories260k (pretrained LLMs want about 1e-6 to 1e-5). Measured on the built-in
    ``coop_story`` task, `comlrl train algo=madpo` with seeds 0-2: training reward, first ->
    last quarter of the 60 steps, +0.20 / +0.17 / +0.18 with RAdam; AdamW's first steps at this
    rate (bias-corrected second moments from a single pair batch) overshoot and the reward
    fell (-0.06, -0.08 for seeds 0, 1).

    Attributes:
        eval_split: task split for held-out reward and pair margin (None: no evaluation).
        eval_limit: evaluate on the first N examples of ``eval_split`` only.
    """

    output_dir: str = "runs/madpo"
    learning_rate: float = Field(1e-3, gt=0)
    optimizer: Literal["adamw", "radam", "sgd"] = "radam"
    num_steps: int = Field(60, ge=1)
    batch_size: int = Field(4, ge=1, description="Prompts per step.")
    models: list[str] = Field(default_factory=lambda: [DEFAULT_MODEL])
    task: TaskConfig = Field(default_factory=TaskConfig)
    eval_split: str | None = None
    eval_limit: int | None = Field(None, ge=1)
    report_to: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        ["jsonl"], description="As TrainConfig.report_to: jsonl, tensorboard, wandb."
    )
    wandb_project: str = Field("comlrl", description="W&B project name (report_to wandb).")
    reward_curve: bool = Field(True, description="Write output_dir/reward_curve.png at the end.")

    _report_to_list = field_validator("report_to", mode="before")(
        TrainConfig._report_to_list.__func__  # type: ignore[attr-defined]
    )

    @model_validator(mode="after")
    def _models_fit(self) -> MADPORunConfig:
        if len(self.models) not in (1, self.num_agents):
            raise ValueError(
                f"models lists {len(self.models)} models for num_agents={self.num_agents}; "
                "give one model for all agents or exactly one per agent."
            )
        return self

    def model_for(self, agent: int) -> str:
        """Model name or path of agent ``agent`` (0-based)."""
        return self.models[0] if len(self.models) == 1 else self.models[agent]


class MARLHFRunConfig(TrainConfig):
    """MARLHF from the command line: :class:`~comlrl.algos.training.config.TrainConfig` for the RL
    phase (MAGRPO by default, on the learned reward) plus how preference pairs are sampled
    and the joint reward model is fit (:class:`~comlrl.algos.MARLHFTrainer`).

    Attributes:
        reward_model: the reward model's backbone (None: agent 0's model).
        reward: the reward model's training settings
            (:class:`~comlrl.algos.recipes.preference.recipe.RewardModelConfig`).
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


# --------------------------------------------------------------------------- shared steps


def read_jsonl_rows(path: str | Path, keys: Sequence[str], what: str) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file, each checked to hold string ``keys``.

    Blank lines are skipped; every other line must be a JSON object.

    Raises:
        ConfigError: the file cannot be read, a line is not a JSON object (with its line
            number), a row lacks one of ``keys`` or it is not a string, or no rows.
    """
    p = Path(path).expanduser()
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} data {str(p)!r}: {exc}") from None
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{p}:{number}: not valid JSON ({exc.msg}); write one JSON object per line"
            ) from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"{p}:{number}: a JSON {type(row).__name__}, expected an object with keys {list(keys)}"
            )
        missing = [k for k in keys if not isinstance(row.get(k), str)]
        if missing:
            raise ConfigError(
                f"{p}:{number}: lacks string field(s) {missing} (has {sorted(row)}); every "
                f"{what} row needs {list(keys)}"
            )
        rows.append(row)
    if not rows:
        raise ConfigError(
            f"{what} data {str(p)!r} has no rows; give one JSON object per line with {list(keys)}"
        )
    return rows


def _start_outputs(config: Any, algo: str, request: RunRequest) -> Path:
    """Clear an earlier run's outputs (``--overwrite``) and write ``config.yaml`` (with
    ``algo``), before the recipe's loop starts."""
    import yaml
    from comlrl.algos.training.lifecycle import clear_run_outputs

    out = Path(config.output_dir)
    if request.clear_earlier:
        clear_run_outputs(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(
        yaml.safe_dump({"algo": algo, **config.model_dump()}, sort_keys=False)
    )
    return out


def _loss_summary(history: Sequence[Mapping[str, Any]], out: Path, key: str = "loss") -> str:
    """``done: N steps, <key> first quarter a -> last quarter b (+d); outputs in ...``."""
    from comlrl.algos.training.reporting import quarter_means

    where = f"outputs in {out}/ (metrics.jsonl, final/agent_*)"
    if not history:
        return f"done: 0 steps; {where}"
    first, last = quarter_means([float(r[key]) for r in history])
    n = len(history)
    return (
        f"done: {n} step{'s' if n != 1 else ''}, {key} first quarter {first:.3f} -> last "
        f"quarter {last:.3f} ({last - first:+.3f}); {where}"
    )


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar (ours), not one per load and save


def _load(name: str, config: Any, seed: int) -> tuple[Any, Any]:
    from comlrl.algos.models.loading import load_model_and_tokenizer

    return load_model_and_tokenizer(
        name, seed=seed, dtype=config.dtype, trust_remote_code=config.trust_remote_code
    )


# --------------------------------------------------------------------------- RL recipes


def run_group_baseline(config: TrainConfig, request: RunRequest) -> int:
    """``algo=magrpo`` / ``mareinforce`` / ``marloo`` / ``maremax``:
    :class:`~comlrl.algos.MultiAgentTrainer` with ``config.estimator``."""
    from comlrl.algos.recipes.group_baseline.trainer import MultiAgentTrainer

    return _run_policy_gradient(config, request, MultiAgentTrainer, f"estimator {config.estimator}")


def run_iac(config: Any, request: RunRequest) -> int:
    """``algo=iac``: :class:`~comlrl.algos.IACTrainer` (a critic per agent)."""
    from comlrl.algos.recipes.actor_critic.trainer import IACTrainer

    return _run_policy_gradient(
        config, request, IACTrainer, f"IAC ({config.critic_mode} {config.critic_type}-critics)"
    )


def run_maac(config: Any, request: RunRequest) -> int:
    """``algo=maac``: :class:`~comlrl.algos.MAACTrainer` (one centralised critic)."""
    from comlrl.algos.recipes.actor_critic.trainer import MAACTrainer

    return _run_policy_gradient(
        config, request, MAACTrainer, f"MAAC (centralised {config.critic_type}-critic)"
    )


def _run_policy_gradient(
    config: TrainConfig, request: RunRequest, trainer_cls: Callable[..., Any], label: str
) -> int:
    """Task -> agents -> trainer -> train -> summary, the run ``comlrl train`` has always
    made (for the actor-critic trainers too: the same task, agents and outputs)."""
    import torch
    from comlrl.algos.cli.preflight import check_model_names, prepare_task
    from comlrl.algos.models import distributed
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.training import lifecycle
    from comlrl.algos.training.reporting import check_report_to, summary_line
    from comlrl.core import RewardFunctionError

    main = distributed.is_main()
    try:  # everything that can be checked before the models load
        check_report_to(config.report_to)
        check_model_names(config.models)
        task, examples = prepare_task(config)
    except ConfigError as exc:
        return _err(str(exc))
    _quiet_transformers()
    world = distributed.rank_and_world()[1]
    if main:
        print(
            f"comlrl: {config.num_agents} agents ({', '.join(config.models)}) on {config.task.name} "
            f"({len(examples)} examples), {label}, {config.num_steps} step"
            f"{'s' if config.num_steps != 1 else ''} "
            f"of {config.batch_size} prompts x {config.num_generations} completions; "
            f"outputs in {config.output_dir}/",
            file=sys.stderr,
        )
        if world > 1:
            print(
                f"comlrl: data parallel over {world} processes ({config.data_parallel}), "
                f"{config.batch_size // world} prompts each",
                file=sys.stderr,
            )
    torch.manual_seed(config.seed)
    agents = []
    try:
        for i in range(config.num_agents):
            model, tok = _load(config.model_for(i), config, config.seed + i)
            agents.append(HFAgent(model, tok, name=f"agent_{i}", **config.generation_options()))
        trainer = trainer_cls(agents, config, task=task, dataset=examples)
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        task.close()
        return _err(str(exc))
    if request.clear_earlier and main:  # --overwrite, now that the task and models have loaded
        lifecycle.clear_run_outputs(config.output_dir)
    if request.resume_from is not None:
        from comlrl.algos.training.checkpoint import CheckpointError

        try:
            step = trainer.resume(request.resume_from)
        except (CheckpointError, NotImplementedError) as exc:
            task.close()
            trainer.run.close()
            return _err(f"cannot resume from {request.resume_from}: {exc}")
        if main:
            print(
                f"resuming {config.output_dir} at step {step} of {config.num_steps} (from {request.resume_from})"
            )
        if step >= config.num_steps:
            task.close()
            trainer.run.close()
            print(
                f"nothing to do: the run already has {step} steps; pass num_steps=N to train longer"
            )
            return 0
    try:
        history = trainer.train()
    except lifecycle.TrainingInterrupted as exc:
        print(f"comlrl: {exc.message()}", file=sys.stderr)
        return 130
    except RewardFunctionError as exc:
        print(f"comlrl: the reward function failed, training stopped: {exc}", file=sys.stderr)
        return 1
    if main:
        print(summary_line(history, config.output_dir))
    return 0


def run_madpo(config: MADPORunConfig, request: RunRequest) -> int:
    """``algo=madpo``: :class:`~comlrl.algos.MADPOTrainer` on ``config.task``; each agent's
    final weights in ``final/agent_<i>``."""
    from comlrl.algos.cli.preflight import check_model_names, prepare_task
    from comlrl.algos.recipes.preference.trainers import MADPOTrainer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.training import lifecycle
    from comlrl.algos.training.reporting import check_report_to, reporters_for

    try:
        check_report_to(config.report_to)
        check_model_names(config.models)
        task, examples = prepare_task(
            TrainConfig(models=config.models, num_agents=config.num_agents, task=config.task)
        )
    except ConfigError as exc:
        return _err(str(exc))
    try:
        eval_examples = None
        if config.eval_split is not None:
            try:
                eval_examples = list(task.load(config.eval_split))[: config.eval_limit]
            except (ValueError, KeyError, OSError) as exc:
                raise ConfigError(f"eval_split={config.eval_split!r}: {exc}") from None
        _quiet_transformers()
        print(
            f"comlrl: {config.num_agents} agents ({', '.join(config.models)}) on {config.task.name} "
            f"({len(examples)} examples), MADPO, {config.num_steps} steps of {config.batch_size} "
            f"prompts x {config.num_candidates} candidates; outputs in {config.output_dir}/",
            file=sys.stderr,
        )
        agents = [
            HFAgent(
                *_load(config.model_for(i), config, config.seed + i),
                name=f"agent_{i}",
                prompt_format=config.prompt_format,
            )
            for i in range(config.num_agents)
        ]
        trainer = MADPOTrainer(
            agents, config, task=task, dataset=examples, eval_dataset=eval_examples
        )
        out = _start_outputs(config, "madpo", request)
        if request.resume_from is not None:
            step = trainer.resume(request.resume_from, out)
            print(
                f"resuming {out} at step {step} of {config.num_steps} (from {request.resume_from})"
            )
    except (OSError, ValueError) as exc:  # before training: ConfigError, CheckpointError, loads
        task.close()
        return _err(str(exc))
    try:  # a bug from here on keeps its traceback (and the run its last checkpoint)
        history = trainer.train(
            **{**config.run_outputs(request, "madpo"), "resume_from": None},
            reporters=lambda out: reporters_for(
                out,
                report_to=config.report_to,
                reward_curve=config.reward_curve,
                title=f"{config.task.name} - {', '.join(config.models)} - MADPO",
                wandb_project=config.wandb_project,
                record=config.model_dump(),
            ),
        )
    except lifecycle.TrainingInterrupted as exc:
        print(f"comlrl: {exc.message()}", file=sys.stderr)
        return 130
    finally:
        task.close()
    print(_loss_summary(history, out, "reward_mean"))
    return 0


def run_marlhf(config: MARLHFRunConfig, request: RunRequest) -> int:
    """``algo=marlhf``: :class:`~comlrl.algos.MARLHFTrainer`: sample reward-gap pairs on
    ``config.task``, fit the joint reward model (rows in ``reward_model_metrics.jsonl``,
    weights in ``final/reward_model``), then the group-baseline recipe on its reward."""
    import torch
    from comlrl.algos.cli.preflight import check_model_names, prepare_task
    from comlrl.algos.recipes.preference.trainers import MARLHFTrainer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.training import lifecycle
    from comlrl.algos.training.checkpoint import CheckpointError
    from comlrl.algos.training.reporting import check_report_to, read_metrics, summary_line
    from comlrl.algos.training.steps import JsonlWriter
    from comlrl.core import RewardFunctionError

    backbone_name = config.reward_model or config.model_for(0)
    try:
        check_report_to(config.report_to)
        check_model_names([*config.models, backbone_name])
        task, examples = prepare_task(config)
    except ConfigError as exc:
        return _err(str(exc))
    try:
        eval_examples = None
        if config.eval_every:
            try:
                eval_examples = list(task.load(config.eval_split))
            except (ValueError, KeyError, OSError) as exc:
                raise ConfigError(f"eval_split={config.eval_split!r}: {exc}") from None
        _quiet_transformers()
        print(
            f"comlrl: {config.num_agents} agents ({', '.join(config.models)}) on {config.task.name} "
            f"({len(examples)} examples), MARLHF: {config.num_collect_batches} batches of pairs, "
            f"reward model {backbone_name}, then {config.num_steps} steps of estimator "
            f"{config.estimator} on its reward; outputs in {config.output_dir}/",
            file=sys.stderr,
        )
        torch.manual_seed(config.seed)
        agents = [
            HFAgent(
                *_load(config.model_for(i), config, config.seed + i),
                name=f"agent_{i}",
                **config.generation_options(),
            )
            for i in range(config.num_agents)
        ]
        backbone, backbone_tok = _load(backbone_name, config, config.seed + 104_729)
        pairing = MADPOConfig.build(
            num_agents=config.num_agents,
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
            task=task,
            dataset=examples,
            num_collect_batches=config.num_collect_batches,
            eval_fraction=config.eval_fraction,
        )
        out = _start_outputs(config, "marlhf", request)
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
            trainer = marlhf.rl_trainer(config, eval_dataset=eval_examples)
        except ConfigError as exc:
            return _err(str(exc))
        if request.resume_from is not None:
            try:
                step = trainer.resume(request.resume_from)
            except CheckpointError as exc:
                return _err(f"cannot resume from {request.resume_from}: {exc}")
            print(
                f"resuming {out} at step {step} of {config.num_steps} (from {request.resume_from})"
            )
        history = trainer.train()
    except RewardFunctionError as exc:
        print(f"comlrl: the reward function failed, training stopped: {exc}", file=sys.stderr)
        return 1
    except lifecycle.TrainingInterrupted as exc:
        print(f"comlrl: {exc.message()}", file=sys.stderr)
        return 130
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
    from comlrl.algos.training.steps import atomic_folder
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


# --------------------------------------------------------------------------- one-model recipes


def run_sft(config: SFTRunConfig, request: RunRequest) -> int:
    """``algo=sft``: :func:`~comlrl.algos.recipes.preference.recipe.train_sft` on ``config.data``."""
    from comlrl.algos.recipes.preference.recipe import train_sft

    def train(model: Any, tok: Any, rows: list[dict[str, Any]], held: Any) -> Any:
        return train_sft(model, tok, rows, config, held, **config.run_outputs(request, "sft"))

    return _run_one_model(config, request, "sft", ("prompt", "completion"), train)


def run_dpo(config: DPORunConfig, request: RunRequest) -> int:
    """``algo=dpo``: :func:`~comlrl.algos.recipes.preference.recipe.train_dpo` on ``config.data``
    (reference model: a frozen copy of the model as loaded)."""
    from comlrl.algos.recipes.preference.recipe import train_dpo

    def train(model: Any, tok: Any, rows: list[dict[str, Any]], held: Any) -> Any:
        return train_dpo(model, tok, rows, config, held, **config.run_outputs(request, "dpo"))

    return _run_one_model(config, request, "dpo", ("prompt", "chosen", "rejected"), train)


def _run_one_model(
    config: Any,
    request: RunRequest,
    algo: str,
    keys: tuple[str, ...],
    train: Callable[..., list[dict[str, float]]],
) -> int:
    from comlrl.algos.cli.preflight import check_model_names

    try:  # the data and the model name, before the model loads
        rows = read_jsonl_rows(config.data, keys, algo.upper())
        held = (
            read_jsonl_rows(config.eval_data, keys, f"{algo.upper()} evaluation")
            if config.eval_data
            else None
        )
        check_model_names(config.models)
    except ConfigError as exc:
        return _err(str(exc))
    _quiet_transformers()
    print(
        f"comlrl: {algo.upper()} of {config.models[0]} on {config.data} ({len(rows)} rows), "
        f"{config.num_steps} steps of {config.batch_size} rows; outputs in {config.output_dir}/",
        file=sys.stderr,
    )
    from comlrl.algos.training.checkpoint import CheckpointError, read_checkpoint_meta
    from comlrl.algos.training.lifecycle import TrainingInterrupted

    try:
        model, tok = _load(config.models[0], config, config.seed)
        out = _start_outputs(config, algo, request)
        if request.resume_from is not None:
            step = read_checkpoint_meta(request.resume_from)["step"]
            print(
                f"resuming {out} at step {step} of {config.num_steps} (from {request.resume_from})"
            )
    except (OSError, ValueError) as exc:  # before training: ConfigError, CheckpointError, loads
        return _err(str(exc))
    try:  # a bug from here on keeps its traceback (and the run its last checkpoint)
        history = train(model, tok, rows, held)
    except CheckpointError as exc:  # --resume's checkpoint, read before the first step
        return _err(f"cannot resume from {request.resume_from}: {exc}")
    except TrainingInterrupted as exc:
        print(f"comlrl: {exc.message()}", file=sys.stderr)
        return 130
    print(_loss_summary(history, out))
    return 0
