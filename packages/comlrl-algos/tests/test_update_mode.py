"""Sampling and updating in one mode: with dropout > 0, the first PPO ratio is 1 and the DPO
margin of a policy at its reference is 0 (the updates run in eval mode, as sampling does)."""

from __future__ import annotations

from typing import Any

import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.models.logprobs import sampling_mode
from comlrl.algos.recipes.preference.supervised.config import DPOConfig
from comlrl.algos.recipes.preference.supervised.recipe import DPOTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.core import SamplingParams

PROMPTS = ["def add(a, b):", "def sub(a, b):", "class Stack:"]


def _dropout_model(tokenizer: Any, p: float = 0.5) -> Any:
    """The built-in tiny Qwen2 with attention dropout ``p`` (its only dropout), in train mode."""
    model = build_default_model(len(tokenizer), seed=0)
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = p
    model.config.attention_dropout = p
    return model.train()


def test_dropout_model_differs_between_modes(tiny_tokenizer: Any) -> None:
    # the premise: in train mode dropout changes the logits, so a train-mode update would
    # not see the policy that sampled
    model = _dropout_model(tiny_tokenizer)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    torch.manual_seed(0)
    with torch.no_grad():
        train_logits = model(input_ids=ids).logits
        with sampling_mode(model):
            eval_logits = model(input_ids=ids).logits
    assert float((train_logits - eval_logits).abs().max()) > 1e-2
    assert model.training and all(m.training for m in model.modules())


def test_first_ppo_ratio_is_one_with_dropout_and_modes_are_restored(tiny_tokenizer: Any) -> None:
    model = _dropout_model(tiny_tokenizer)
    agent = HFAgent(model, tiny_tokenizer)
    agent.seed(3)
    batch = agent.sample(PROMPTS, SamplingParams(num_generations=4, max_new_tokens=8)).batch
    settings = UpdateSettings(clip_ratio=0.2, max_completion_length=8, max_grad_norm=None)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    torch.manual_seed(0)
    stats = update_policy(model, opt, [batch], [torch.linspace(-1, 1, 12)], settings)
    # behaviour log-probs (sampler) and update log-probs (fused path) agree to round-off;
    # in train mode with p = 0.5 the mean ratio was 0.9933 (the test fails there)
    assert abs(stats["ratio_mean"] - 1.0) < 1e-4, stats
    assert stats["clip_fraction"] == 0.0, stats
    assert model.training and all(m.training for m in model.modules())


def test_dpo_margin_at_the_reference_is_zero_with_dropout(
    tiny_tokenizer: Any, tmp_path: Any
) -> None:
    model = _dropout_model(tiny_tokenizer)
    rows = [{"prompt": p, "chosen": " return a + b", "rejected": " pass"} for p in PROMPTS]
    config = DPOConfig(
        num_steps=1, batch_size=3, learning_rate=1e-3, device="cpu", seed=0,
        output_dir=str(tmp_path), progress=False,
    )  # fmt: skip
    torch.manual_seed(0)
    history = DPOTrainer(model, tiny_tokenizer, config, dataset=rows).train()
    # row 1 is measured before the first step, where the policy is its reference copy
    assert abs(history[0]["margin"]) < 1e-5, history[0]
    assert model.training
