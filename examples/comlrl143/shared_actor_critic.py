# CoMLRL's docs "Shared Actor-Critic" minimal example
# (docs/content/docs/examples/shared-actor-critic.md), run unchanged against this package
# except for:
#   - the model: "Qwen/Qwen2.5-0.5B" -> MODEL (stories260k; set COMLRL_EXAMPLE_MODEL);
#   - the data: load_dataset("trl-lib/tldr", split="train").select(range(128)) -> a local
#     Dataset.from_dict of 4 prompts (the build machines cannot reach the Hub);
#   - sizes, as config values: num_train_epochs=1, max_new_tokens=16 (added to IACConfig).
import os

from datasets import Dataset
from transformers import AutoTokenizer
from comlrl.trainers.actor_critic import IACConfig, IACTrainer

try:  # stories260k, shipped with comlrl-algos; under CoMLRL 1.4.3 set COMLRL_EXAMPLE_MODEL
    from comlrl.algos.models.loading import builtin_model_path as _builtin
except ImportError:
    _builtin = None
MODEL = os.environ.get("COMLRL_EXAMPLE_MODEL") or str(_builtin())

model_name = MODEL
tokenizer = AutoTokenizer.from_pretrained(model_name)

dataset = Dataset.from_dict(
    {
        "prompt": [
            "Once upon a time, a little fox",
            "Lily found a shiny stone",
            "The big dog wanted to play",
            "Tom and Sue went to the park",
        ]
    }
)


def length_balance_reward(agent1, agent2):
    a = agent1[0]
    b = agent2[0]
    denom = max(len(a), len(b), 1)
    return [1.0 - abs(len(a) - len(b)) / denom]


trainer = IACTrainer(
    agent_model=model_name,
    tokenizer=tokenizer,
    train_dataset=dataset,
    reward_func=length_balance_reward,
    formatters=[lambda ex: ex["prompt"]] * 2,
    args=IACConfig(
        num_agents=2,
        num_turns=1,
        use_separate_critic=False,
        rollout_buffer_size=4,
        train_batch_size=4,
        num_train_epochs=1,
        max_new_tokens=16,
    ),
)
trainer.train()
