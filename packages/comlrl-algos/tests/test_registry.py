"""The recipe registry: names, config building from a mapping, and its early errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comlrl.algos.recipes.registry import (
    DEFAULT_RECIPE,
    RECIPES,
    build_recipe_config,
    describe_recipes,
    get_recipe,
    recipe_names,
    resolve_recipe,
)
from comlrl.algos.training.config.rl import ConfigError, TrainConfig, load_config_data

EXPECTED = {
    "magrpo",
    "mareinforce",
    "marloo",
    "maremax",
    "iac",
    "maac",
    "madpo",
    "marlhf",
    "madpo_iter",
    "marlhf_iter",
    "centralized_magrpo",
    "centralized_madpo",
    "centralized_marlhf",
    "centralized_madpo_iter",
    "centralized_marlhf_iter",
    "dpo",
    "sft",
}


@pytest.fixture
def rows(tmp_path: Path) -> dict[str, str]:
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"prompt": "Once", "completion": " upon a time."}) + "\n")
    dpo = tmp_path / "dpo.jsonl"
    dpo.write_text(json.dumps({"prompt": "Once", "chosen": " upon", "rejected": " the"}) + "\n")
    return {"sft": str(sft), "dpo": str(dpo)}


def test_every_issue_name_is_registered_with_a_one_line_summary() -> None:
    assert set(RECIPES) == EXPECTED
    assert {"grpo", "reinforce", "rloo", "remax"} <= set(recipe_names())
    lines = describe_recipes()
    assert len(lines) == len(RECIPES)
    for name, line in zip(RECIPES, lines, strict=True):
        assert line.startswith(name) and "\n" not in line and len(line.split(None, 1)[1]) > 10


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_recipe_builds_its_config_from_a_dict(name: str, rows: dict[str, str]) -> None:
    data: dict[str, object] = {"algo": name, "num_steps": 3, "seed": 5}
    if name in rows:
        data["data"] = rows[name]
    recipe, config = build_recipe_config(data)
    assert recipe.name == name
    assert isinstance(config, recipe.config_class())
    assert config.num_steps == 3 and config.seed == 5
    assert set(recipe.valid_keys()) == set(type(config).model_fields)


@pytest.mark.parametrize(
    ("algo", "estimator"),
    [
        ("magrpo", "grpo"),
        ("grpo", "grpo"),
        ("marloo", "rloo"),
        ("rloo", "rloo"),
        ("mareinforce", "reinforce"),
        ("REMAX", "remax"),
    ],
)
def test_group_baseline_names_fix_the_estimator(algo: str, estimator: str) -> None:
    _, config = build_recipe_config({"algo": algo})
    assert isinstance(config, TrainConfig) and config.estimator == estimator


def test_without_algo_the_default_run_and_the_estimator_key_keep_working() -> None:
    recipe, config = build_recipe_config({})
    assert recipe.name == DEFAULT_RECIPE == "magrpo"
    assert config == TrainConfig()  # `comlrl train` unchanged
    assert resolve_recipe({"estimator": "rloo"})[0].name == "marloo"
    assert resolve_recipe({"estimator": "MARLOO"})[0].name == "marloo"


def test_a_user_registered_estimator_runs_under_the_group_baseline_loop() -> None:
    from comlrl.estimators.registry import ESTIMATORS, register_estimator

    register_estimator("halfmean_test", baseline=lambda r: 0.5 * r.mean(-1, keepdim=True))
    try:
        recipe, config = build_recipe_config({"estimator": "halfmean_test"})
        assert recipe.name == "magrpo" and config.estimator == "halfmean_test"
    finally:
        ESTIMATORS.pop("halfmean_test")


def test_a_fixed_estimator_that_disagrees_fails_naming_both() -> None:
    with pytest.raises(
        ConfigError, match="algo=marloo fixes estimator='rloo' but the config sets estimator='grpo'"
    ):
        build_recipe_config({"algo": "marloo", "estimator": "grpo"})
    _, config = build_recipe_config(
        {"algo": "marloo", "estimator": "MARLOO"}
    )  # the same, spelt otherwise
    assert config.estimator == "rloo"


def test_unknown_keys_fail_naming_the_key_the_recipe_and_the_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        build_recipe_config({"algo": "sft", "data": "x", "lerning_rate": 1e-3})
    msg = str(info.value)
    assert "unknown key for algo=sft: 'lerning_rate'; did you mean 'learning_rate'?" in msg
    assert "Valid keys of sft (SFTConfig): add_eos, batch_size, data" in msg
    with pytest.raises(ConfigError, match="'critic_type'; it is a key of algo=iac, algo=maac"):
        build_recipe_config({"critic_type": "q"})
    with pytest.raises(ConfigError, match="unknown keys for algo=dpo: 'num_generations'.*'bogus'"):
        build_recipe_config({"algo": "dpo", "num_generations": 2, "bogus": 1})


def test_unknown_recipe_names_fail_with_close_names_and_the_list() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown algo='marlo'; did you mean 'marloo'.*Recipes: magrpo"
    ):
        get_recipe("marlo")
    with pytest.raises(ConfigError, match="algo must be a recipe name, got 3"):
        resolve_recipe({"algo": 3})


def test_bad_values_fail_naming_the_recipe_and_field(rows: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"invalid config for algo=iac:\n  - gae_lambda"):
        build_recipe_config({"algo": "iac", "gae_lambda": 2})
    recipe, config = build_recipe_config({"algo": "dpo"})  # rows are read before any model
    with pytest.raises(ConfigError, match='needs data=PATH.jsonl.*"chosen"'):
        recipe.recipe.inputs(config)
    with pytest.raises(ConfigError, match="data='/no/such.jsonl': no such file"):
        build_recipe_config({"algo": "sft", "data": "/no/such.jsonl"})
    with pytest.raises(ConfigError, match="trains one model but models lists 2"):
        build_recipe_config({"algo": "sft", "data": rows["sft"], "models": ["a", "b"]})
    with pytest.raises(ConfigError, match="models lists 3 models for num_agents=2"):
        build_recipe_config({"algo": "madpo", "models": ["a", "b", "c"]})


def test_yaml_files_pick_the_recipe_with_an_algo_key(tmp_path: Path) -> None:
    path = tmp_path / "maac.yaml"
    path.write_text("algo: maac\ncritic_type: q\nnum_steps: 7\n")
    recipe, config = build_recipe_config(load_config_data(path, ["gae_lambda=0.9"]))
    assert recipe.name == "maac"
    assert (config.critic_type, config.num_steps, config.gae_lambda) == ("q", 7, 0.9)
    assert config.output_dir == "runs/maac"  # the recipe's preset, not runs/default


def test_jsonl_rows_are_checked_line_by_line(tmp_path: Path) -> None:
    from comlrl.algos.recipes.launch import read_jsonl_rows

    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n\n{"prompt": "a"}\n')
    with pytest.raises(
        ConfigError, match=r"rows.jsonl:3: lacks string field\(s\) \['completion'\]"
    ):
        read_jsonl_rows(path, ("prompt", "completion"), "SFT")
    path.write_text('{"prompt": "a", "completion": "b"}\n[1]\n')
    with pytest.raises(ConfigError, match="rows.jsonl:2: a JSON list"):
        read_jsonl_rows(path, ("prompt", "completion"), "SFT")
    path.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": \n')
    with pytest.raises(ConfigError, match="rows.jsonl:2: not valid JSON"):
        read_jsonl_rows(path, ("prompt", "completion"), "SFT")
    path.write_text('{"prompt": "a", "completion": "b"}\n')
    assert read_jsonl_rows(path, ("prompt", "completion"), "SFT") == [
        {"prompt": "a", "completion": "b"}
    ]


def test_every_entry_holds_its_config_class_and_a_public_recipe_class() -> None:
    import comlrl.algos as algos
    from pydantic import BaseModel

    for recipe in RECIPES.values():
        assert isinstance(recipe.config, type) and issubclass(recipe.config, BaseModel)
        cls = recipe.recipe
        assert getattr(algos, cls.__name__) is cls, cls
        for hook in ("inputs", "describe", "agent_options", "step", "checkpoint", "resume"):
            assert callable(getattr(cls, hook)), (cls, hook)
    assert get_recipe("marlhf").recipe is algos.MARLHFTrainer
    assert get_recipe("marlhf").config is algos.MARLHFConfig
    assert get_recipe("rloo").recipe is algos.MARLOOTrainer
    assert get_recipe("centralized_madpo_iter").recipe is algos.MADPOIterRecipe
