"""Issue 31, N8: CoMLRL 1.4.3's default ``num_turns=2`` with
``early_termination_threshold=-0.2`` ends every episode after turn 1 when the rewards are
never below -0.2, and the held-reward rule then doubles every return. The run says so."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.run.diagnostics import EarlyEndWatch, TrainingWarning

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(4)]


def test_watch_warns_once_after_patience_steps_without_a_second_turn() -> None:
    watch = EarlyEndWatch(num_turns=2, threshold=-0.2, gamma=1.0, patience=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        watch.log({"step": 1, "turn_0/num_nodes": 2.0})
        watch.log({"step": 2, "turn_0/num_nodes": 2.0, "turn_1/num_nodes": 3.0})  # resets
        watch.log({"step": 3, "turn_0/num_nodes": 2.0})
    with pytest.warns(TrainingWarning, match=r"every return is 2 x the reward"):
        watch.log({"step": 4, "turn_0/num_nodes": 2.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        watch.log({"step": 5, "turn_0/num_nodes": 2.0})  # once
        for quiet in (EarlyEndWatch(1, -0.2, patience=1), EarlyEndWatch(2, None, patience=1)):
            quiet.log({"step": 1, "turn_0/num_nodes": 2.0})


def _nonnegative(c1: list[str], c2: list[str]) -> list[float]:
    return [min(1.0, (len(a) + len(b)) / 40.0) for a, b in zip(c1, c2, strict=True)]


def test_compat_defaults_end_at_turn_one_hold_the_reward_and_warn(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    # CoMLRL 1.4.3's MAGRPOConfig defaults (comlrl-compat translates them to these fields)
    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer, name=f"a{i}")
        for i in range(2)
    ]
    config = TrainConfig(
        num_turns=2, early_termination_threshold=-0.2, termination_scope="node", gamma=1.0,
        num_steps=3, batch_size=2, num_generations=2, max_new_tokens=4, learning_rate=1e-3,
        output_dir=str(tmp_path), progress=False, parallel_agents=False, seed=0,
        reward_curve=False,
    )  # fmt: skip
    trainer = MultiAgentTrainer(
        agents, config, dataset=DATA, reward_func=_nonnegative,
        formatters=[lambda ex: ex["text"]] * 2,
        transition=lambda **kw: ["again"] * len(kw["agent_completions"]),
    )  # fmt: skip
    with pytest.warns(TrainingWarning, match=r"early_termination_threshold=-0.2 ended every"):
        trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert "turn_1/num_nodes" not in row  # turn 2 never ran
        # held for the skipped turn: R = r * (1 + gamma) = 2 r (float32 means of O(1))
        assert row["turn_0/return_mean"] == pytest.approx(2 * row["turn_0/reward_mean"], rel=1e-6)
