"""MAGRPO through CoMLRL 1.4.3's submodule paths, with ``RewardProcessors``, a
``model_config``, a ``wandb_config`` and ``save_model``.

The reward sums two terms (agent 1 ends its sentence; the two agents do not repeat each
other) and ``RewardProcessors.shift`` / ``scale`` centre and stretch it. ``wandb_config``
names a placeholder project: run with ``WANDB_MODE=disabled`` (nothing is imported or
sent) or ``WANDB_MODE=offline``. Usage: ``python processors_and_wandb.py [OUT]``.
"""

import os
import sys

from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
from comlrl.utils.reward_processor import RewardProcessors
from comlrl.utils.reward_utils import set_reward_range
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

try:  # stories260k ships with comlrl-algos
    from comlrl.algos.models.loading import builtin_model_path as _builtin
except ImportError:
    _builtin = None
MODEL = os.environ.get("COMLRL_EXAMPLE_MODEL") or str(_builtin())
OUT = sys.argv[1] if len(sys.argv) > 1 else "./processors_and_wandb_out"


def ends_and_differs(prompts, first, second):
    """0.5 when agent 1's text ends with a full stop, plus 0.5 when it shares no word with
    agent 0's (one float per joint action; ``prompts`` is passed first, as 1.4.3 does for
    a function with A + 1 parameters)."""
    rewards = []
    for a, b in zip(first, second):
        ends = 0.5 if b.rstrip().endswith(".") else 0.0
        differs = 0.5 if not set(a.split()) & set(b.split()) else 0.0
        rewards.append(ends + differs)
    return rewards


set_reward_range(ends_and_differs, 0.0, 1.0)  # declared range (1.4.3 reads it for plots)
center = RewardProcessors.shift(value=-0.5)
stretch = RewardProcessors.scale(factor=4.0)

data = Dataset.from_dict(
    {"prompt": ["The little train", "A cat named Tom", "Sara saw a rainbow", "The old tree"]}
)
tokenizer = AutoTokenizer.from_pretrained(MODEL)
agents = [AutoModelForCausalLM.from_pretrained(MODEL) for _ in range(2)]
trainer = MAGRPOTrainer(
    agents=agents,
    tokenizer=tokenizer,
    model_config={"torch_dtype": "float32"},
    train_dataset=data,
    eval_dataset=data.select(range(2)),
    reward_func=ends_and_differs,
    reward_processor=lambda r: stretch(center(r)),
    formatters=[lambda ex: ex["prompt"], lambda ex: ex["prompt"] + ". Then"],
    wandb_config={"project": "placeholder-project", "name": "processors-demo"},
    args=MAGRPOConfig(
        num_turns=1,
        num_train_epochs=1,
        agent_learning_rate=5e-4,
        num_generations=3,
        max_new_tokens=12,
        rollout_buffer_size=2,
        eval_interval=2,
        eval_num_samples=2,
    ),
)
trainer.train()
print("eval:", {k: round(v, 3) for k, v in sorted(trainer.evaluate().items())})
trainer.save_model(f"{OUT}/models")
print("saved:", sorted(os.listdir(f"{OUT}/models")))
