"""The ``comlrl`` command as a user runs it: default experiment, overrides, bad configs."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def _comlrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("comlrl")
    cmd = [exe] if exe else [sys.executable, "-m", "comlrl.algos.cli.main"]
    return subprocess.run(
        [*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


def test_default_experiment_is_stories260k_on_coop_story_and_ends_with_a_summary(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    # options and key=value overrides intermixed, as people type them
    proc = _comlrl(
        "train",
        "task.kwargs.limit=4",
        "--num-steps",
        "2",
        f"output_dir={out}",
        "progress=false",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 agents (builtin:stories260k) on coop_story (4 examples)" in proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("done: 2 steps, reward first quarter "), summary
    assert " -> last quarter " in summary
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward_mean",
        "reward_std",
        "turn_0/reward_mean",
        "loss/agent_0",
        "loss/agent_1",
        "completion_len_mean/agent_0",
        "tokens_per_s",
        "prompts_per_s",
    ):
        assert all(isinstance(r[key], float) for r in rows), key
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["example_id"].startswith("coop_story/") for s in samples)
    assert all(
        set(s["info"]["reward_parts"]) >= {"keywords1", "shared_vocabulary"} for s in samples
    )
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
        assert "reward_curve.png" in summary
    else:
        assert "reward_curve.png skipped" in proc.stderr

    from transformers import AutoModelForCausalLM, AutoTokenizer

    for agent in ("agent_0", "agent_1"):
        path = out / "final" / agent
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        assert model.config.model_type == "llama"
        assert model.get_input_embeddings().weight.shape[0] == len(tok) == 512


def test_coop_humaneval_is_one_flag_away_with_verdicts_and_loadable_checkpoints(
    tmp_path: Path, comlrl_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    out = tmp_path / "run"
    proc = comlrl_here(
        "train",
        "task.name=coop_humaneval",
        "models=[builtin:tiny-qwen2]",
        "--num-steps",
        "2",
        f"output_dir={out}",
        "task.kwargs.limit=4",
        "progress=false",
        "max_new_tokens=32",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples, "no samples were logged"
    # Every logged joint action carries the sandbox verdict of the real HumanEval tests.
    for s in samples:
        assert s["example_id"].startswith("HumanEval/")
        assert "status" in s["info"], s["info"]
        assert 0.0 <= s["reward"] <= 1.0

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "final" / "agent_1")
    assert model.config.model_type == "qwen2"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("num_generations=0", "num_generations"),
        ("estimator=ppo2", "unknown estimator 'ppo2'"),
        ("no_such_field=1", "no_such_field"),
        ("joint_mode=diagonal", "joint_mode"),
        ("task.kwargs.bogus=1", "rejected task.kwargs"),
        (
            "models=[/no/such/model/dir]",
            "could not load model '/no/such/model/dir': no such directory",
        ),
        ("models=[./no/such]", "no such directory"),
        ("lerning_rate=0.1", "did you mean 'learning_rate'?"),
        ("task.name=coop_storry", "did you mean 'coop_story'?"),
        (
            "task.kwargs.limti=3",
            "its options: limit=None, min_words=10, max_words=40, weights=None",
        ),
        ("task.kwargs.limit=0", "has no examples in split 'train'"),
        ("task.split=validation", "could not load split 'validation'"),
        ("models=[a", "is not valid YAML"),
        # num_agents is checked against the task before any model is loaded: loading the
        # Hub id (absent, and no network) would fail first otherwise.
        (
            "num_agents=3 models=[nobody-comlrl/not-a-model]",
            "written for 2 agents but num_agents=3",
        ),
    ],
)
def test_a_bad_config_fails_before_training_and_names_the_field(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    override: str,
    message: str,
) -> None:
    # In-process (``main`` is what the ``comlrl`` script calls): 14 cases, each a fresh
    # interpreter importing torch before (~2.3 CPU-s each). An exception escaping ``main``
    # fails the test here as a traceback would fail it in a subprocess; the script itself,
    # its exit status 2 and a message without a traceback are checked through a subprocess
    # by test_invalid_yaml_config_file_is_a_message_not_a_traceback.
    from comlrl.algos.cli.main import main

    monkeypatch.chdir(tmp_path)  # relative model paths resolve where the user stands
    out = tmp_path / "run"
    code = main(["train", *override.split(), f"output_dir={out}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert not out.exists(), "a rejected config must not start a run"


def test_config_file_and_overrides_combine(
    tmp_path: Path, comlrl_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("num_generations: 8\nlearning_rate: 0.001\ntask:\n  name: coop_humaneval\n")
    proc = comlrl_here(
        "train", "--config", str(cfg), "num_generations=3", "--print-config", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "num_generations: 3" in proc.stdout and "learning_rate: 0.001" in proc.stdout


def test_invalid_yaml_config_file_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("num_steps: 3\ntask:\n  name: coop_story\n   split: train\n")
    proc = _comlrl("train", "--config", str(cfg), cwd=tmp_path)
    assert proc.returncode == 2
    assert "is not valid YAML: line 4" in proc.stderr and "Traceback" not in proc.stderr


def test_tasks_and_print_config_show_the_task_options(
    tmp_path: Path, comlrl_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    proc = comlrl_here("tasks", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    story = lines.index(next(x for x in lines if x.startswith("coop_story ")))
    assert (
        lines[story + 2].strip() == "options: limit=None, min_words=10, max_words=40, weights=None"
    )
    assert "sandbox_all=False" in proc.stdout  # coop_humaneval's options
    proc = comlrl_here("train", "task.name=coop_humaneval", "--print-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (
        "# task options of 'coop_humaneval' (set as task.kwargs.<option>=...): path=None"
        in proc.stdout
    )


def test_runs_that_cannot_learn_warn_once_and_count_the_long_prompts(tmp_path: Path) -> None:
    """stories260k (context 512) on HumanEval prompts, with one completion per prompt."""
    proc = _comlrl(
        "train",
        "task.name=coop_humaneval",
        "num_generations=1",
        "num_steps=1",
        "batch_size=1",
        f"output_dir={tmp_path / 'run'}",
        "progress=false",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("comlrl: warning: ")]
    assert len(warnings) == 2, proc.stderr
    assert "num_generations=1 with estimator='grpo'" in warnings[0]
    match = re.search(
        r"(\d+) of (\d+) prompts do not fit the model's context of 512 tokens", warnings[1]
    )
    assert match is not None, warnings[1]
    long, total = int(match[1]), int(match[2])
    assert total == 132 and 0 < long < total  # the train split of HumanEval
