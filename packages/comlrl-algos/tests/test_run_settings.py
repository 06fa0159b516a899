"""The settings ``comlrl eval`` / ``comlrl collect`` sample a run's agents with
(:func:`comlrl.algos.cli.run_settings.sampling_config`), from hand-written run folders: no
model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from comlrl.algos.cli.run_settings import sampling_config
from comlrl.algos.training.config.rl import ConfigError


def _run(tmp_path: Path, settings: dict[str, object]) -> list[str]:
    """A run folder holding ``settings`` as its config.yaml; its two final agents' paths."""
    (tmp_path / "final" / "agent_0").mkdir(parents=True)
    (tmp_path / "final" / "agent_1").mkdir(parents=True)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(settings))
    return [str(tmp_path / "final" / f"agent_{i}") for i in (0, 1)]


def test_an_actor_critic_run_samples_with_its_settings_less_its_critics(tmp_path: Path) -> None:
    models = _run(
        tmp_path,
        {
            "algo": "iac",
            "critic_mode": "separate",
            "critic_learning_rate": 1e-4,
            "max_new_tokens": 24,
            "task": {"name": "coop_story", "kwargs": {"limit": 4}},
        },
    )
    path, config, adapters = sampling_config(models, None, ["eval_limit=2"])
    assert path == tmp_path / "config.yaml"
    assert (config.max_new_tokens, config.eval_limit, config.num_agents) == (24, 2, 2)
    assert config.task.kwargs == {"limit": 4} and config.models == models
    assert not hasattr(config, "critic_mode") and adapters is None


def test_a_key_of_no_recipe_still_fails_naming_it(tmp_path: Path) -> None:
    models = _run(tmp_path, {"algo": "iac", "critic_mdoe": "separate"})
    with pytest.raises(ConfigError, match="critic_mdoe is not a setting of algo=iac"):
        sampling_config(models, None, [])
    with pytest.raises(ConfigError, match="algo='nope'"):
        sampling_config(_run(tmp_path / "b", {"algo": "nope"}), None, [])


def test_a_madpo_run_is_evaluated_sampled_on_the_default_split(tmp_path: Path) -> None:
    models = _run(tmp_path, {"algo": "madpo", "eval_num_samples": 4, "eval_split": None})
    _, config, _ = sampling_config(models, None, [])
    assert (config.eval_greedy, config.eval_num_samples, config.eval_split) == (False, 4, "test")
    # a former name of a key still says what it said (MADPO's num_candidates)
    old = _run(tmp_path / "old", {"algo": "madpo", "num_candidates": 6, "steps_per_round": 2})
    assert sampling_config(old, None, [])[1].num_generations == 6


def test_another_task_gets_none_of_the_runs_task_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = {"name": "coop_humaneval", "split": "train", "kwargs": {"path": "he.jsonl"}}
    models = _run(tmp_path, {"algo": "magrpo", "max_new_tokens": 64, "task": task})
    _, same, _ = sampling_config(models, None, ["task.kwargs.limit=3"])
    assert same.task.kwargs == {"path": "he.jsonl", "limit": 3}  # its own task: merged
    assert capsys.readouterr().err == ""
    _, other, _ = sampling_config(models, None, ["task.name=mbpp", "task.kwargs.limit=3"])
    assert (other.task.name, other.task.kwargs, other.max_new_tokens) == ("mbpp", {"limit": 3}, 64)
    assert "the run's task settings {'kwargs': {'path': 'he.jsonl'}}" in capsys.readouterr().err
    # a file given with --config is taken as it is
    _, given, _ = sampling_config(models, str(tmp_path / "config.yaml"), ["task.name=mbpp"])
    assert given.task.kwargs == {"path": "he.jsonl"}


def test_a_lora_runs_adapters_on_one_base_load_into_one_base(tmp_path: Path) -> None:
    lora = {"r": 4, "shared_base": True}
    models = _run(tmp_path, {"algo": "magrpo", "seed": 3, "lora": lora})
    record = {"model": "builtin:tiny-qwen2", "seed": 3, "trust_remote_code": False}
    for folder in models:
        (Path(folder) / "adapter_config.json").write_text("{}")
        (Path(folder) / "comlrl_base.json").write_text(json.dumps(record))
    _, config, adapters = sampling_config(models, None, [])
    assert config.models == ["builtin:tiny-qwen2"] and config.num_agents == 2
    assert config.lora is not None and config.lora.r == 4 and adapters == models
    # adapters on other bases (another seed: another tiny-qwen2): each its own merged model
    (Path(models[1]) / "comlrl_base.json").write_text(json.dumps({**record, "seed": 4}))
    _, config, adapters = sampling_config(models, None, [])
    assert config.models == models and config.lora is None and adapters is None
