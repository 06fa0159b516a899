"""What every ``comlrl train`` run shares: the request (:class:`RunRequest`), the checks
before any model loads (:func:`preflight`), the evaluation split (:func:`load_eval_split`),
reading JSON-lines rows, starting the output folder, loading a model or the agents
(:func:`load_agents`), the loss summary line, and the exit code of a configuration error
(2, with a message)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comlrl.algos.training.config import ConfigError

__all__ = [
    "RunRequest",
    "preflight",
    "announce",
    "resuming_line",
    "stopped",
    "load_eval_split",
    "load_agents",
    "read_jsonl_rows",
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


def preflight(
    config: Any, model_names: Sequence[str], *, refuse_tools: str | None = None
) -> tuple[Any, list[Mapping[str, Any]]]:
    """What a task run checks before any model loads: the extras ``config.report_to``
    needs, the ``model_names`` it will load (agents, reward model, comparators), and the
    task (:func:`~comlrl.algos.cli.preflight.prepare_task` on ``config``, or, for a
    config that is not a :class:`~comlrl.algos.training.config.TrainConfig` (MADPO's), on
    its ``models``, ``num_agents`` and ``task``). Returns ``(task, training examples)``.

    ``refuse_tools`` names a recipe that cannot run tool calls inside a turn (its
    rollouts do not go through :func:`comlrl.algos.rollout.tree.rollout`'s tool loop, or
    its loss has no mask for observations): a task whose agents have tools is refused.

    Raises:
        ConfigError: a missing extra, an unusable model name, a task that does not fit,
            or a task with tools for a recipe that refuses them.
    """
    from comlrl.algos.cli.preflight import check_model_names, prepare_task
    from comlrl.algos.training.config import RLConfig, TrainConfig
    from comlrl.algos.training.reporting import check_report_to

    check_report_to(config.report_to)
    check_model_names(list(model_names))
    if not isinstance(config, RLConfig):
        config = TrainConfig(models=config.models, num_agents=config.num_agents, task=config.task)
    task, examples = prepare_task(config)
    if refuse_tools is not None:
        with_tools = [a for a in range(int(task.num_agents)) if task.tools(a)]
        if with_tools:
            task.close()
            raise ConfigError(
                f"algo={refuse_tools} cannot train agents that call tools inside a turn, and task "
                f"{config.task.name!r} gives tools to agent(s) {with_tools}. Use a policy-"
                "gradient recipe (magrpo, mareinforce, marloo, maremax, iac, maac), or a task "
                "without tools."
            )
    return task, examples


def announce(config: Any, num_examples: int, what: str, who: str | None = None) -> None:
    """The run's header on stderr: ``comlrl: <who> (<models>) on <task> (<n> examples),
    <what>; outputs in <output_dir>/`` (``who`` defaults to ``<num_agents> agents``), then,
    for a :class:`~comlrl.algos.training.config.TrainConfig`, which defaults applied and
    why (:meth:`~comlrl.algos.training.config.TrainConfig.model_defaults`)."""
    who = who if who is not None else f"{config.num_agents} agents"
    print(
        f"comlrl: {who} ({', '.join(config.models)}) on {config.task.name} "
        f"({num_examples} examples), {what}; outputs in {config.output_dir}/",
        file=sys.stderr,
    )
    defaults = getattr(config, "model_defaults", None)
    if callable(defaults):  # TrainConfig: which defaults applied and why
        print(f"comlrl: {defaults().header()}", file=sys.stderr)


def load_eval_split(task: Any, split: str, limit: int | None = None) -> list[Mapping[str, Any]]:
    """The first ``limit`` (``None``: all) examples of ``task``'s ``split``.

    Raises:
        ConfigError: the task cannot load ``split`` (naming ``eval_split`` and why).
    """
    try:
        return list(task.load(split))[:limit]
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(f"eval_split={split!r}: {exc}") from None


def load_agents(config: Any, count: int | None = None, **options: Any) -> list[Any]:
    """``count`` (default ``config.num_agents``) :class:`~comlrl.algos.rollout.agent.HFAgent` s
    named ``agent_<i>``: agent ``i`` loads ``config.model_for(i)`` with seed
    ``config.seed + i``; ``options`` go to every agent (``prompt_format``, generation
    options). Agents given the same ``.gguf`` file share one read of it: the file is
    dequantized once and the other agents get deep copies of that model and tokenizer
    (reading SmolLM2-135M's GGUF takes ~19 s on one core, a copy 0.25 s); every agent still
    has its own weights.

    Raises:
        OSError, ValueError: a model does not load.
    """
    import copy

    from comlrl.algos.models.loading import is_gguf_file
    from comlrl.algos.rollout.agent import HFAgent

    first: dict[str, tuple[Any, Any]] = {}  # a GGUF path's first load, still untouched
    loaded = []
    for i in range(config.num_agents if count is None else count):
        name = config.model_for(i)
        if name in first:
            loaded.append(copy.deepcopy(first[name]))
            continue
        pair = _load(name, config, config.seed + i)
        if is_gguf_file(name):
            first[name] = pair
        loaded.append(pair)
    # agents are built only once every model is loaded, so no copy sees an agent's changes
    return [HFAgent(*pair, name=f"agent_{i}", **options) for i, pair in enumerate(loaded)]


def resuming_line(out: Any, step: int, num_steps: int, source: Any) -> str:
    """``resuming <out> at step <step> of <num_steps> (from <checkpoint>)``: what a run
    continued with ``--resume`` prints first."""
    return f"resuming {out} at step {step} of {num_steps} (from {source})"


def stopped(exc: BaseException) -> int:
    """Report a run that training stopped and return its exit code: Ctrl-C
    (:class:`~comlrl.algos.training.lifecycle.TrainingInterrupted`: 130, with where it
    checkpointed and how to resume) or a failing reward function
    (:class:`comlrl.core.RewardFunctionError`: 1, with the loop driver's note on the
    checkpoint of the last completed step). Anything else is raised again (its traceback
    ends with that note)."""
    from comlrl.algos.training.lifecycle import TrainingInterrupted
    from comlrl.core import RewardFunctionError

    if isinstance(exc, TrainingInterrupted):
        print(f"comlrl: {exc.message()}", file=sys.stderr)
        return 130
    if isinstance(exc, RewardFunctionError):
        print(f"comlrl: the reward function failed, training stopped: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # where the last completed step is saved
            print(note, file=sys.stderr)
        return 1
    raise exc


def _err(message: str) -> int:
    print(f"comlrl: {message}", file=sys.stderr)
    return 2


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
    from comlrl.algos.training.run_summary import quarter_means

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
