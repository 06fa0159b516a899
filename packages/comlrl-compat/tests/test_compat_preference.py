"""CoMLRL 1.4.3's preference trainers through their public API: a user script's
``MADPOTrainer`` learns, each 1.4.3 setting lands on the ``comlrl.algos`` recipe option
that keeps its behaviour, and ``MARLHFTrainer`` / ``MADPOIterTrainer`` run their stages."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.trainers import (
    MADPOConfig,
    MADPOIterConfig,
    MADPOIterTrainer,
    MADPOTrainer,
    MARLHFConfig,
    MARLHFIterConfig,
    MARLHFIterTrainer,
    MARLHFTrainer,
    UnsupportedFieldError,
)

TOPICS = [{"prompt": t} for t in ("A fox", "A ship", "A bell", "A cat")]


def story_reward(first: list[str], second: list[str]) -> list[float]:
    """1.4.3's two-agent form: longer answers, agent 0's counting more (most sampled
    texts differ in length, so most prompts give pairs)."""
    return [float(len(first[0]) + 0.5 * len(second[0]))]


def _agents(tiny_tokenizer: Any) -> list[Any]:
    from comlrl.algos import build_default_model

    return [build_default_model(len(tiny_tokenizer), seed=i) for i in range(2)]


def _madpo(tiny_tokenizer: Any, cls: type = MADPOTrainer, **fields: Any) -> Any:
    config_cls = MADPOIterConfig if cls is MADPOIterTrainer else MADPOConfig
    base = dict(
        agent_devices="cpu", num_train_epochs=4, preference_num_candidates=4,
        preference_pairs_per_sample=2, max_new_tokens=8, agent_learning_rate=1e-3,
        rollout_buffer_size=2, eval_interval=0,
    )  # fmt: skip
    return cls(
        agents=_agents(tiny_tokenizer),
        tokenizer=tiny_tokenizer,
        train_dataset=TOPICS,
        reward_func=story_reward,
        formatters=[lambda ex: ex["prompt"], lambda ex: ex["prompt"] + " then"],
        args=config_cls(**{**base, **fields}),
    )


def test_a_madpo_script_learns_its_initial_pairs(tiny_tokenizer: Any) -> None:
    torch.manual_seed(0)
    trainer = _madpo(tiny_tokenizer)
    rows = trainer.train()
    pairs = trainer.preference_pairs
    assert pairs and all(p.chosen_reward > p.rejected_reward for p in pairs)
    # 4 passes over the pairs, 2 per step (train_batch_size = rollout_buffer_size)
    assert len(rows) == 4 * math.ceil(len(pairs) / 2)
    per_pass = len(rows) // 4
    first = sum(r["margin"] for r in rows[:per_pass]) / per_pass
    last = sum(r["margin"] for r in rows[-per_pass:]) / per_pass
    # reference-free joint log-ratio margin (nats) on the same pairs: it must grow; a
    # tiny random model at lr 1e-3 moves it by several nats in 4 passes
    assert last > first + 0.5, (first, last)


def test_madpo_evaluates_and_saves_like_1_4_3(tiny_tokenizer: Any, tmp_path: Path) -> None:
    trainer = _madpo(tiny_tokenizer, num_train_epochs=1, eval_num_samples=2)
    trainer.eval_dataset = TOPICS
    row = trainer.evaluate()
    assert set(row) == {"eval/reward_mean"} and row["eval/reward_mean"] > 0
    folders = trainer.save_model(tmp_path / "out")
    assert [f.name for f in folders] == ["agent_0", "agent_1"]
    assert all((f / "config.json").is_file() for f in folders)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, dict(pair_source="initial", num_epochs=4, reference_free=True, pairs_per_prompt=2,
                  pair_selection="reward_gap", joint_mode="align", batch_size=2, beta=0.1,
                  learning_rate=1e-3, optimizer="adamw", weight_decay=0.01)),
        ({"reference_kl_enabled": True, "dpo_beta": 0.5}, dict(reference_free=False, beta=0.5)),
        ({"pair_selection": "all"}, dict(pairs_per_prompt=6, pair_selection="reward_gap")),
        ({"preference_pairs_per_sample": None}, dict(pairs_per_prompt=6)),
        ({"pair_selection": "random"}, dict(pairs_per_prompt=2, pair_selection="random")),
        ({"joint_mode": "cross", "train_batch_size": 3}, dict(joint_mode="cross", batch_size=3)),
    ],
)  # fmt: skip
def test_madpo_settings_translate_onto_the_recipe(
    tiny_tokenizer: Any, fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    config = _madpo(tiny_tokenizer, **fields).config
    assert {k: getattr(config, k) for k in expected} == expected


def test_madpo_refuses_what_it_does_not_run(tiny_tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="num_turns"):
        MADPOConfig(num_turns=2)
    with pytest.raises(UnsupportedFieldError, match="external_transition"):
        MADPOTrainer(
            agents=_agents(tiny_tokenizer), tokenizer=tiny_tokenizer, reward_func=story_reward,
            external_transition=lambda **_: ["", ""], args=MADPOConfig(agent_devices="cpu"),
        )  # fmt: skip


def test_madpo_resumes_from_its_step_checkpoint(tiny_tokenizer: Any, tmp_path: Path) -> None:
    whole = _madpo(tiny_tokenizer).train(checkpoint_dir=tmp_path / "a")
    checkpoints = sorted((tmp_path / "a" / "checkpoints").iterdir())
    assert checkpoints
    resumed = _madpo(tiny_tokenizer).train(resume_from_checkpoint=checkpoints[0])
    step = int(checkpoints[0].name.split("-")[-1])
    assert [r["step"] for r in resumed] == [r["step"] for r in whole][step:]
    for got, want in zip(resumed, whole[step:]):
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)  # same float32 ops


def test_centralized_madpo_trains_one_joint_actor(tiny_tokenizer: Any) -> None:
    from comlrl.algos import build_default_model

    trainer = MADPOTrainer(
        agents=[build_default_model(len(tiny_tokenizer), seed=0)],
        tokenizer=tiny_tokenizer,
        train_dataset=TOPICS,
        reward_func=story_reward,
        formatters=[lambda ex: ex["prompt"], lambda ex: ex["prompt"] + " then"],
        args=MADPOConfig(
            agent_devices="cpu", collaboration_mode="centralized", num_train_epochs=1,
            preference_num_candidates=4, max_new_tokens=12, eval_interval=0,
        ),
    )  # fmt: skip
    assert trainer.num_agents == 1 and trainer.config.num_agents == 1
    rows = trainer.train()
    assert all(len(p.prompts) == 1 for p in trainer.preference_pairs)
    assert rows or not trainer.preference_pairs


def _marlhf(tiny_tokenizer: Any, tmp_path: Path) -> MARLHFTrainer:
    return MARLHFTrainer(
        agents=_agents(tiny_tokenizer),
        tokenizer=tiny_tokenizer,
        train_dataset=TOPICS,
        reward_func=story_reward,
        formatters=[lambda ex: ex["prompt"], lambda ex: ex["prompt"] + " then"],
        args=MARLHFConfig(
            agent_devices="cpu", num_agents=2, num_train_epochs=2, num_turns=1,
            preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8,
            num_generations=2, reward_model_name=_reward_model_folder(tiny_tokenizer, tmp_path),
            reward_model_device="cpu", eval_interval=0, rl_algorithm="marloo",
        ),
    )  # fmt: skip


def test_marlhf_fits_the_reward_model_then_trains_on_it_and_resumes(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    from comlrl.algos import RewardModelReward

    trainer = _marlhf(tiny_tokenizer, tmp_path)
    assert trainer.rl_trainer.config.estimator == "rloo"
    rows = trainer.train(checkpoint_dir=tmp_path / "run")
    assert trainer.reward_model_history and trainer.preference_pairs
    assert isinstance(trainer.rl_trainer.env.joint_reward, RewardModelReward)
    assert len(rows) == 4  # 4 prompts, 2 per step, 2 epochs
    first = sorted((tmp_path / "run" / "checkpoints").iterdir())[0]
    step = int(first.name.split("-")[-1])
    # a fresh trainer refits the pairs and reward model from the initial weights, then
    # continues the RL stage from the checkpoint exactly (same float32 ops)
    resumed = _marlhf(tiny_tokenizer, tmp_path).train(resume_from_checkpoint=first)
    assert [r["step"] for r in resumed] == [r["step"] for r in rows][step:]
    for got, want in zip(resumed, rows[step:]):
        assert got["reward_mean"] == pytest.approx(want["reward_mean"], abs=1e-6)


def test_madpo_iter_runs_its_rounds(tiny_tokenizer: Any) -> None:
    trainer = _madpo(
        tiny_tokenizer, MADPOIterTrainer, num_iterations=2, num_train_epochs=1,
        comparator_policy="current_copy",
    )  # fmt: skip
    config = trainer.config
    rounds = config.iterative
    assert (rounds.steps_per_round, config.num_steps, rounds.round_prompts) == (2, 4, 4)
    assert rounds.comparator == "current_copy" and rounds.pair_selection == "comparator_reward"
    rows = trainer.train()
    assert [r["iteration"] for r in rows] == [1.0, 1.0, 2.0, 2.0]
    with pytest.raises(UnsupportedFieldError, match="policy_checkpoint_dir"):
        _madpo(tiny_tokenizer, MADPOIterTrainer, policy_checkpoint_dir="x")


def _reward_model_folder(tiny_tokenizer: Any, tmp_path: Path) -> str:
    from comlrl.algos import build_default_model

    folder = tmp_path / "rm"
    build_default_model(len(tiny_tokenizer), seed=5).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return str(folder)


def test_marlhf_iter_refits_its_reward_model_each_round(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    trainer = MARLHFIterTrainer(
        agents=_agents(tiny_tokenizer),
        tokenizer=tiny_tokenizer,
        train_dataset=TOPICS,
        eval_dataset=TOPICS[:2],
        reward_func=story_reward,
        formatters=[lambda ex: ex["prompt"], lambda ex: ex["prompt"] + " then"],
        args=MARLHFIterConfig(
            agent_devices="cpu", num_iterations=2, num_train_epochs=1, num_turns=1,
            preference_num_candidates=4, max_new_tokens=8, num_generations=2,
            reward_model_name=_reward_model_folder(tiny_tokenizer, tmp_path),
            reward_model_device="cpu", eval_interval=2, rl_algorithm="maremax",
        ),
    )  # fmt: skip
    config = trainer.config
    assert (config.estimator, config.num_steps, config.batch_size) == ("remax", 4, 2)
    rows = trainer.train()
    assert [r["iteration"] for r in rows] == [1.0, 1.0, 2.0, 2.0]
    fitted = [r for r in rows if "reward_model/loss" in r]
    assert fitted  # a round with pairs refits the reward model
    with pytest.raises(UnsupportedFieldError, match="rl_algorithm"):
        MARLHFIterTrainer(
            agents=_agents(tiny_tokenizer), reward_func=story_reward,
            args=MARLHFIterConfig(agent_devices="cpu", num_turns=1, rl_algorithm="iac"),
        )  # fmt: skip
