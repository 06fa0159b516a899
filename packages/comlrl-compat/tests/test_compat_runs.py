"""comlrl.trainers runs on stories260k (../shared): MAGRPO raises a learnable reward, the
checkpoints are comlrl.algos' and resume through it, centralized MAGRPO trains one policy
on its parsed role outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.trainers import MAGRPOConfig, MAGRPOTrainer
from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer

OPENINGS = ["Once upon a time", "One day", "The little dog", "Tim had a", "There was a big"]
OPENINGS += ["In the park"]


def shared_heroine(c1: list[str], c2: list[str]) -> list[float]:
    """0.5 for each completion that names Lily (TinyStories often, not always, does)."""
    return [0.5 * ("Lily" in a) + 0.5 * ("Lily" in b) for a, b in zip(c1, c2)]


def _heroine_run(model: str, learning_rate: float) -> list[float]:
    torch.manual_seed(0)
    trainer = MAGRPOTrainer(
        agent_model=model,
        train_dataset=[{"prompt": o} for o in OPENINGS],
        reward_func=shared_heroine,
        args=MAGRPOConfig(
            num_turns=1,
            num_train_epochs=8,  # 8 passes over 6 openings at 4 per step: 12 steps
            rollout_buffer_size=4,
            num_generations=4,
            max_new_tokens=16,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            agent_learning_rate=learning_rate,
            eval_interval=0,
        ),
    )
    return [row["reward_mean"] for row in trainer.train()]


def test_magrpo_raises_a_learnable_joint_reward(stories260k: str) -> None:
    torch.set_num_threads(1)
    trained = _heroine_run(stories260k, 2e-3)
    control = _heroine_run(stories260k, 1e-12)  # too small to move the weights
    assert len(trained) == 12
    first, last = sum(trained[:3]) / 3, sum(trained[-6:]) / 6
    assert last > first + 0.15, f"reward did not rise: {trained}"
    assert last > sum(control[-6:]) / 6 + 0.15, f"trained {trained} vs control {control}"


def _short_run(model: str, **train: Any) -> tuple[MAGRPOTrainer, list[dict[str, float]]]:
    trainer = MAGRPOTrainer(
        agent_model=model,
        train_dataset=[{"prompt": o} for o in OPENINGS[:4]],
        reward_func=lambda a, b: [float(len(a) < len(b))],
        args=MAGRPOConfig(
            num_turns=1,
            num_train_epochs=2,
            rollout_buffer_size=2,
            num_generations=2,
            max_new_tokens=8,
            agent_learning_rate=1e-3,
            eval_interval=0,
        ),
    )
    return trainer, trainer.train(**train)


def test_checkpoints_are_algos_checkpoints_and_resume_through_it(
    stories260k: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    trainer, rows = _short_run(stories260k, checkpoint_dir=tmp_path / "run")
    assert len(rows) == 4 and trainer.output_dir == tmp_path / "run"
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    # one epoch = 2 steps: a checkpoint after each epoch, in comlrl.algos' layout
    steps = sorted((tmp_path / "run" / "checkpoints").iterdir())
    assert [p.name for p in steps] == ["step-000002", "step-000004"], steps
    first = steps[0]
    resumed, more = _short_run(stories260k, resume_from_checkpoint=first)
    assert [r["step"] for r in more] == [3, 4]
    assert resumed.output_dir == tmp_path / "run"  # the checkpoint's own run folder


def test_train_without_data_says_what_to_pass(tiny_model: Any, tiny_tokenizer: Any) -> None:
    trainer = MAGRPOTrainer(
        agents=[tiny_model, tiny_model],
        tokenizer=tiny_tokenizer,
        reward_func=lambda a, b: [0.0],
        args=MAGRPOConfig(num_turns=1),
    )
    with pytest.raises(ValueError, match="pass train_dataset="):
        trainer.train()


class _SplitAtComma:
    """Role 0 writes up to the first comma, role 1 the rest (stories260k writes commas)."""

    def __init__(self) -> None:
        self.parsed: list[str] = []

    def build_prompt(self, item: dict[str, Any], agent_prompts: list[str]) -> str:
        return " ".join(agent_prompts)

    def parse_completion(self, completion: str, item: dict[str, Any], num_agents: int) -> list[str]:
        self.parsed.append(completion)
        head, _, tail = completion.partition(",")
        return [head, tail]


def test_centralized_magrpo_trains_one_policy_on_parsed_role_outputs(
    stories260k: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    seen: list[tuple[str, str]] = []

    def second_longer(c1: list[str], c2: list[str]) -> list[float]:
        seen.append((c1[0], c2[0]))
        return [float(len(c2[0]) > len(c1[0]))]

    adapter = _SplitAtComma()
    trainer = CentralizedMAGRPOTrainer(
        centralized_adapter=adapter,
        agent_model=stories260k,
        train_dataset=[{"prompt": o} for o in OPENINGS[:4]],
        reward_func=second_longer,
        reward_processor=lambda r: 10.0 * r,
        formatters=[lambda ex: "A: " + ex["prompt"], lambda ex: "B: " + ex["prompt"]],
        args=CentralizedMAGRPOConfig(
            num_train_epochs=1,
            num_generations=4,
            max_new_tokens=16,
            rollout_buffer_size=4,
            agent_learning_rate=1e-3,
            eval_interval=0,
        ),
    )
    assert len(trainer.agents) == 1
    (row,) = trainer.train()
    # 4 prompts x 4 joint responses, each split into its role outputs for the reward
    assert seen == [(t.partition(",")[0], t.partition(",")[2]) for t in adapter.parsed]
    assert len(seen) == 16
    assert {row["reward_min"], row["reward_max"]} <= {0.0, 10.0}
    assert [p.name for p in trainer.save_model(tmp_path / "c")] == ["agent_0"]
