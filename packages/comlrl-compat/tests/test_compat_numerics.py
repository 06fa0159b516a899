"""Issue 31's numerics findings in the comlrl.trainers translation (N2, N8)."""

from __future__ import annotations

import pytest
from comlrl.algos.training.config import TrainConfig
from comlrl.trainers import MAGRPOConfig
from comlrl.trainers.reinforce import MULTI_TURN_CLIP_RATIO, group_baseline_config


def test_multi_turn_schedule_clips_its_off_policy_steps() -> None:
    """N2: 1.4.3's multi-turn schedule (chunks of rollout_buffer_size nodes) takes later
    optimizer steps on completions sampled before earlier ones; their importance ratio is
    PPO-clipped, so the translated config is one TrainConfig accepts."""
    fields = group_baseline_config(MAGRPOConfig(), num_agents=2, num_examples=4, has_eval=False)
    assert fields["update_chunk_nodes"] == 2 and fields["clip_ratio"] == MULTI_TURN_CLIP_RATIO
    TrainConfig(**fields)  # validates: update_chunk_nodes needs clip_ratio
    single = group_baseline_config(MAGRPOConfig(num_turns=1), 2, 4, has_eval=False)
    assert single["clip_ratio"] is None and "update_chunk_nodes" not in single


@pytest.mark.parametrize("num_turns", [1, 2, 3])
def test_translated_configs_validate(num_turns: int) -> None:
    TrainConfig(**group_baseline_config(MAGRPOConfig(num_turns=num_turns), 2, 4, False))
