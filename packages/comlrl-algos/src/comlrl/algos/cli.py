"""The ``comlrl`` command line: ``comlrl train [--config FILE.yaml] [key=value ...]``.

``comlrl train --resume runs/x`` continues a run from its newest step checkpoint;
``comlrl eval --model ... --model ...`` evaluates trained agents
(:mod:`comlrl.algos.cli_eval`).

With no config file, ``comlrl train`` runs the built-in default experiment offline on CPU:
two agents sharing the tiny random Qwen2 (:data:`~comlrl.algos.models.DEFAULT_MODEL`), MAGRPO,
the cooperative HumanEval task.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "build_parser", "run_train"]


def build_parser() -> argparse.ArgumentParser:
    """The ``comlrl`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="comlrl", description="Cooperative multi-LLM reinforcement learning."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train",
        help="train a team of agents",
        description="Train a team of LLM agents. Without --config, runs the built-in default "
        "(2 agents, tiny random Qwen2, MAGRPO, cooperative HumanEval) offline on CPU.",
    )
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
    sub.add_parser("tasks", help="list the registered task suites")
    from comlrl.algos.cli_eval import add_eval_parser

    add_eval_parser(sub)
    return parser


def run_train(args: argparse.Namespace) -> int:
    """Validate the config, build agents and task, and train. Returns an exit code."""
    from comlrl.algos.config import ConfigError, load_config

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
        import yaml

        print(yaml.safe_dump(config.model_dump(), sort_keys=False), end="")
        return 0
    finished = lifecycle.finished_step(args.resume) if args.resume else None
    if finished is not None and finished >= config.num_steps:
        print(f"nothing to do: {args.resume} finished at step {finished} (final/); pass num_steps=N to train longer")
        return 0
    earlier = [] if args.resume else lifecycle.existing_run_outputs(config.output_dir)
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
    from comlrl.core import TaskNotFoundError, get_task

    try:
        task = get_task(config.task.name, **config.task.kwargs)
    except TaskNotFoundError as exc:
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    except (TypeError, ValueError, OSError) as exc:
        print(
            f"comlrl: task {config.task.name!r} rejected task.kwargs={config.task.kwargs!r}: {exc}",
            file=sys.stderr,
        )
        return 2
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
            agents.append(HFAgent(model, tok, name=f"agent_{i}"))
    except (OSError, ValueError) as exc:
        task.close()
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    try:
        trainer = MultiAgentTrainer(agents, config, task=task)
    except ConfigError as exc:
        task.close()
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    if earlier:  # --overwrite, now that the task and models have loaded
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
    first, last = history[0], history[-1]
    print(
        f"done: {len(history)} steps, reward_mean first={first['reward_mean']:.4f} "
        f"last={last['reward_mean']:.4f}, {last['prompts_per_s']:.2f} prompts/s; "
        f"outputs in {config.output_dir}/ (metrics.jsonl, samples.jsonl, final/agent_*)"
    )
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
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return run_train(args)
    if args.command == "eval":
        from comlrl.algos.cli_eval import run_eval

        return run_eval(args)
    if args.command == "tasks":
        from comlrl.core import available_tasks

        for name, target in sorted(available_tasks().items()):
            print(f"{name}\t{target}")
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
