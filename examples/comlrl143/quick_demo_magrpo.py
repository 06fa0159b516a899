"""CoMLRL 1.4.3 "Quick Demo" flow (two agents, length-ratio reward) in 1.4.3's API.

Runs unchanged under CoMLRL 1.4.3 and under this repository's ``comlrl.trainers``.
Swapped for offline CPU runs: the model (Qwen/Qwen2.5-0.5B -> stories260k, set
COMLRL_EXAMPLE_MODEL), and the sizes (epochs, tokens) so it finishes in seconds.
"""

import math
import os
import sys
from functools import partial

from comlrl.trainers import MAGRPOConfig, MAGRPOTrainer
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

try:  # stories260k, shipped with comlrl-algos; under CoMLRL 1.4.3 set COMLRL_EXAMPLE_MODEL
    from comlrl.algos.models.loading import builtin_model_path as _builtin
except ImportError:
    _builtin = None
MODEL = os.environ.get("COMLRL_EXAMPLE_MODEL") or str(_builtin())
OUT = sys.argv[1] if len(sys.argv) > 1 else "./magrpo_quick_demo_output"


def length_ratio_reward(completions1, completions2, target_min=2.0, target_max=3.0):
    """1.0 when agent 2 writes 2-3x as many characters as agent 1, decaying outside."""
    rewards = []
    for first, second in zip(completions1, completions2):
        if not first:
            rewards.append(0.0)
            continue
        ratio = len(second) / len(first)
        gap = max(target_min - ratio, ratio - target_max, 0.0)
        rewards.append(math.exp(-gap))
    return rewards


train_dataset = Dataset.from_dict(
    {
        "prompt": [
            "Once upon a time, a little fox",
            "Lily found a shiny stone",
            "The big dog wanted to play",
            "Tom and Sue went to the park",
        ]
    }
)
tokenizer = AutoTokenizer.from_pretrained(MODEL)
agents = [AutoModelForCausalLM.from_pretrained(MODEL) for _ in range(2)]

trainer = MAGRPOTrainer(
    agents=agents,
    tokenizer=tokenizer,
    reward_func=partial(length_ratio_reward, target_min=2, target_max=3),
    reward_processor=lambda r: 100.0 * r,
    formatters=[lambda ex: ex["prompt"], lambda ex: ex["prompt"] + " In more detail:"],
    args=MAGRPOConfig(
        num_turns=1,
        num_train_epochs=2,
        agent_learning_rate=1e-3,
        num_generations=4,
        max_new_tokens=24,
        eval_interval=0,
    ),
    train_dataset=train_dataset,
)
trainer.train()
trainer.save_model(f"{OUT}/models")
print("saved:", sorted(os.listdir(f"{OUT}/models")))
