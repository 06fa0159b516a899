"""The default settings learn where CoMLRL users train: one prompt per step, lr 1e-3, the
pretrained stories260k model, a cooperative story reward (``tests/_story.py``), with and
without gradient clipping; and a two-turn run with feedback raises its last turn's reward.

Seeded, CPU, one intra-op thread, so the runs repeat on one torch build. Each test also
trains a control with a learning rate too small to move the weights, so a rise must come
from training and not from the order of the prompts. Thresholds: the measured rises are
+0.3 or more (see the numbers in ``comlrl.algos.training.steps.build_optimizer``); the tests ask for
half of that, and for the trained run to end above the control.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from comlrl.algos import HFAgent, MultiAgentTrainer, TrainConfig, load_model_and_tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from _story import CoopStoryTask, story_examples, story_reward  # noqa: E402


def _quarters(values: list[float]) -> tuple[float, float]:
    q = max(1, len(values) // 4)
    return sum(values[:q]) / q, sum(values[-q:]) / q


def _agents(model_dir: Path) -> list[HFAgent]:
    return [
        HFAgent(*load_model_and_tokenizer(str(model_dir)), name=f"author_{i}") for i in range(2)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("max_grad_norm", [1.0, None], ids=["clipped", "unclipped"])
def test_defaults_learn_at_one_prompt_per_step_and_lr_1e_3(
    stories260k: Path, tmp_path: Path, max_grad_norm: float | None
) -> None:
    torch.set_num_threads(1)

    def train(lr: float) -> list[float]:
        torch.manual_seed(0)
        config = TrainConfig(
            num_agents=2,
            models=[str(stories260k)],
            num_steps=96,
            batch_size=1,
            num_generations=4,
            max_new_tokens=48,
            learning_rate=lr,
            max_grad_norm=max_grad_norm,
            output_dir=str(tmp_path / str(lr)),
            progress=False,
            log_samples=0,
            seed=0,
        )
        trainer = MultiAgentTrainer(
            _agents(stories260k),
            config,
            dataset=story_examples(128),
            reward_func=story_reward,
            formatters=[lambda ex: ex["opening"]] * 2,
        )
        return [row["reward_mean"] for row in trainer.train()]

    first, last = _quarters(train(1e-3))
    c_first, c_last = _quarters(train(1e-12))
    assert last > first + 0.15, (
        f"reward did not rise: first quarter {first:.3f}, last quarter {last:.3f}"
    )
    assert last > c_last + 0.15, (
        f"trained {last:.3f} vs control {c_last:.3f} (control first {c_first:.3f})"
    )


@pytest.mark.slow
def test_two_turns_with_feedback_raise_the_last_turns_reward(
    stories260k: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(1)

    def train(lr: float) -> list[float]:
        torch.manual_seed(0)
        config = TrainConfig(
            num_agents=2,
            models=[str(stories260k)],
            num_steps=40,
            batch_size=2,
            num_generations=4,
            max_new_tokens=32,
            learning_rate=lr,
            num_turns=2,
            gamma=0.9,
            max_branches=2,
            output_dir=str(tmp_path / str(lr)),
            progress=False,
            log_samples=0,
            seed=0,
        )
        trainer = MultiAgentTrainer(_agents(stories260k), config, task=CoopStoryTask())
        return [row["turn_1/reward_mean"] for row in trainer.train()]

    first, last = _quarters(train(1e-3))
    c_first, c_last = _quarters(train(1e-12))
    assert last > first + 0.15, (
        f"turn-2 reward did not rise: first quarter {first:.3f}, last quarter {last:.3f}"
    )
    assert last > c_last + 0.15, (
        f"trained {last:.3f} vs control {c_last:.3f} (control first {c_first:.3f})"
    )
