# CoMLRL's README "Usage" example (OpenMLRL/CoMLRL README.md; pre-1.4.3 names), run
# unchanged against this package except for:
#   - the model: "Qwen/Qwen2.5-0.5B" -> MODEL (stories260k; set COMLRL_EXAMPLE_MODEL);
#   - the data: load_dataset("trl-lib/tldr", split="train").select(range(128)) -> a local
#     Dataset.from_dict of 4 prompts (the build machines cannot reach the Hub);
#   - sizes, as config values: num_train_epochs=1, max_new_tokens=16 (added to MAGRPOConfig).
# The pre-1.4.3 names (comlrl.trainers.magrpo, model=, per_device_train_batch_size=) are
# accepted with a DeprecationWarning naming the 1.4.3 name (docs/compat.md).
import os

from datasets import Dataset
from transformers import AutoTokenizer
from comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

try:  # stories260k, shipped with comlrl-algos; under CoMLRL 1.4.3 set COMLRL_EXAMPLE_MODEL
    from comlrl.algos.models.loading import builtin_model_path as _builtin
except ImportError:
    _builtin = None
MODEL = os.environ.get("COMLRL_EXAMPLE_MODEL") or str(_builtin())

# Load dataset and tokenizer
tokenizer = AutoTokenizer.from_pretrained(MODEL)
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

# Initialize trainer and start training
trainer = MAGRPOTrainer(
    model=MODEL,
    num_agents=2,
    tokenizer=tokenizer,
    train_dataset=dataset,
    reward_func=lambda a, b: [abs(max(len(b[0]), 1) / max(len(a[0]), 1) - 3.0)],
    formatters=[lambda example: example["prompt"]] * 2,
    args=MAGRPOConfig(
        per_device_train_batch_size=1,
        num_train_epochs=1,
        max_new_tokens=16,
    ),
)
trainer.train()
