"""``comlrl eval``: evaluate trained agents on a task's evaluation split.

``comlrl eval --model runs/x/final/agent_0 --model runs/x/final/agent_1 [--config FILE]
[--output-dir DIR] [key=value ...]`` loads the agents, runs the training rollout without
updating (:meth:`comlrl.algos.recipes.group_baseline.recipe.GroupBaselineRecipe.evaluate`) on ``eval_split``, prints a
summary and appends one row to ``DIR/eval.jsonl`` (default ``runs/x/evals/final``). Every
evaluated joint action (prompts as the models saw them, completions, reward, the task's
verdict in ``info``) goes to ``DIR/eval_samples.jsonl`` (rewritten by each evaluation), so
a low score can be read, not just seen; a progress bar counts the problems on stderr.
Without ``--config`` it reads the run's own ``config.yaml`` when the models sit in a run
folder (``runs/x/final/agent_0`` or ``runs/x/checkpoints/step-N/agent_0``), so the task
and sampling settings match training, for a run of any team recipe; an override that names
another task evaluates the agents there without the run's task settings
(:mod:`comlrl.algos.cli.run_settings`). ``--model`` also takes a ``.gguf`` file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_eval_parser", "run_eval", "default_output_dir"]


def add_eval_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``eval`` sub-command to ``comlrl``'s sub-parsers."""
    ev = sub.add_parser(
        "eval",
        help="evaluate trained agents on the task's evaluation split",
        description="Evaluate trained agents (greedy by default) on eval_split of the task: "
        "per-turn rewards and, for code tasks, pass@k. Appends a row to OUTPUT_DIR/eval.jsonl.",
    )
    ev.add_argument(
        "--model",
        action="append",
        required=True,
        help="an agent's checkpoint folder (e.g. runs/x/final/agent_0), Hub id or .gguf file; "
        "repeat once per agent",
    )
    ev.add_argument("--config", "-c", help="YAML config (default: the run's config.yaml, if found)")
    ev.add_argument(
        "--output-dir",
        help="where eval.jsonl goes (default: output_dir=DIR when given, else "
        "RUN/evals/<checkpoint> for a checkpoint of a run, else runs/eval/<model name>)",
    )
    ev.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. eval_limit=20 eval_greedy=false eval_num_samples=5",
    )
    return ev


def default_output_dir(model: str | Path, run_config: str | Path | None) -> Path:
    """``RUN/evals/<checkpoint>`` for a checkpoint inside a run (e.g. ``runs/x/evals/final``,
    ``runs/x/evals/step-000004``), else ``runs/eval/<model name>`` under the current folder
    (``runs/eval/SmolLM2-135M-Instruct.Q4_1`` for a ``.gguf`` file,
    ``runs/eval/builtin-stories260k`` for ``builtin:stories260k``). Never inside the
    checkpoint folder itself (step checkpoints are replaced whole and pruned by
    ``keep_last``), nor beside a model that is not a run's: downloaded or shared model
    folders are often read-only caches."""
    folder = Path(model).parent
    if run_config is not None and Path(run_config).parent.resolve() in folder.resolve().parents:
        return Path(run_config).parent / "evals" / folder.name
    path = Path(str(model).replace(":", "-"))
    name = path.stem if path.suffix == ".gguf" else path.name
    return Path("runs") / "eval" / (name or "model")


def _checkpoint_step(model: str | Path) -> int | None:
    meta = Path(model).resolve().parent / "checkpoint.json"
    try:
        return int(json.loads(meta.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _summary(row: dict[str, Any]) -> str:
    keys = [k for k in row if k == "reward_mean" or k.startswith(("pass@", "solved_rate"))]
    keys += [k for k in row if k.startswith("turn_") and k.endswith(("/reward_mean", "/pass_rate"))]
    return ", ".join(f"{k}={row[k]:.4f}" for k in keys)


def run_eval(args: argparse.Namespace) -> int:
    """Load config, task and agents, evaluate, print and write the row. Returns an exit code."""
    from comlrl.algos.cli.run_settings import load_adapters, sampling_config
    from comlrl.algos.training.config.rl import ConfigError

    models = list(args.model)
    try:
        config_path, config, adapters = sampling_config(models, args.config, args.overrides)
    except ConfigError as exc:
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    from comlrl.algos.training.run.lifecycle import CUSTOM_REWARD

    if config.task.name.startswith(CUSTOM_REWARD):  # a library run on its own reward function
        print(
            f"comlrl: {config_path} records task.name={config.task.name!r}: the run was trained "
            "on a reward function of its own, which comlrl eval cannot call; evaluate it in "
            "Python (MultiAgentTrainer(...).evaluate()), or score it with a registered task's "
            "reward by naming one: task.name=NAME (comlrl tasks lists them).",
            file=sys.stderr,
        )
        return 2
    config = config.model_copy(update={"kl_coef": 0.0, "progress": False})  # no reference model
    if args.output_dir:
        out_dir = Path(args.output_dir)
    elif any(o.startswith("output_dir=") for o in args.overrides):  # as --output-dir
        out_dir = Path(config.output_dir)
    else:
        out_dir = default_output_dir(models[0], config_path)

    from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
    from comlrl.algos.recipes.launch import build_recipe, load_agents
    from comlrl.algos.training.config.task_setup import build_task

    try:
        task = build_task(config.task)  # one task, or the mixture of task.mixture
    except ConfigError as exc:
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    try:
        # What a user can get wrong (the split, the models) exits 2 with a message; an error
        # while evaluating is a bug and keeps its traceback.
        try:
            data = list(task.load(config.eval_split))[: config.eval_limit]
            if not data:
                raise ValueError("it has no problems (check eval_limit)")
            # as `comlrl train` loads them (agents on one .gguf file share one read of it)
            agents = load_agents(config, **config.generation_options())
            trainer = build_recipe(
                MultiAgentTrainer, agents, config, task=task, examples=data, eval_examples=data
            )
            load_adapters(trainer.agents, adapters)  # a LoRA run's agents on one base
        except (ConfigError, OSError, ValueError) as exc:
            print(
                f"comlrl: cannot evaluate on {config.task.name}:{config.eval_split}: {exc}",
                file=sys.stderr,
            )
            return 2
        row, rollouts = _evaluate_with_progress(trainer, data)
    finally:
        task.close()
    trainer.close()
    result: dict[str, Any] = {
        "step": _checkpoint_step(models[0]),
        "models": models,
        "task": config.task.name,
        "split": config.eval_split,
        "greedy": config.eval_greedy,
        "num_samples": config.eval_num_samples,
        **{k: v for k, v in row.items() if k != "step"},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "eval.jsonl", "a") as fh:
        fh.write(json.dumps(result) + "\n")
    samples_path = out_dir / "eval_samples.jsonl"
    _write_samples(samples_path, rollouts, result["step"])
    mode = "greedy" if config.eval_greedy else f"sampled, k={config.eval_num_samples}"
    print(
        f"eval {config.task.name}:{config.eval_split} ({int(result['num_problems'])} problems, {mode}, "
        f"config: {config_path or 'defaults'}): {_summary(result)}; row appended to {out_dir / 'eval.jsonl'}, "
        f"completions in {samples_path}"
    )
    return 0


def _evaluate_with_progress(trainer: Any, data: list[Any]) -> tuple[dict[str, Any], list[Any]]:
    """The trainer's evaluation, with a progress bar over the problems and the rollouts kept."""
    from tqdm.auto import tqdm

    with tqdm(total=len(data), desc="eval", unit="problem", file=sys.stderr) as bar:
        return trainer.evaluate_rollouts(progress=bar.update)


def _write_samples(path: Path, rollouts: list[Any], step: int | None) -> None:
    """Every joint action of ``rollouts`` as one JSON row (written whole, then renamed)."""
    from comlrl.algos.rollout.metrics import sample_rows

    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as fh:
        for ro in rollouts:
            for row in sample_rows(ro, step if step is not None else 0, limit=1 << 30):
                fh.write(json.dumps(row, default=str) + "\n")
    tmp.replace(path)
