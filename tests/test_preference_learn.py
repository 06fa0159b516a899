"""SFT, DPO and MADPO learn on the pretrained stories260k model (seeded, CPU, one thread).

The task is the cooperative story reward of ``tests/_story.py``. Thresholds are about
half of the effects measured on the 2-core build machine (numbers in each test), and the
margins start at exactly 0 (the reference is the initial policy), so a rise must come from
training.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from comlrl.algos import (
    DPOConfig,
    DPOTrainer,
    HFAgent,
    MADPOConfig,
    MADPOTrainer,
    SFTConfig,
    SFTTrainer,
    load_model_and_tokenizer,
)
from comlrl.core import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from _story import story_examples, story_reward  # noqa: E402


def _solo_reward(text: str, hero: str) -> float:
    """One author's share of the story reward: names the hero, ends a sentence."""
    return 0.5 * (hero in text) + 0.25 * text.rstrip().endswith((".", "!", "?"))


def _evals(out: Path) -> tuple[dict[str, float], dict[str, float]]:
    """The first (step 0, before training) and last rows of a run's ``eval.jsonl``."""
    rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0
    return rows[0], rows[-1]


def test_sft_lowers_held_out_nll(stories260k: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(str(stories260k))
    rows = [
        {"prompt": ex["opening"], "completion": f" {ex['hero']} was very happy and smiled."}
        for ex in story_examples(80, seed=3)
    ]
    config = SFTConfig(
        learning_rate=1e-3, num_steps=20, batch_size=8, seed=0, device="cpu",
        output_dir=str(tmp_path / "sft"), progress=False,
    )  # fmt: skip
    SFTTrainer(model, tok, config, dataset=rows[:64], eval_dataset=rows[64:]).train()
    first, last = _evals(tmp_path / "sft")
    start, end = first["eval/nll"], last["eval/nll"]
    # Measured: 4.30 -> 0.16 nats/token; ask for half the drop (2 nats).
    assert end < start - 2.0, f"held-out NLL {start:.3f} -> {end:.3f}"


def _sampled_pairs(agent: HFAgent, examples: list[dict], k: int = 4) -> list[dict]:
    """DPO rows from the model's own samples: best vs worst by the solo story reward."""
    samples = agent.sample(
        [ex["opening"] for ex in examples], SamplingParams(num_generations=k, max_new_tokens=32)
    )
    rows = []
    for ex, group in zip(examples, samples.completions, strict=True):
        scored = sorted(group, key=lambda c: _solo_reward(c.text, ex["hero"]))
        lo, hi = scored[0], scored[-1]
        if _solo_reward(hi.text, ex["hero"]) > _solo_reward(lo.text, ex["hero"]):
            rows.append(
                {
                    "prompt": ex["opening"],
                    "chosen": hi.text,
                    "rejected": lo.text,
                    "hero": ex["hero"],
                }
            )
    return rows


def _mean_solo_reward(agent: HFAgent, examples: list[dict], seed: int) -> float:
    agent.seed(seed)
    samples = agent.sample(
        [ex["opening"] for ex in examples], SamplingParams(num_generations=4, max_new_tokens=32)
    )
    values = [
        _solo_reward(c.text, ex["hero"])
        for ex, g in zip(examples, samples.completions, strict=True)
        for c in g
    ]
    return sum(values) / len(values)


def test_dpo_raises_the_margin_and_the_task_reward(stories260k: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    agent = HFAgent(*load_model_and_tokenizer(str(stories260k)), name="author")
    agent.seed(0)
    train_ex, eval_ex = story_examples(96, seed=1), story_examples(24, seed=2)
    train_rows, eval_rows = _sampled_pairs(agent, train_ex), _sampled_pairs(agent, eval_ex)
    before = _mean_solo_reward(agent, eval_ex, seed=7)
    config = DPOConfig(
        learning_rate=1e-3, num_steps=30, batch_size=8, beta=0.1, seed=0, device="cpu",
        output_dir=str(tmp_path / "dpo"), progress=False,
    )  # fmt: skip
    DPOTrainer(
        agent.model, agent.tokenizer, config, dataset=train_rows, eval_dataset=eval_rows
    ).train()
    after = _mean_solo_reward(agent, eval_ex, seed=7)
    first, last = _evals(tmp_path / "dpo")
    start, end = first["eval/margin"], last["eval/margin"]
    # Measured: held-out margin 0 -> 26.8 nats, accuracy 0.69, solo reward 0.164 -> 0.294.
    assert abs(start) < 1e-4  # policy == reference before the first step
    assert end > 2.0, f"held-out margin {start:.3f} -> {end:.3f} nats"
    assert last["eval/accuracy"] > 0.58
    assert after > before + 0.065, f"solo story reward {before:.3f} -> {after:.3f}"


def test_madpo_raises_the_margin_and_the_task_reward(stories260k: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    agents = [
        HFAgent(*load_model_and_tokenizer(str(stories260k)), name=f"author_{i}") for i in range(2)
    ]
    config = MADPOConfig(
        num_agents=2,
        num_candidates=4,
        max_new_tokens=32,
        batch_size=2,
        num_steps=30,
        learning_rate=1e-3,
        optimizer="radam",
        beta=0.1,
        min_gap=0.25,
        seed=0,
        device="cpu",
        eval_num_samples=4,
        output_dir=str(tmp_path / "madpo"),
        progress=False,
    )
    trainer = MADPOTrainer(
        agents,
        config,
        dataset=story_examples(128),
        formatters=[lambda ex: ex["opening"]] * 2,
        reward_func=story_reward,
        eval_dataset=story_examples(16, seed=5),
    )
    trainer.train()
    first, last = _evals(tmp_path / "madpo")
    # Measured: held-out joint margin 0 -> 3.64 nats, held-out reward 0.480 -> 0.785.
    assert abs(first["eval/margin"]) < 1e-4
    assert last["eval/margin"] > 1.0, f"held-out joint margin -> {last['eval/margin']:.3f}"
    assert last["eval/reward_mean"] > first["eval/reward_mean"] + 0.15, (
        f"held-out reward {first['eval/reward_mean']:.3f} -> {last['eval/reward_mean']:.3f}"
    )


def test_marlhf_reward_model_learns_the_preferences_and_drives_rl(
    stories260k: Path, tmp_path: Path
) -> None:
    from comlrl.algos import MARLHFConfig, MARLHFTrainer, RewardModelConfig, TrainConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    agents = [
        HFAgent(*load_model_and_tokenizer(str(stories260k)), name=f"author_{i}") for i in range(2)
    ]
    task_calls: list[int] = []

    def task_reward(c1, c2, *, example):  # type: ignore[no-untyped-def]
        task_calls.append(1)
        return story_reward(c1, c2, example=example)

    backbone, tok = load_model_and_tokenizer(str(stories260k))
    # Pairs with a clear preference (task-reward gap >= 0.25, two per prompt) from 20
    # batches of 4 prompts: ~114 training and ~30 held-out pairs (10 batches of one
    # gap-0 pair each gave 27 and 8, too few: the model fit them, held-out loss 0.91 -> 0.94).
    config = MARLHFConfig(
        num_agents=2,
        max_new_tokens=32,
        batch_size=4,
        seed=0,
        device="cpu",
        eval_every=0,
        reward_model=RewardModelConfig(
            learning_rate=1e-3, num_epochs=2, batch_size=8, num_generations=4, min_gap=0.25,
            pairs_per_prompt=2, num_collect_batches=20, eval_fraction=0.2,
        ),
    )  # fmt: skip
    trainer = MARLHFTrainer(
        agents,
        config,
        reward_backbone=backbone,
        reward_tokenizer=tok,
        dataset=story_examples(128),
        formatters=[lambda ex: ex["opening"]] * 2,
        reward_func=task_reward,
    )
    history = trainer.train_reward_model()
    held_out = sum(len(p) for p in trainer.pairs[-4:])
    start, end = history[0], history[-1]
    # The zero head scores every text alike: held-out loss starts at ln 2 (chance).
    assert abs(start["eval/loss_start"] - math.log(2)) < 1e-6
    # Measured on the build machine: held-out BT loss 0.693 -> 0.527, accuracy 0.77 on 30
    # pairs; ask for about half the drop and 19 of 30 right (chance: 15).
    assert end["eval/loss"] < math.log(2) - 0.08, (
        f"held-out BT loss {start['eval/loss_start']:.3f} -> {end['eval/loss']:.3f}"
    )
    assert held_out >= 24 and end["eval/accuracy"] >= 0.63, (
        f"held-out accuracy {end['eval/accuracy']:.2f} on {held_out} pairs"
    )
    rl = trainer.rl_recipe(
        TrainConfig(
            num_agents=2,
            num_steps=1,
            batch_size=1,
            num_generations=2,
            max_new_tokens=8,
            output_dir=str(tmp_path),
            progress=False,
            log_samples=0,
            device="cpu",
        ),
        eval_dataset=story_examples(4, seed=9),
    )
    task_calls.clear()
    row = rl.step().row
    assert torch.isfinite(torch.tensor(row["reward_mean"]))
    assert not task_calls  # the RL step climbs the learned reward ...
    rl.evaluate()
    assert task_calls  # ... and evaluation scores with the task's own
