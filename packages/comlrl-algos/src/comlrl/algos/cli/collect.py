"""``comlrl collect``: sample joint actions, keep the good ones, write SFT rows.

``comlrl collect --model M [--model M2] -n N --min-reward R --output rows.jsonl
[--config FILE] [key=value ...]`` loads the agents as ``comlrl train`` does (a Hub id, a
local folder, a ``.gguf`` file, or a run's checkpoint such as ``runs/x/final/agent_0``,
whose run's ``config.yaml`` then supplies the task and sampling settings, as for
``comlrl eval``: :mod:`comlrl.algos.cli.run_settings`), samples ``num_generations`` joint actions on each of the first
``ceil(N / num_generations)`` examples of ``task.split`` (cycling over the split when it
is shorter) with the training rollout (:func:`comlrl.algos.rollout.evaluate.evaluate`, no
update: every turn, feedback included, at the run's temperature), and keeps the joint
actions whose reward is at least ``R``: rejection sampling, the data of rejection-sampling
fine-tuning (RFT; Yuan et al. 2023, "Scaling Relationship on Learning Mathematical
Reasoning with Large Language Models").

Each kept joint action gives one row per agent, as ``comlrl train algo=sft data=FILE``
reads them: ``prompt`` (the text the agent's model was given: its chat template applied
where it has one, feedback of earlier turns included), ``completion`` (what it wrote),
plus ``agent``, ``turn``, ``example_id`` and ``reward`` for the reader. A row seen twice
(the same agent, prompt and completion) is written once. The file is written whole and
then renamed; an existing one is refused unless ``--overwrite``. A progress bar counts
the examples on stderr.

Sampling draws from the evaluation streams of ``seed`` (the same command gives the same
rows); ``seed=S`` draws another set.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_collect_parser", "kept_rows", "run_collect"]


def add_collect_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``collect`` sub-command to ``comlrl``'s sub-parsers."""
    parser = sub.add_parser(
        "collect",
        help="sample joint actions, keep those with reward >= R, write SFT rows",
        description="Sample N joint actions on the task's split with the given agents, keep "
        "those whose joint reward is at least --min-reward, and write one prompt/completion "
        "row per agent to --output (the rows `comlrl train algo=sft data=FILE` trains on).",
    )
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        help="an agent's model (Hub id, folder, .gguf file, or a run's checkpoint such as "
        "runs/x/final/agent_0); once for all agents or once per agent",
    )
    parser.add_argument(
        "-n",
        "--num-samples",
        type=int,
        required=True,
        help="joint actions to sample (num_generations per example)",
    )
    parser.add_argument(
        "--min-reward",
        type=float,
        required=True,
        help="keep joint actions whose reward is at least this",
    )
    parser.add_argument("--output", "-o", required=True, help="the JSON-lines file to write")
    parser.add_argument("--config", "-c", help="YAML config (default: the run's config.yaml)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. task.name=coop_humaneval task.split=train "
        "num_generations=8 temperature=0.8",
    )
    return parser


def kept_rows(rollouts: Sequence[Any], min_reward: float) -> tuple[list[dict[str, Any]], int, int]:
    """The SFT rows of every joint action (any turn) of ``rollouts`` with reward
    ``>= min_reward``: one row per agent, duplicates (same agent, prompt and completion)
    dropped.

    Args:
        rollouts: :class:`~comlrl.algos.records.Rollout` objects (``turns[t].rewards``
            ``[nodes, K]`` float32, ``joint_index [K, A]`` completion index of each agent).
        min_reward: the threshold, in the task's reward units.

    Returns:
        ``(rows, sampled, kept)``: the rows in rollout order, the joint actions sampled
        and the joint actions kept.
    """
    rows: list[dict[str, Any]] = []
    seen: set[tuple[int, str, str]] = set()
    sampled = kept = 0
    for ro in rollouts:
        for turn in ro.turns:
            k = turn.joint_index.shape[0]
            for n in range(turn.num_nodes):
                ex = ro.examples[int(turn.example_index[n])]
                for j in range(k):
                    sampled += 1
                    reward = float(turn.rewards[n, j])
                    if not reward >= min_reward:  # NaN is never kept
                        continue
                    kept += 1
                    for a, g in enumerate(turn.joint_index[j].tolist()):
                        samples = turn.agents[a]
                        prompt, completion = samples.prompts[n], samples.completions[n][g].text
                        if (a, prompt, completion) in seen:
                            continue
                        seen.add((a, prompt, completion))
                        rows.append(
                            {
                                "prompt": prompt,
                                "completion": completion,
                                "agent": a,
                                "turn": turn.turn,
                                "example_id": ex.get("task_id", ex.get("id")),
                                "reward": reward,
                            }
                        )
    return rows, sampled, kept


def _fail(message: str) -> int:
    print(f"comlrl: {message}", file=sys.stderr)
    return 2


def run_collect(args: argparse.Namespace) -> int:
    """Load, sample, filter and write (see the module docstring). Returns an exit code:
    0 (rows written, possibly none), 2 (a bad option, config, task or model)."""
    from comlrl.algos.cli.run_settings import load_adapters, sampling_config
    from comlrl.algos.training.config.rl import ConfigError

    if args.num_samples < 1:
        return _fail(f"-n must be >= 1, got {args.num_samples}")
    output = Path(args.output)
    if output.exists() and not args.overwrite:
        return _fail(f"{output} exists; pass --overwrite to replace it, or another --output")
    models = list(args.model)
    try:
        _, config, adapters = sampling_config(models, args.config, args.overrides)
    except ConfigError as exc:
        return _fail(str(exc))
    g = config.num_generations
    # sampled as training samples (no reference model, no bar of the trainer's own)
    config = config.model_copy(
        update={
            "kl_coef": 0.0,
            "progress": False,
            "eval_greedy": False,
            "eval_num_samples": g,
        }
    )
    from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
    from comlrl.algos.recipes.launch import build_recipe, load_agents
    from comlrl.algos.training.config.task_setup import build_task

    try:
        task = build_task(config.task)  # one task, or the mixture of task.mixture
    except ConfigError as exc:
        return _fail(str(exc))
    try:
        try:
            split = list(task.load(config.task.split))
            if not split:
                raise ValueError(f"split {config.task.split!r} has no examples")
            problems = math.ceil(args.num_samples / g)
            data = [split[i % len(split)] for i in range(problems)]
            agents = load_agents(config, **config.generation_options())
            trainer = build_recipe(
                MultiAgentTrainer, agents, config, task=task, examples=data, eval_examples=data
            )
            load_adapters(trainer.agents, adapters)  # a LoRA run's agents on one base
        except (ConfigError, OSError, ValueError) as exc:
            return _fail(f"cannot collect on {config.task.name}:{config.task.split}: {exc}")
        from tqdm.auto import tqdm

        with tqdm(total=len(data), desc="collect", unit="example", file=sys.stderr) as bar:
            row, rollouts = trainer.evaluate_rollouts(progress=bar.update)
    finally:
        task.close()
    trainer.close()
    rows, sampled, kept = kept_rows(rollouts, args.min_reward)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    with open(tmp, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    tmp.replace(output)
    print(
        f"collect {config.task.name}:{config.task.split}: {sampled} joint actions sampled on "
        f"{len(data)} examples (G={g}, mean reward {row['reward_mean']:.4f}), {kept} with "
        f"reward >= {args.min_reward:g}; wrote {len(rows)} rows to {output}"
    )
    return 0
