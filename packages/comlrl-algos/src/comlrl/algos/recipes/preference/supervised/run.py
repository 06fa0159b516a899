"""The end-to-end runs of the one-model recipes (``algo=sft``, ``algo=dpo``): their run
configs (the library config plus the model, the ``data`` files and the outputs), and the
run: read and check the rows, load the model, train, write ``final/agent_0``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, ClassVar

from comlrl.algos.recipes.preference.config import DPOConfig, SFTConfig
from comlrl.algos.recipes.run_config import OneModelRunFields
from comlrl.algos.recipes.run_steps import (
    RunOutputs,
    RunResult,
    load_model,
    loss_summary,
    quiet_transformers,
    read_jsonl_rows,
    resuming_line,
    setup_errors,
    start_outputs,
)

__all__ = ["SFTRunConfig", "DPORunConfig", "run_sft", "run_dpo"]


class SFTRunConfig(SFTConfig, OneModelRunFields):
    """:class:`~comlrl.algos.recipes.preference.config.SFTConfig` plus the run's model,
    ``data`` / ``eval_data`` files of ``{"prompt", "completion"}`` rows, and outputs."""

    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "completion")
    output_dir: str = "runs/sft"


class DPORunConfig(DPOConfig, OneModelRunFields):
    """:class:`~comlrl.algos.recipes.preference.config.DPOConfig` plus the run's model,
    ``data`` / ``eval_data`` files of ``{"prompt", "chosen", "rejected"}`` rows, and outputs."""

    row_keys: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected")
    output_dir: str = "runs/dpo"


def run_sft(config: SFTRunConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=sft``: :func:`~comlrl.algos.recipes.preference.supervised.recipe.train_sft` on
    ``config.data``; raises as :func:`run_dpo`."""
    from comlrl.algos.recipes.preference.supervised.recipe import train_sft

    def train(model: Any, tok: Any, rows: list[dict[str, Any]], held: Any, **loop: Any) -> Any:
        return train_sft(model, tok, rows, config, held, **loop)

    return _run_one_model(config, outputs, "sft", train)


def run_dpo(config: DPORunConfig, outputs: RunOutputs | None = None) -> RunResult:
    """``algo=dpo``: :func:`~comlrl.algos.recipes.preference.supervised.recipe.train_dpo` on
    ``config.data`` (reference model: a frozen copy of the model as loaded).

    Raises:
        ConfigError: unreadable or malformed rows, a bad model name, a model that does not
            load, a folder that holds another run (without ``outputs.overwrite``).
        CheckpointError: ``outputs.resume_from`` does not fit the run.
        TrainingInterrupted: Ctrl-C, after the step checkpoint.
    """
    from comlrl.algos.recipes.preference.supervised.recipe import train_dpo

    def train(model: Any, tok: Any, rows: list[dict[str, Any]], held: Any, **loop: Any) -> Any:
        return train_dpo(model, tok, rows, config, held, **loop)

    return _run_one_model(config, outputs, "dpo", train)


def _run_one_model(
    config: SFTRunConfig | DPORunConfig,
    outputs: RunOutputs | None,
    algo: str,
    train: Callable[..., list[dict[str, float]]],
) -> RunResult:
    from comlrl.algos.training.checkpoint import CheckpointError, read_checkpoint_meta
    from comlrl.algos.training.task_setup import check_model_names

    outputs = outputs if outputs is not None else RunOutputs.of(config)
    config = outputs.apply(config)
    outputs.check_folder()
    keys = config.row_keys
    assert config.data is not None  # OneModelRunFields checked it
    rows = read_jsonl_rows(config.data, keys, algo.upper())
    held = (
        read_jsonl_rows(config.eval_data, keys, f"{algo.upper()} evaluation")
        if config.eval_data
        else None
    )
    check_model_names(config.models)
    quiet_transformers()
    print(
        f"comlrl: {algo.upper()} of {config.models[0]} on {config.data} ({len(rows)} rows), "
        f"{config.num_steps} steps of {config.batch_size} rows; outputs in "
        f"{outputs.output_dir}/",
        file=sys.stderr,
    )
    with setup_errors():
        model, tok = load_model(config.models[0], config, config.seed)
        out = start_outputs(config, algo, outputs)
        if outputs.resume_from is not None:
            step = read_checkpoint_meta(outputs.resume_from)["step"]
            print(resuming_line(out, step, config.num_steps, outputs.resume_from))
    record = {"algo": algo, **config.model_dump()}
    try:
        history = train(
            model,
            tok,
            rows,
            held,
            **outputs.loop_arguments(record),
            resume_from=outputs.resume_from,
        )
    except CheckpointError as exc:  # the resume's checkpoint, read before the first step
        raise CheckpointError(f"cannot resume from {outputs.resume_from}: {exc}") from None
    return RunResult(history, loss_summary(history, out), out)
