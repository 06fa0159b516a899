from __future__ import annotations

from pathlib import Path

import pytest
from comlrl.algos.training.config.rl import ConfigError, TrainConfig, apply_overrides, load_config


def test_defaults_are_the_builtin_experiment() -> None:
    cfg = TrainConfig()
    assert cfg.models == ["builtin:stories260k"] and cfg.num_agents == 2
    assert cfg.estimator == "grpo" and cfg.joint_mode == "align"
    assert cfg.task.name == "coop_story"
    # measured to learn on stories260k with RAdam (see README "Quickstart")
    assert (cfg.optimizer, cfg.learning_rate, cfg.num_generations) == ("radam", 1e-3, 4)
    assert cfg.report_to == ["jsonl"] and cfg.reward_curve


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
def test_invalid_configs_are_rejected_with_the_field_and_value(
    overrides: list[str], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert needle in str(info.value)


def test_overrides_parse_yaml_values_and_dotted_keys() -> None:
    data = apply_overrides(
        {}, ["num_generations=8", "task.kwargs.limit=3", "models=[a, b]", "clip_ratio=null"]
    )
    assert data == {
        "num_generations": 8,
        "task": {"kwargs": {"limit": 3}},
        "models": ["a", "b"],
        "clip_ratio": None,
    }


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


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        (
            "lerning_rate=0.1",
            "lerning_rate: unknown field (got 0.1); did you mean 'learning_rate'?",
        ),
        ("num_step=3", "did you mean 'num_steps'?"),
        (
            "task.nmae=coop_story",
            "task.nmae: unknown field (got 'coop_story'); did you mean 'name'?",
        ),
        ("reportto=[wandb]", "did you mean 'report_to'?"),
    ],
)
def test_a_misspelt_field_gets_a_did_you_mean(override: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert suggestion in str(info.value)


def test_an_unknown_field_without_a_close_name_points_to_print_config() -> None:
    with pytest.raises(ConfigError, match="zzzz: unknown field .*--print-config"):
        load_config(None, ["zzzz=1"])


def test_invalid_yaml_file_is_a_config_error_with_the_line(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("num_steps: 3\nlearning_rate 0.1\n  bad: [\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML: line 3, column \d+"):
        load_config(p)


def test_invalid_yaml_in_an_override_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"override 'models=\[a': the value is not valid YAML"):
        apply_overrides({}, ["models=[a"])
