"""The ``comlrl`` command line: ``comlrl train [--config FILE.yaml] [key=value ...]``.

``comlrl train --resume runs/x`` continues a run from its newest step checkpoint;
``torchrun --nproc-per-node=K -m comlrl train ...`` trains data parallel over ``K``
processes (:mod:`comlrl.algos.models.gradient_sync`; rank 0 prints and writes; a run resumes on
any number of processes);
``comlrl eval --model ... --model ...`` evaluates trained agents
(:mod:`comlrl.algos.cli.eval`); ``comlrl info`` prints versions, the kernels' build, tasks,
recipes and extras (:mod:`comlrl.algos.cli.info`); ``comlrl plot RUN_DIR`` remakes a run's
``reward_curve.png`` from its ``metrics.jsonl`` (:mod:`comlrl.algos.cli.plot`);
``comlrl collect`` writes SFT rows of the sampled joint actions that reach a reward
(:mod:`comlrl.algos.cli.collect`); ``comlrl serve`` hosts whole tasks for trainers on
other machines (:mod:`comlrl.algos.cli.serve`).

With no config file, ``comlrl train`` runs the built-in default experiment offline on CPU:
two agents, each a copy of the pretrained stories260k (:data:`~comlrl.algos.models.loading.DEFAULT_MODEL`),
trained with MAGRPO to write one story together (``coop_story``). ``key=value`` overrides
and options may come in any order. ``comlrl tasks`` lists the task suites and their options.

``algo=NAME`` (on the command line or in the YAML file) picks the recipe from
:mod:`comlrl.algos.recipes.registry` (``iac``, ``maac``, ``madpo``, ``marlhf``, ``dpo``,
``sft``, the group-baseline family); ``comlrl recipes`` (or ``comlrl train algo=list``)
lists them. Each recipe accepts its own config's keys and fails on any other, naming it.
What ``--resume`` continues is found by :mod:`comlrl.algos.cli.resume`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = [
    "main",
    "build_parser",
    "add_train_arguments",
    "parse_args",
    "run_train",
    "run_tasks",
    "run_recipes",
    "stopped",
]


def build_parser() -> argparse.ArgumentParser:
    """The ``comlrl`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="comlrl", description="Cooperative multi-LLM reinforcement learning."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_arguments(
        sub.add_parser(
            "train",
            help="train a team of agents (or one model: algo=sft, algo=dpo)",
            description=_TRAIN_DESCRIPTION,
            epilog=_train_epilog(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    sub.add_parser("tasks", help="list the registered task suites and their options")
    sub.add_parser("recipes", help="list the training recipes (algo=NAME) with one line each")
    from comlrl.algos.cli.eval import add_eval_parser

    add_eval_parser(sub)
    from comlrl.algos.cli.info import add_info_parser

    add_info_parser(sub)
    from comlrl.algos.cli.plot import add_plot_parser

    add_plot_parser(sub)
    from comlrl.algos.cli.collect import add_collect_parser

    add_collect_parser(sub)
    from comlrl.algos.cli.serve import add_serve_parser

    add_serve_parser(sub)
    return parser


_TRAIN_DESCRIPTION = (
    "Train a team of LLM agents. Without --config, runs the built-in default "
    "(2 agents, pretrained stories260k, MAGRPO, cooperative story writing) offline on CPU. "
    "algo=NAME picks another recipe (list below; `comlrl recipes`). "
    "Cooperative HumanEval: task.name=coop_humaneval models=[builtin:tiny-qwen2]. "
    "Options and key=value overrides may come in any order."
)


def _train_epilog() -> str:
    from comlrl.algos.recipes.registry import describe_recipes

    lines = "\n".join(f"  {line}" for line in describe_recipes())
    return (
        f"recipes (algo=NAME; default magrpo, or the one of estimator=...):\n{lines}\n\n"
        "`comlrl train algo=NAME --print-config` shows a recipe's keys and defaults."
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
    train.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint (config from RUN_DIR/config.yaml; "
        "overrides limited to num_steps, save_every, keep_last, eval_*, log_samples, progress)",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
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
        train = argparse.ArgumentParser(
            prog="comlrl train",
            description=_TRAIN_DESCRIPTION,
            epilog=_train_epilog(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_train_arguments(train)
        ns = train.parse_intermixed_args(args[1:])
        ns.command = "train"
        return ns
    if args and args[0] == "collect":
        from comlrl.algos.cli.collect import add_collect_parser

        holder = argparse.ArgumentParser(prog="comlrl").add_subparsers(dest="command")
        ns = add_collect_parser(holder).parse_intermixed_args(args[1:])
        ns.command = "collect"
        return ns
    return build_parser().parse_args(args)


def run_train(args: argparse.Namespace) -> int:
    """Validate the config, build agents and task, and train. Returns an exit code.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) it first joins the process group
    (:func:`comlrl.algos.models.ranks.init_from_env`) and leaves it when done.
    """
    from comlrl.algos.models.ranks import init_from_env

    owns_group = init_from_env()
    code = 1
    try:
        code = _run_train(args)
        return code
    finally:
        if owns_group:
            import torch.distributed as dist

            if code == 0:
                # every rank finished: leave the group together. Rank 0 still writes the
                # final files when the others are done; a rank that tears its gloo
                # threads down meanwhile was seen to abort at exit ("terminate called
                # without an active exception", once in a CI run under load).
                dist.barrier()
            dist.destroy_process_group()


def _run_train(args: argparse.Namespace) -> int:
    from comlrl.algos.cli.resume import resume_target
    from comlrl.algos.models.ranks import barrier, rank_and_world
    from comlrl.algos.training.config.rl import ConfigError
    from comlrl.algos.training.run import lifecycle
    from comlrl.algos.training.run.outputs import RunOutputs

    try:
        if args.resume:
            recipe, config, resume_from = resume_target(args)
        else:
            recipe, config = _fresh_config(args)
            resume_from = None
    except ConfigError as exc:
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    if recipe is None:  # algo=list
        return run_recipes()
    if args.print_config:
        from comlrl.algos.recipes.launch import check_offline

        print(_config_text(recipe.name, config), end="")
        try:
            check_offline(config)
        except ConfigError as exc:
            print(f"comlrl: {exc}", file=sys.stderr)
            return 2
        return 0
    world = rank_and_world()[1]
    if world > 1 and not recipe.distributed:
        print(
            f"comlrl: algo={recipe.name} runs in one process; torchrun data parallelism is for "
            "the group-baseline recipes (magrpo, mareinforce, marloo, maremax). Run it without "
            "torchrun.",
            file=sys.stderr,
        )
        return 2
    finished = lifecycle.finished_step(args.resume) if args.resume else None
    if finished is not None and finished >= config.num_steps:
        print(
            f"nothing to do: {args.resume} finished at step {finished} (final/); pass num_steps=N to train longer"
        )
        return 0
    earlier = [] if args.resume else lifecycle.existing_run_outputs(config.output_dir)
    barrier()  # every rank has looked at output_dir before rank 0 writes to it
    if earlier and not args.overwrite:
        message = lifecycle.used_output_dir_message(config.output_dir, earlier, api=False)
        print(f"comlrl: {message}", file=sys.stderr)
        return 2
    outputs = RunOutputs.of(config, resume_from=resume_from, overwrite=bool(earlier))
    return _run_recipe(recipe, config, outputs)


def _run_recipe(recipe: Any, config: Any, outputs: Any) -> int:
    """Run the recipe and return the exit code of ``comlrl train``: 0 done (its summary
    line printed), 2 a bad config, data, model or checkpoint (reported before training
    where it can be), else as :func:`stopped`."""
    from comlrl.algos.models.ranks import is_main
    from comlrl.algos.training.config.rl import ConfigError
    from comlrl.algos.training.run.checkpoint import CheckpointError

    try:
        result = recipe.run(config, outputs)
    except (ConfigError, CheckpointError) as exc:
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    except BaseException as exc:
        return stopped(exc)
    if is_main():
        print(result.summary)
    return 0


def stopped(exc: BaseException) -> int:
    """Report a run that training stopped and return its exit code: Ctrl-C or SIGTERM
    (:class:`~comlrl.algos.training.run.lifecycle.TrainingInterrupted`: 130 or 143, with where
    it checkpointed and how to resume) or a failing reward function
    (:class:`comlrl.core.RewardFunctionError`: 1, with the loop driver's note on the
    checkpoint of the last completed step). Anything else is raised again (its traceback
    ends with that note)."""
    from comlrl.algos.training.run.lifecycle import TrainingInterrupted
    from comlrl.core import RewardFunctionError

    if isinstance(exc, TrainingInterrupted):
        print(f"comlrl: {exc.message()}", file=sys.stderr)
        return exc.exit_code
    if isinstance(exc, RewardFunctionError):
        print(f"comlrl: the reward function failed, training stopped: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # where the last completed step is saved
            print(note, file=sys.stderr)
        return 1
    raise exc


def _fresh_config(args: argparse.Namespace) -> tuple[Any, Any]:
    """The recipe and its validated config from ``--config``, overrides and flags
    (``(None, None)`` for ``algo=list``).

    Raises:
        ConfigError: a bad file, override, recipe name, key or value.
    """
    from comlrl.algos.recipes.registry import resolve_recipe
    from comlrl.algos.training.config.rl import apply_overrides, load_config_data

    data = load_config_data(args.config, list(args.overrides))
    if str(data.get("algo", "")).strip().lower() == "list":
        return None, None
    recipe, rest = resolve_recipe(data)
    if "task" in recipe.config_class().model_fields and "task" not in rest:
        rest = {**rest, "task": {}}  # the task trained on is named: its new-token budget applies
    return recipe, recipe.build_config(apply_overrides(rest, _flag_overrides(args, recipe)))


def _flag_overrides(args: argparse.Namespace, recipe: Any) -> list[str]:
    """``--model``, ``--output-dir``, ``--num-steps`` as ``key=value`` overrides (after the
    others, so the flags win)."""
    out = []
    if args.model:
        out.append("models=" + json.dumps(args.model))
        if len(args.model) > 1 and "num_agents" in recipe.config_class().model_fields:
            out.append(f"num_agents={len(args.model)}")
    if args.output_dir:
        out.append(f"output_dir={json.dumps(args.output_dir)}")
    if args.num_steps is not None:
        out.append(f"num_steps={args.num_steps}")
    return out


def _config_text(algo: str, config: Any) -> str:
    """The resolved config as YAML (``algo`` first), with the task's options and the
    built-in models as comments."""
    import yaml
    from comlrl.algos.models.loading import BUILTIN_MODELS
    from comlrl.algos.training.config.rl import ConfigError
    from comlrl.algos.training.config.task import TaskConfig
    from comlrl.algos.training.config.task_setup import task_info

    text = yaml.safe_dump({"algo": algo, **config.model_dump()}, sort_keys=False)
    task = getattr(config, "task", None)
    if isinstance(task, TaskConfig):
        try:
            info = task_info(task.name)
            text += (
                f"# task options of {info.name!r} (set as task.kwargs.<option>=...): "
                f"{info.signature() or 'none'}\n"
            )
        except ConfigError as exc:
            text += f"# task {task.name!r}: {exc}\n"
    models = ", ".join(f"{k} ({v})" for k, v in BUILTIN_MODELS.items())
    defaults = getattr(config, "model_defaults", None)
    if callable(defaults):
        from comlrl.algos.training.config.model_defaults import learning_rate_warning

        text += f"# {defaults().header()}\n"
        high = learning_rate_warning(config.models, config.learning_rate)
        text += f"# warning: {high}\n" if high else ""
    level, reduction = (
        getattr(config, "importance_level", None),
        getattr(config, "loss_reduction", None),
    )
    if level is not None and reduction is not None:
        from comlrl.algos.training.run.diagnostics import gspo_reduction_problem

        gspo = gspo_reduction_problem(level, reduction)
        text += f"# warning: {gspo}\n" if gspo else ""
    return f"{text}# built-in models: {models}\n"


def run_recipes() -> int:
    """Print every registered recipe (``comlrl recipes``, ``comlrl train algo=list``)."""
    from comlrl.algos.recipes.registry import describe_recipes

    for line in describe_recipes():
        print(line)
    print(
        "pick one with: comlrl train algo=NAME [key=value ...]; "
        "comlrl train algo=NAME --print-config shows its keys and defaults"
    )
    return 0


def run_tasks() -> int:
    """Print every registered task: name, agents, summary, constructor options and, where
    the suite says (its ``data_source``), where its examples come from."""
    from comlrl.algos.training.config.task_setup import describe_tasks

    infos = describe_tasks()
    if not infos:
        from comlrl.core.task import ENVS_INSTALL

        print(f"no task suites are registered; {ENVS_INSTALL}")
        return 0
    for info in infos:
        agents = f"{info.num_agents} agents" if info.num_agents else "agents: ?"
        print(f"{info.name}  ({agents}; {info.target})")
        if info.summary:
            print(f"    {info.summary}")
        print(f"    options: {info.signature() or 'none'}")
        if info.data:
            print(f"    data: {info.data}")
    print("set options with task.kwargs.<option>=VALUE, e.g. task.kwargs.limit=16")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``comlrl`` console script."""
    from comlrl.algos.cli._warnings import show_training_warnings_plainly

    args = parse_args(argv)
    show_training_warnings_plainly()
    if args.command == "train":
        return run_train(args)
    if args.command == "eval":
        from comlrl.algos.cli.eval import run_eval

        return run_eval(args)
    if args.command == "info":
        from comlrl.algos.cli.info import run_info

        return run_info(args)
    if args.command == "serve":
        from comlrl.algos.cli.serve import run_serve

        return run_serve(args)
    if args.command == "collect":
        from comlrl.algos.cli.collect import run_collect

        return run_collect(args)
    if args.command == "plot":
        from comlrl.algos.cli.plot import run_plot

        return run_plot(args)
    if args.command == "tasks":
        return run_tasks()
    if args.command == "recipes":
        return run_recipes()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
