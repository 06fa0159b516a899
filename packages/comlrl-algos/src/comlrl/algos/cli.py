"""The ``comlrl`` command line: ``comlrl train [--config FILE.yaml] [key=value ...]``.

``comlrl train --resume runs/x`` continues a run from its newest step checkpoint;
``torchrun --nproc-per-node=K -m comlrl train ...`` trains data parallel over ``K``
processes (:mod:`comlrl.algos.distributed`; rank 0 prints and writes; a run resumes on
any number of processes);
``comlrl eval --model ... --model ...`` evaluates trained agents
(:mod:`comlrl.algos.cli_eval`).

With no config file, ``comlrl train`` runs the built-in default experiment offline on CPU:
two agents, each a copy of the pretrained stories260k (:data:`~comlrl.algos.models.DEFAULT_MODEL`),
trained with MAGRPO to write one story together (``coop_story``). ``key=value`` overrides
and options may come in any order. ``comlrl tasks`` lists the task suites and their options.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "build_parser", "add_train_arguments", "parse_args", "run_train", "run_tasks"]


def build_parser() -> argparse.ArgumentParser:
    """The ``comlrl`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="comlrl", description="Cooperative multi-LLM reinforcement learning."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_arguments(
        sub.add_parser("train", help="train a team of agents", description=_TRAIN_DESCRIPTION)
    )
    sub.add_parser("tasks", help="list the registered task suites and their options")
    from comlrl.algos.cli_eval import add_eval_parser

    add_eval_parser(sub)
    return parser


_TRAIN_DESCRIPTION = (
    "Train a team of LLM agents. Without --config, runs the built-in default "
    "(2 agents, pretrained stories260k, MAGRPO, cooperative story writing) offline on CPU. "
    "Cooperative HumanEval: task.name=coop_humaneval models=[builtin:tiny-qwen2]. "
    "Options and key=value overrides may come in any order."
)


def add_train_arguments(train: argparse.ArgumentParser) -> None:
    """The options and ``key=value`` overrides of ``comlrl train``."""
    train.add_argument("--config", "-c", help="YAML config file (fields of TrainConfig)")
    train.add_argument(
        "--model",
        action="append",
        help="model id or local path; once for all agents or once per agent (repeat the flag)",
    )
    train.add_argument("--output-dir", help="where metrics, samples and checkpoints go")
    train.add_argument("--num-steps", type=int, help="number of training steps")
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    train.add_argument(
        "--resume", metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint (config from RUN_DIR/config.yaml; "
        "overrides limited to num_steps, save_every, keep_last, eval_*, log_samples, progress)",
    )
    train.add_argument(
        "--overwrite", action="store_true",
        help="delete the outputs of an earlier run in output_dir (metrics, samples, eval, "
        "checkpoints, final) before training",
    )
    train.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. num_generations=8 task.kwargs.limit=16",
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; ``train``'s options and ``key=value`` overrides may be
    intermixed (``comlrl train num_steps=2 --model X output_dir=y``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "train":
        # argparse cannot intermix with subparsers, so `train` gets a parser of its own.
        train = argparse.ArgumentParser(prog="comlrl train", description=_TRAIN_DESCRIPTION)
        add_train_arguments(train)
        ns = train.parse_intermixed_args(args[1:])
        ns.command = "train"
        return ns
    return build_parser().parse_args(args)


def run_train(args: argparse.Namespace) -> int:
    """Validate the config, build agents and task, and train. Returns an exit code.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) it first joins the process group
    (:func:`comlrl.algos.distributed.init_from_env`) and leaves it when done.
    """
    from comlrl.algos import distributed

    owns_group = distributed.init_from_env()
    try:
        return _run_train(args)
    finally:
        if owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()


def _run_train(args: argparse.Namespace) -> int:
    from comlrl.algos.config import ConfigError, load_config
    from comlrl.algos.preflight import check_model_names, prepare_task
    from comlrl.algos.reporting import check_report_to, summary_line

    overrides = list(args.overrides)
    if args.model:
        overrides.append("models=" + json.dumps(args.model))
        if len(args.model) > 1:
            overrides.append(f"num_agents={len(args.model)}")
    if args.output_dir:
        overrides.append(f"output_dir={json.dumps(args.output_dir)}")
    if args.num_steps is not None:
        overrides.append(f"num_steps={args.num_steps}")
    from comlrl.algos import lifecycle

    try:
        config, resume_from = (
            _resume_target(args, overrides) if args.resume else (load_config(args.config, overrides), None)
        )
    except ConfigError as exc:
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(_config_text(config), end="")
        return 0
    finished = lifecycle.finished_step(args.resume) if args.resume else None
    if finished is not None and finished >= config.num_steps:
        print(f"nothing to do: {args.resume} finished at step {finished} (final/); pass num_steps=N to train longer")
        return 0
    from comlrl.algos import distributed

    main = distributed.is_main()
    earlier = [] if args.resume else lifecycle.existing_run_outputs(config.output_dir)
    distributed.barrier()  # every rank has looked at output_dir before rank 0 writes to it
    if earlier and not args.overwrite:
        print(
            f"comlrl: output_dir {config.output_dir!r} already holds a run ({', '.join(earlier)}); "
            f"continue it with: comlrl train --resume {config.output_dir}, or start over with "
            "--overwrite (deletes that run's metrics, samples, evaluations, checkpoints and final/), or "
            "choose another output_dir.",
            file=sys.stderr,
        )
        return 2

    import torch
    from comlrl.algos.agent import HFAgent
    from comlrl.algos.models import load_model_and_tokenizer
    from comlrl.algos.trainer import MultiAgentTrainer
    from comlrl.core import RewardFunctionError

    try:  # everything that can be checked before the models load
        check_report_to(config.report_to)
        check_model_names(config.models)
        task, examples = prepare_task(config)
    except ConfigError as exc:
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar (ours), not one per load and save
    world = distributed.rank_and_world()[1]
    if main:
        print(
            f"comlrl: {config.num_agents} agents ({', '.join(config.models)}) on {config.task.name} "
            f"({len(examples)} examples), estimator {config.estimator}, {config.num_steps} step"
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
            model, tok = load_model_and_tokenizer(
                config.model_for(i),
                seed=config.seed + i,
                dtype=config.dtype,
                trust_remote_code=config.trust_remote_code,
            )
            agents.append(HFAgent(model, tok, name=f"agent_{i}", **config.generation_options()))
        trainer = MultiAgentTrainer(agents, config, task=task, dataset=examples)
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        task.close()
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    if earlier and main:  # --overwrite, now that the task and models have loaded
        lifecycle.clear_run_outputs(config.output_dir)
    if resume_from is not None:
        from comlrl.algos.checkpoint import CheckpointError

        try:
            step = trainer.resume(resume_from)
        except CheckpointError as exc:
            task.close()
            trainer.run.close()
            print(f"comlrl: cannot resume from {resume_from}: {exc}", file=sys.stderr)
            return 2
        if main:
            print(f"resuming {config.output_dir} at step {step} of {config.num_steps} (from {resume_from})")
        if step >= config.num_steps:
            task.close()
            trainer.run.close()
            print(f"nothing to do: the run already has {step} steps; pass num_steps=N to train longer")
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


def _config_text(config: object) -> str:
    """The resolved config as YAML, with the task's options and the built-in models as comments."""
    import yaml
    from comlrl.algos.config import ConfigError, TrainConfig
    from comlrl.algos.models import BUILTIN_MODELS
    from comlrl.algos.preflight import task_info

    assert isinstance(config, TrainConfig)
    text = yaml.safe_dump(config.model_dump(), sort_keys=False)
    try:
        info = task_info(config.task.name)
        task_line = (
            f"# task options of {info.name!r} (set as task.kwargs.<option>=...): "
            f"{info.signature() or 'none'}"
        )
    except ConfigError as exc:
        task_line = f"# task {config.task.name!r}: {exc}"
    models = ", ".join(f"{k} ({v})" for k, v in BUILTIN_MODELS.items())
    return f"{text}{task_line}\n# built-in models: {models}\n"


def run_tasks() -> int:
    """Print every registered task: name, agents, summary and constructor options."""
    from comlrl.algos.preflight import describe_tasks

    infos = describe_tasks()
    if not infos:
        print("no task suites are registered; pip install comlrl-envs")
        return 0
    for info in infos:
        agents = f"{info.num_agents} agents" if info.num_agents else "agents: ?"
        print(f"{info.name}  ({agents}; {info.target})")
        if info.summary:
            print(f"    {info.summary}")
        print(f"    options: {info.signature() or 'none'}")
    print("set options with task.kwargs.<option>=VALUE, e.g. task.kwargs.limit=16")
    return 0


def _resume_target(args: argparse.Namespace, overrides: list[str]) -> tuple[Any, Any]:
    """The saved config (plus safe overrides) and newest checkpoint of ``--resume RUN_DIR``.

    Raises:
        ConfigError: flags that conflict with --resume, an unsafe override, or no checkpoint.
    """
    from comlrl.algos.checkpoint import latest_checkpoint
    from comlrl.algos.config import ConfigError
    from comlrl.algos.lifecycle import resume_config

    flags = {"--config": args.config, "--model": args.model, "--output-dir": args.output_dir,
             "--overwrite": args.overwrite}
    clash = [name for name, value in flags.items() if value]
    if clash:
        raise ConfigError(
            f"--resume takes the run's own config ({args.resume}/config.yaml) and folder; drop "
            f"{', '.join(clash)} (to start over instead: comlrl train --overwrite ...)."
        )
    config = resume_config(args.resume, overrides)
    found = latest_checkpoint(args.resume)
    if found is None:
        raise ConfigError(
            f"nothing to resume in {args.resume!r}: no complete checkpoint under "
            f"{args.resume}/checkpoints (a run writes one every save_every steps and on Ctrl-C); "
            "start it again with --overwrite."
        )
    return config, found


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``comlrl`` console script."""
    from comlrl.algos._cli_warnings import show_training_warnings_plainly

    args = parse_args(argv)
    show_training_warnings_plainly()
    if args.command == "train":
        return run_train(args)
    if args.command == "eval":
        from comlrl.algos.cli_eval import run_eval

        return run_eval(args)
    if args.command == "tasks":
        return run_tasks()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
