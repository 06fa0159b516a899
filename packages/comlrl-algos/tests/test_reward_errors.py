"""A reward function that returns None, text or booleans stops the step with the sample named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.core import RewardFunctionError

DATA = [{"id": i, "text": f"x = {i}"} for i in range(4)]


@pytest.mark.parametrize(
    ("returned", "needle"),
    [
        (lambda n: None, "returned None (NoneType) instead of a list of 2 floats"),
        (lambda n: ["1.0"] * n, "returned '1.0' (str) for joint action #0, which is not a number"),
        (lambda n: [True] * n, "returned True (bool) for joint action #0, which is not a number"),
    ],
    ids=["none", "strings", "bools"],
)
def test_a_reward_that_is_not_numbers_names_the_sample(
    tiny_tokenizer: Any, tmp_path: Path, returned: Any, needle: str
) -> None:
    cfg = TrainConfig(
        num_steps=1,
        batch_size=1,
        num_generations=2,
        max_new_tokens=3,
        output_dir=str(tmp_path),
        progress=False,
        reward_curve=False,
    )
    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer) for i in range(2)
    ]
    trainer = MultiAgentTrainer(
        agents,
        cfg,
        dataset=DATA,
        formatters=[lambda ex: ex["text"]] * 2,
        reward_func=lambda c1, c2: returned(len(c1)),
    )
    with pytest.raises(
        RewardFunctionError, match=needle.replace("(", r"\(").replace(")", r"\)")
    ) as info:
        trainer.train()
    assert info.value.example is not None and "text" in info.value.example
    assert info.value.completions is not None and len(info.value.completions) == 2
