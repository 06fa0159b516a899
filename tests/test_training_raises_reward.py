"""MAGRPO raises the joint reward of two pretrained agents (stories260k) on a writing task.

Task: two authors continue the same story opening; the team is rewarded when the stories
share their heroine (0.5 for each completion that names Lily). The reward is learnable:
TinyStories models often, but not always, name a girl Lily. Seeded, so the run is
repeatable on one torch build; a control run with a learning rate too small to move the
weights shows that the rise comes from training and not from the sampling schedule.
"""

from __future__ import annotations

from pathlib import Path

import torch
from comlrl.algos import HFAgent, MAGRPOTrainer, TrainConfig, load_model_and_tokenizer

OPENINGS = [
    "Once upon a time",
    "One day",
    "The little dog",
    "Tim had a",
    "There was a big",
    "In the park",
]


def shared_heroine(completions_agent1: list[str], completions_agent2: list[str]) -> list[float]:
    return [
        0.5 * ("Lily" in a) + 0.5 * ("Lily" in b)
        for a, b in zip(completions_agent1, completions_agent2)
    ]


def _train(model_dir: Path, out: Path, learning_rate: float) -> list[float]:
    torch.manual_seed(0)
    config = TrainConfig(
        num_agents=2,
        models=[str(model_dir)],
        num_steps=12,
        batch_size=4,
        num_generations=4,
        max_new_tokens=16,
        learning_rate=learning_rate,
        output_dir=str(out),
        progress=False,
        log_samples=0,
        seed=0,
        # AdamW at a high rate learns this easy reward within 12 steps; the default RAdam
        # ramps its step up over many steps (see tests/test_defaults_learn.py for it).
        optimizer="adamw",
    )
    agents = [
        HFAgent(*load_model_and_tokenizer(str(model_dir)), name=f"author_{i}") for i in range(2)
    ]
    trainer = MAGRPOTrainer(
        agents,
        config,
        dataset=[{"opening": o} for o in OPENINGS],
        reward_func=shared_heroine,
        formatters=[lambda ex: ex["opening"], lambda ex: ex["opening"]],
    )
    return [row["reward_mean"] for row in trainer.train()]


def test_magrpo_raises_the_joint_reward_of_two_stories260k_agents(
    stories260k: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    rewards = _train(stories260k, tmp_path / "trained", learning_rate=2e-3)
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    assert last > first + 0.15, (
        f"reward did not rise: first steps {rewards[:6]}, last steps {rewards[-6:]}"
    )

    control = _train(stories260k, tmp_path / "control", learning_rate=1e-12)
    c_first, c_last = sum(control[:6]) / 6, sum(control[-6:]) / 6
    assert c_last < c_first + 0.15, f"the untrained control rose too: {control}"
    assert last > c_last + 0.15, f"trained {rewards[-6:]} vs control {control[-6:]}"
