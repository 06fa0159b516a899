"""A run on a task mixture through ``comlrl train``: each task's reward reported apart in the
metrics and the evaluation rows, and ``--resume`` continuing the mixture where it stood.

Tolerance of the resume comparison: 1e-6 absolute, as in ``tests/test_run_lifecycle.py``
(one thread, the same float32 operations from bit-identical state; a lost mixture position
draws other examples, which changes the example ids and rewards outright).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

MIXTURE = (
    "task.mixture=[{name: coop_story, weight: 0.5, kwargs: {limit: 8}},"
    " {name: coop_humaneval, weight: 0.5, kwargs: {limit: 8}}]"
)
RUN_ARGS = [
    MIXTURE,
    "--model",
    "builtin:tiny-qwen2",
    "batch_size=4",
    "num_generations=2",
    "max_new_tokens=8",
    "eval_every=2",
    "eval_limit=4",
    "log_samples=8",
    "progress=false",
    "parallel_agents=false",
    "seed=5",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _comlrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("comlrl", path=str(Path(sys.executable).parent)) or shutil.which("comlrl")
    cmd = [exe] if exe else [sys.executable, "-m", "comlrl.algos.cli.main"]
    return subprocess.run(
        [*cmd, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=900, check=False
    )


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _same(got: list[dict[str, Any]], want: list[dict[str, Any]], what: str) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want], what
    for g, w in zip(got, want, strict=True):
        keys = {k for k in w if not k.startswith("time/") and not k.endswith("_per_s")}
        assert keys == {k for k in g if not k.startswith("time/") and not k.endswith("_per_s")}
        for k in sorted(keys):
            if isinstance(w[k], float):
                assert abs(g[k] - w[k]) <= 1e-6, f"{what} step {w['step']} {k}: {g[k]} != {w[k]}"
            else:
                assert g[k] == w[k], f"{what} step {w['step']} {k}: {g[k]!r} != {w[k]!r}"


def test_a_mixture_run_reports_each_task_apart_and_resumes_where_it_stood(
    tmp_path: Path, comlrl_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    whole = tmp_path / "whole"
    proc = _comlrl("train", *RUN_ARGS, "num_steps=4", f"output_dir={whole}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on coop_story+coop_humaneval (16 examples)" in proc.stderr
    metrics = _rows(whole / "metrics.jsonl")
    tasks = {k for r in metrics for k in r if k.startswith("reward/")}
    assert tasks == {"reward/coop_story", "reward/coop_humaneval"}
    samples = _rows(whole / "samples.jsonl")
    drawn = {str(s["example_id"]).split("/")[0] for s in samples}
    assert drawn == {"coop_story", "HumanEval"}, drawn
    for row in _rows(whole / "eval.jsonl"):  # eval_limit=4 holds both tasks (interleaved)
        assert {"reward/coop_story", "reward/coop_humaneval"} <= set(row), row
    # comlrl eval of the trained team rebuilds the mixture from the run's config.yaml
    final = [whole / "final" / f"agent_{i}" for i in (0, 1)]
    # (in this process: nothing here is compared across processes)
    ev = comlrl_here("eval", "--model", str(final[0]), "--model", str(final[1]), cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-3000:]
    row = _rows(whole / "evals" / "final" / "eval.jsonl")[-1]
    assert {"reward/coop_story", "reward/coop_humaneval"} <= set(row), row
    # stopped after step 2, then resumed: the same examples, rewards and updates
    part = tmp_path / "part"
    args = [*RUN_ARGS, "num_steps=2", "save_every=2", f"output_dir={part}"]
    assert _comlrl("train", *args, cwd=tmp_path).returncode == 0
    resumed = _comlrl("train", "--resume", str(part), "num_steps=4", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same(_rows(part / "metrics.jsonl"), metrics, "metrics.jsonl")
    _same(_rows(part / "samples.jsonl"), samples, "samples.jsonl")


def test_a_mixture_keeps_its_tasks_tools_and_budgets() -> None:
    """``tool_math`` in a mixture is prompted to use a tool that runs (its Python tool in
    the rollout's tool box); mixed with a task whose agents have no tools it is refused
    before any model loads; a pretrained run takes the largest budget the tasks declare."""
    from comlrl.algos.rollout.environment import TaskEnvironment
    from comlrl.algos.training.config.rl import ConfigError, TrainConfig
    from comlrl.algos.training.config.task import TaskConfig
    from comlrl.algos.training.config.task_setup import build_task

    def task(*names: str) -> TaskConfig:
        return TaskConfig.model_validate({"mixture": [{"name": n} for n in names]})

    mix = build_task(task("tool_math"))
    env = TaskEnvironment(mix)
    try:
        boxes = env.toolboxes
        assert [b is not None and [t.name for t in b.tools] for b in boxes] == [
            ["python"],
            ["python"],
        ]
        assert all(b is not None and b.fallback_format == "python" for b in boxes)
    finally:
        env.close()
        mix.close()
    with pytest.raises(ConfigError, match="different tools"):
        build_task(task("tool_math", "coop_story"))
    # one task twice, by label: each entry built with its own options, examples tagged by
    # label, and the data stream drawing each label by its weight
    from comlrl.algos.rollout.mixture import task_of
    from comlrl.algos.training.run.data_mixture import example_stream

    levels = TaskConfig.model_validate(
        {
            "mixture": [
                {"name": "tool_math", "label": "mul", "kwargs": {"level": "mul", "num_train": 4}},
                {"name": "tool_math", "label": "expr", "weight": 3, "kwargs": {"level": "expr"}},
            ]
        }
    )
    mix = build_task(levels)
    try:
        assert mix.name == "mul+expr" and list(mix.tasks) == ["mul", "expr"]
        assert [t.level for t in mix.tasks.values()] == ["mul", "expr"]
        examples = mix.load("train")
        assert [task_of(e) for e in examples[:4]] == ["mul", "expr", "mul", "expr"]
        assert sum(task_of(e) == "mul" for e in examples) == 4
        stream = example_stream(examples, seed=0, task=levels)
        drawn = [task_of(e) for e in stream.next_batch(400)]
        assert 0.65 < drawn.count("expr") / 400 < 0.85  # weight 3 of 4: 0.75
    finally:
        mix.close()
    bad = {"mixture": [{"name": "tool_math", "label": "mul", "kwargs": {"limit": 4}}]}
    with pytest.raises(ConfigError, match="entry 'mul' rejected (?s:.*)\n  kwargs.limit: not an"):
        build_task(TaskConfig.model_validate(bad))
    gguf = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"  # any non-built-in name: pretrained
    config = TrainConfig(models=[gguf], task=task("coop_story", "debate_math").model_dump())
    assert config.max_new_tokens == 96  # debate_math's 96, not coop_story's 48
