"""CoMLRL 1.4.3 IAC / MAAC (the actor-critic guide's setup: a critic model beside the
agents, or a value head on each agent with use_separate_critic=False), single turn.

Runs unchanged under CoMLRL 1.4.3 and under this repository's ``comlrl.trainers``.
Usage: python actor_critic.py {iac,iac-shared,maac} OUTPUT_DIR. Swapped: the model
(-> stories260k, COMLRL_EXAMPLE_MODEL) and sizes for a CPU.
"""

import os
import sys

from comlrl.trainers import IACConfig, IACTrainer, MAACConfig, MAACTrainer

try:  # stories260k, shipped with comlrl-algos; under CoMLRL 1.4.3 set COMLRL_EXAMPLE_MODEL
    from comlrl.algos.models.loading import builtin_model_path as _builtin
except ImportError:
    _builtin = None
MODEL = os.environ.get("COMLRL_EXAMPLE_MODEL") or str(_builtin())
METHOD, OUT = sys.argv[1], sys.argv[2]


def reward(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(completions1, completions2)]


train = [
    {"prompt": p}
    for p in ["Once upon a time", "The little bird", "Sam had a toy", "It was a rainy day"]
]
common = dict(
    num_turns=1,
    num_train_epochs=2,
    max_new_tokens=16,
    rollout_buffer_size=4,
    agent_learning_rate=1e-3,
    critic_learning_rate=1e-3,
)
if METHOD == "maac":
    trainer = MAACTrainer(
        agent_model=MODEL,
        critic_model=MODEL,
        reward_func=reward,
        train_dataset=train,
        args=MAACConfig(**common),
    )
else:
    shared = METHOD == "iac-shared"
    trainer = IACTrainer(
        agent_model=MODEL,
        critic_model=None if shared else MODEL,
        reward_func=reward,
        train_dataset=train,
        args=IACConfig(use_separate_critic=not shared, **common),
    )
trainer.train()
trainer.save_model(OUT)
for root, _, files in sorted(os.walk(OUT)):
    print(os.path.relpath(root, OUT), sorted(f for f in files if not f.startswith(".")))
