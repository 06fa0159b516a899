"""ActorCriticConfig holds what IAC/MAAC read: the shared RL fields and the critic's, none of
the group-baseline recipes' (estimator, advantage scaling, node-chunk schedule)."""

from __future__ import annotations

import pytest
from comlrl.algos.recipes.actor_critic.config import ActorCriticConfig
from comlrl.algos.recipes.registry import build_recipe_config
from comlrl.algos.training.config.rl import ConfigError, RLConfig, TrainConfig
from comlrl.algos.training.config.sections import GroupBaselineSection

GROUP_BASELINE_FIELDS = sorted(GroupBaselineSection.model_fields)


def test_the_config_has_no_group_baseline_field() -> None:
    assert GROUP_BASELINE_FIELDS == [
        "advantage_eps",
        "advantage_group",
        "advantage_scale",
        "advantage_stats",
        "estimator",
        "role_format",
        "update_chunk_nodes",
        "update_chunk_split_turns",
    ]
    assert not set(GROUP_BASELINE_FIELDS) & set(ActorCriticConfig.model_fields)
    assert set(RLConfig.model_fields) <= set(ActorCriticConfig.model_fields)
    assert set(GROUP_BASELINE_FIELDS) <= set(TrainConfig.model_fields)
    assert not issubclass(ActorCriticConfig, TrainConfig)


@pytest.mark.parametrize("key", GROUP_BASELINE_FIELDS)
def test_a_group_baseline_key_is_an_error_that_names_it(key: str) -> None:
    value = TrainConfig.model_fields[key].get_default()
    with pytest.raises(ValueError, match=f"unknown field '{key}'; {key} is a"):
        ActorCriticConfig(**{key: value})
    for algo in ("iac", "maac"):  # the command line's path: `comlrl train algo=iac KEY=...`
        with pytest.raises(ConfigError, match=f"algo={algo}: '{key}'; {key} is a") as info:
            build_recipe_config({"algo": algo, key: value})
        assert "group-baseline recipes" in str(info.value)


def test_command_lines_valid_before_still_build() -> None:
    """Keys of IAC/MAAC runs other than the group-baseline ones keep working."""
    data = {
        "num_generations": 2,
        "critic_type": "q",
        "critic_mode": "separate",
        "clip_ratio": 0.1,
        "num_iterations": 2,
        "kl_coef": 0.05,
        "learning_rate": 1e-4,
        "critic_learning_rate": 1e-3,
        "gae_lambda": 0.9,
        "num_turns": 2,
        "loss_reduction": "token_mean",
    }
    for algo in ("iac", "maac"):
        recipe, config = build_recipe_config({"algo": algo, **data})
        assert recipe.name == algo and isinstance(config, ActorCriticConfig)
        assert config.model_dump(include=set(data)) == data
        assert config.baseline_label == "q-critic"
    assert ActorCriticConfig().num_generations == 1  # CoMLRL 1.4.3's one trajectory
