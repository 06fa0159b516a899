"""The ``comlrl`` command line: ``comlrl train [--config FILE.yaml] [key=value ...]``.

With no config file, ``comlrl train`` runs the built-in default experiment offline on CPU:
two agents sharing the tiny random Qwen2 (:data:`~comlrl.algos.models.DEFAULT_MODEL`), MAGRPO,
the cooperative HumanEval task.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

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
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. num_generations=8 task.kwargs.limit=16",
    )
    sub.add_parser("tasks", help="list the registered task suites")
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
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        import yaml

        print(yaml.safe_dump(config.model_dump(), sort_keys=False), end="")
        return 0

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
    trainer = MultiAgentTrainer(agents, config, task=task)
    history = trainer.train()
    first, last = history[0], history[-1]
    print(
        f"done: {len(history)} steps, reward_mean first={first['reward_mean']:.4f} "
        f"last={last['reward_mean']:.4f}, {last['prompts_per_s']:.2f} prompts/s; "
        f"outputs in {config.output_dir}/ (metrics.jsonl, samples.jsonl, final/agent_*)"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``comlrl`` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return run_train(args)
    if args.command == "tasks":
        from comlrl.core import available_tasks

        for name, target in sorted(available_tasks().items()):
            print(f"{name}\t{target}")
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
