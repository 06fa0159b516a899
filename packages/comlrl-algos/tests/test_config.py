from __future__ import annotations

from pathlib import Path

import pytest
from comlrl.algos.config import ConfigError, TrainConfig, apply_overrides, load_config


def test_defaults_are_the_builtin_experiment() -> None:
    cfg = TrainConfig()
    assert cfg.models == ["builtin:tiny-qwen2"] and cfg.num_agents == 2
    assert cfg.estimator == "grpo" and cfg.joint_mode == "align"
    assert cfg.task.name == "coop_humaneval"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["num_generations=0"], "num_generations"),
        (["temperature=-1"], "temperature"),
        (["estimator=foo"], "unknown estimator 'foo'"),
        (["joint_mode=zip"], "joint_mode"),
        (["lr=0.1"], "lr"),
        (["models=[a, b, c]"], "models lists 3 models for num_agents=2"),
        (["num_iterations=2"], "set clip_ratio"),
        (["joint_mode=cross", "num_generations=100"], "use joint_mode='align'"),
        (["task.foo=1"], "task.foo"),
    ],
)
def test_invalid_configs_are_rejected_with_the_field_and_value(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert needle in str(info.value)


def test_overrides_parse_yaml_values_and_dotted_keys() -> None:
    data = apply_overrides({}, ["num_generations=8", "task.kwargs.limit=3", "models=[a, b]", "clip_ratio=null"])
    assert data == {"num_generations": 8, "task": {"kwargs": {"limit": 3}}, "models": ["a", "b"], "clip_ratio": None}


def test_override_without_equals_sign_is_rejected() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["num_generations"])


def test_yaml_file_must_be_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a YAML mapping"):
        load_config(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_model_for_picks_one_per_agent_or_shared() -> None:
    assert TrainConfig(models=["m"]).model_for(1) == "m"
    assert TrainConfig(models=["a", "b"]).model_for(1) == "b"
