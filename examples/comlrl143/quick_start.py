# CoMLRL's docs "Quick Start" (docs/content/docs/examples/comlrl-quick-start.md; 1.4.3
# names), run unchanged against this package except for:
#   - the model: "Qwen/Qwen2.5-0.5B" -> MODEL (stories260k; set COMLRL_EXAMPLE_MODEL);
#   - sizes, as config values: num_train_epochs 3 -> 1, max_new_tokens 128 -> 16;
#   - output_dir: "./magrpo_multi_reward_output" -> OUT (argv[1], default as published).
# wandb_config names a placeholder project: run with WANDB_MODE=disabled (ignored, no
# network; what CoMLRL 1.4.3 also needs without a wandb login) or WANDB_MODE=offline
# (logs locally; needs `pip install wandb`).
import math
import os
import sys
from functools import partial
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from comlrl.utils.reward_processor import RewardProcessors
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

try:  # stories260k, shipped with comlrl-algos; under CoMLRL 1.4.3 set COMLRL_EXAMPLE_MODEL
    from comlrl.algos.models.loading import builtin_model_path as _builtin
except ImportError:
    _builtin = None
MODEL = os.environ.get("COMLRL_EXAMPLE_MODEL") or str(_builtin())
OUT = sys.argv[1] if len(sys.argv) > 1 else "./magrpo_multi_reward_output"

train_data = {
    "prompt": [
        "Describe a city in the clouds:",
        "Invent a new holiday and explain it:",
        "Write a bedtime story for a dragon:",
        "Explain how teleportation might work:",
        "Tell a joke about dinosaurs:",
        "Describe a world without electricity:",
        "Create a superhero with a unique power:",
        "Write a scene where the moon talks:",
        "Invent a new type of fruit:",
        "Design a playground on Mars:",
    ]
}
train_dataset = Dataset.from_dict(train_data)

model_name = MODEL
tokenizer = AutoTokenizer.from_pretrained(model_name)
agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)]


def proper_length_ratio_reward(
    completions1, completions2, target_min=2.0, target_max=3.0
):
    rewards = []
    for c1, c2 in zip(completions1, completions2):
        len1, len2 = len(c1), len(c2)
        if len1 == 0:
            rewards.append(0.0)
            continue
        ratio = len2 / len1
        if target_min <= ratio <= target_max:
            reward = 1.0
        else:
            if ratio < target_min:
                distance = target_min - ratio
            else:
                distance = ratio - target_max
            reward = math.exp(-distance)
        rewards.append(float(reward))
    return rewards


output_dir = OUT
config = MAGRPOConfig(
    num_train_epochs=1,
    agent_learning_rate=5e-5,
    logging_steps=10,
    num_generations=8,
    num_turns=1,
    max_new_tokens=16,
)

wandb_config = {
    "project": "your-project-name",
    "entity": "your-entity-name",
    "name": "length-ratio-demo",
}

configured_reward_func = partial(
    proper_length_ratio_reward, target_min=2, target_max=3
)

trainer = MAGRPOTrainer(
    agents=agents,
    reward_func=configured_reward_func,
    reward_processor=RewardProcessors.scale(factor=100.0),
    args=config,
    train_dataset=train_dataset,
    tokenizer=tokenizer,
    wandb_config=wandb_config,
)
trainer.train()
trainer.save_model(f"{output_dir}/models")
print("saved:", sorted(os.listdir(f"{output_dir}/models")))
