"""Two LoRA agents on ONE shared frozen stories260k base learn the cooperative story
reward (``tests/_story.py``), and their checkpoints reload.

Seeded, CPU, one intra-op thread. A control run with a learning rate too small to move
the adapters shows that the rise comes from training, not from the order of prompts.
Threshold: the measured rise is recorded in the test's message; the test asks for +0.15
over the first quarter and over the control's last quarter (as
``tests/test_defaults_learn.py`` does for full fine-tuning).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from comlrl.algos import HFAgent, MultiAgentTrainer, TrainConfig, load_model_and_tokenizer

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'comlrl-algos[lora]'")

sys.path.insert(0, str(Path(__file__).parent))
from _story import story_examples, story_reward  # noqa: E402


def _quarters(values: list[float]) -> tuple[float, float]:
    q = max(1, len(values) // 4)
    return sum(values[:q]) / q, sum(values[-q:]) / q


@pytest.mark.slow
def test_two_lora_agents_on_one_base_learn_and_reload(stories260k: Path, tmp_path: Path) -> None:
    from comlrl.algos.models.lora import unique_parameter_bytes
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)

    def train(lr: float, steps: int) -> tuple[list[float], MultiAgentTrainer]:
        torch.manual_seed(0)
        config = TrainConfig(
            num_agents=2,
            models=[str(stories260k)],
            num_steps=steps,
            batch_size=1,
            num_generations=4,
            max_new_tokens=32,
            learning_rate=lr,
            kl_coef=0.01,
            lora={"r": 8, "alpha": 16, "target_modules": "all-linear", "merge_adapters": True},
            output_dir=str(tmp_path / str(lr)),
            progress=False,
            log_samples=0,
            reward_curve=False,
            seed=0,
        )
        agents = [
            HFAgent(*load_model_and_tokenizer(str(stories260k)), name=f"author_{i}")
            for i in range(2)
        ]
        trainer = MultiAgentTrainer(
            agents,
            config,
            dataset=story_examples(128),
            reward_func=story_reward,
            formatters=[lambda ex: ex["opening"]] * 2,
        )
        return [row["reward_mean"] for row in trainer.train()], trainer

    rewards, trainer = train(1e-2, 64)
    first, last = _quarters(rewards)
    # The control (weights that do not move) only measures the untrained reward level, so
    # 32 steps are enough: its quarters average 8 rollouts of 4 completions each.
    c_first, c_last = _quarters(train(1e-12, 32)[0])
    print(f"trained {first:.3f} -> {last:.3f}; control {c_first:.3f} -> {c_last:.3f}")
    assert last > first + 0.15, (
        f"reward did not rise: first quarter {first:.3f}, last quarter {last:.3f}"
    )
    assert last > c_last + 0.15, (
        f"trained {last:.3f} vs control {c_last:.3f} (control first {c_first:.3f})"
    )

    # one base in memory: the two policies' distinct tensors are one base plus two adapters
    policies = [a.model for a in trainer.agents]
    base, _ = load_model_and_tokenizer(str(stories260k))
    adapter_bytes = sum(p.numel() * p.element_size() for m in policies for p in m.parameters())
    assert unique_parameter_bytes(policies) == unique_parameter_bytes([base]) + adapter_bytes

    # checkpoints: the adapter reloads onto a fresh base, the merged weights load alone, and
    # both give the trained agent's logits (float32 round-off of W + s*B@A vs x@W + s*x@A@B:
    # atol 1e-4 on logits of magnitude ~10)
    ids = torch.tensor([[1, 403, 261, 21, 300]])
    for i, policy in enumerate(policies):
        folder = tmp_path / "0.01" / "final" / f"agent_{i}"
        policy.eval()
        with torch.no_grad():
            want = policy(input_ids=ids).logits
            fresh, _ = load_model_and_tokenizer(str(stories260k))
            reloaded = PeftModel.from_pretrained(fresh, str(folder)).eval()(input_ids=ids).logits
            merged = AutoModelForCausalLM.from_pretrained(str(folder / "merged")).eval()
            merged_logits = merged(input_ids=ids).logits
            # what --model FOLDER loads (comlrl eval): the recorded base, adapter merged in
            as_model = load_model_and_tokenizer(str(folder))[0].eval()
            folder_logits = as_model(input_ids=ids).logits
        torch.testing.assert_close(reloaded, want, rtol=0, atol=1e-4)
        torch.testing.assert_close(merged_logits, want, rtol=0, atol=1e-4)
        torch.testing.assert_close(folder_logits, want, rtol=0, atol=1e-4)
    assert not torch.allclose(policies[0](input_ids=ids).logits, policies[1](input_ids=ids).logits)
