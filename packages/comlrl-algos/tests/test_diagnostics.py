"""Runs that cannot learn say so once: G=1 with a baseline, prompts past the context,
a reward with no variance for many steps."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.run.diagnostics import (
    LearningSignalWatch,
    TrainingWarning,
    context_length,
    context_overflow,
    group_size_problem,
)

DATA = [{"t": "x " * n} for n in (2, 4, 300, 600)]  # two short prompts, two long ones


def _trainer(
    tok: Any, tmp_path: Path, *, context: int | None = None, reward: Any = None, **cfg: Any
) -> MultiAgentTrainer:
    agents = []
    for i in range(2):
        model = build_default_model(len(tok), seed=i)
        if context is not None:
            model.config.max_position_embeddings = context
        agents.append(HFAgent(model, tok, name=f"agent_{i}"))
    config = TrainConfig(
        **{
            "num_steps": 1,
            "batch_size": 2,
            "num_generations": 2,
            "max_new_tokens": 4,
            "output_dir": str(tmp_path),
            "progress": False,
            "log_samples": 0,
            "reward_curve": False,
            **cfg,
        }
    )
    return MultiAgentTrainer(
        agents,
        config,
        dataset=DATA,
        reward_func=reward or (lambda c1, c2: [len(a) / 10 for a in c1]),
        formatters=[lambda ex: ex["t"], lambda ex: "short"],
    )


def _training_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, TrainingWarning)]


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "remax"])
def test_one_generation_with_a_group_baseline_warns(
    tiny_tokenizer: Any, tmp_path: Path, estimator: str
) -> None:
    with pytest.warns(TrainingWarning, match=f"num_generations=1 with estimator='{estimator}'"):
        _trainer(tiny_tokenizer, tmp_path, num_generations=1, estimator=estimator)


def test_reinforce_and_larger_groups_do_not_warn(tiny_tokenizer: Any, tmp_path: Path) -> None:
    assert group_size_problem(1, "reinforce") is None and group_size_problem(2, "grpo") is None
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _trainer(tiny_tokenizer, tmp_path, num_generations=1, estimator="reinforce")
        _trainer(tiny_tokenizer, tmp_path, num_generations=2)
    assert _training_warnings(record) == []


def test_learning_rate_0_is_a_control_run_that_warns_and_keeps_the_weights(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    import torch

    with pytest.warns(TrainingWarning, match="learning_rate=0: a control run"):
        trainer = _trainer(tiny_tokenizer, tmp_path, learning_rate=0.0, num_steps=2)
    before = [
        {k: v.detach().clone() for k, v in a.model.state_dict().items()} for a in trainer.agents
    ]
    trainer.train()
    for agent, weights in zip(trainer.agents, before, strict=True):
        after = agent.model.state_dict()
        assert all(torch.equal(after[k], v) for k, v in weights.items())
    with pytest.raises(ValueError, match="learning_rate"):
        TrainConfig(learning_rate=-1e-5)


def test_prompts_past_the_context_are_counted(tiny_tokenizer: Any) -> None:
    prompts = [d["t"] for d in DATA]
    lengths = [len(tiny_tokenizer(p)["input_ids"]) for p in prompts]
    context = lengths[2] + 4  # prompt 2 fits exactly with 4 new tokens, prompt 3 does not
    result = context_overflow(prompts, tiny_tokenizer, context, max_new_tokens=4, agent=1)
    assert (result.count, result.checked, result.longest) == (1, 4, lengths[3])
    assert result.example_indices == (3,) and result.agent == 1
    assert context_overflow(prompts, tiny_tokenizer, context, 5).example_indices == (2, 3)


def test_setup_warns_once_with_the_number_of_prompts_past_the_context(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    long_prompt = len(tiny_tokenizer(DATA[3]["t"])["input_ids"])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _trainer(tiny_tokenizer, tmp_path, context=long_prompt - 10)
    messages = _training_warnings(record)
    assert len(messages) == 1, messages
    assert messages[0].startswith(
        f"1 of 4 prompts do not fit the model's context of {long_prompt - 10} tokens"
    )
    assert f"agent 0: 1 (longest prompt {long_prompt} tokens)" in messages[0]
    assert "agent 1" not in messages[0]  # agent 1's prompt is short


def test_context_length_reads_the_model_config() -> None:
    class Cfg:
        n_positions = 1024

    class Model:
        config = Cfg()

    assert context_length(Model()) == 1024
    assert context_length(object()) is None


def test_watch_warns_once_after_ten_steps_without_reward_variance() -> None:
    watch = LearningSignalWatch(patience=10)
    flat = {"reward_mean": 0.0, "reward_std": 0.0, "turn_0/reward_std": 0.0}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for step in range(1, 10):
            watch.log({"step": step, **flat})
        watch.log({"step": 10, **flat, "turn_1/reward_std": 0.5})  # variance in turn 2: resets
        assert _training_warnings(record) == []
        for step in range(11, 31):
            watch.log({"step": step, **flat})
    messages = _training_warnings(record)
    assert len(messages) == 1
    assert "for 10 steps in a row (steps 11-20)" in messages[0]
    assert "all-zero advantages" in messages[0]


def test_a_constant_reward_warns_during_training(tiny_tokenizer: Any, tmp_path: Path) -> None:
    with pytest.warns(TrainingWarning, match="same reward \\(1.0\\) for 10 steps in a row"):
        _trainer(
            tiny_tokenizer,
            tmp_path,
            num_steps=10,
            max_new_tokens=2,
            reward=lambda c1, c2: [1.0] * len(c1),
        ).train()
