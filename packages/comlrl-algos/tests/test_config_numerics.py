"""Configs whose numerics would be wrong are refused before training (issue 31: N2, N5)."""

from __future__ import annotations

import pytest
from comlrl.algos.training.config.rl import ConfigError, load_config


@pytest.mark.parametrize("estimator", ["reinforce", "mareinforce"])
def test_reinforce_with_group_scale_is_refused_naming_the_fix(estimator: str) -> None:
    """N5: no baseline, so an equal-return group would be divided by ~1e-6."""
    with pytest.raises(ConfigError, match="advantage_scale=none") as info:
        load_config(None, [f"estimator={estimator}", "advantage_scale=group"])
    assert "r / 1e-06" in str(info.value)


@pytest.mark.parametrize("scale", ["auto", "none", "batch"])
def test_reinforce_with_other_scales_is_accepted(scale: str) -> None:
    cfg = load_config(None, ["estimator=reinforce", f"advantage_scale={scale}"])
    assert cfg.advantage_scale == scale


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "remax"])
def test_baselined_estimators_accept_group_scale(estimator: str) -> None:
    assert load_config(None, [f"estimator={estimator}", "advantage_scale=group"]).estimator
