"""IAC with a value head on each agent (``use_separate_critic=False``) through CoMLRL
1.4.3's module path ``comlrl.trainers.actor_critic.iac``, and a reward that returns one
value per agent.

Agent 0 is rewarded for short answers and agent 1 for long ones: a reward function that
returns ``A`` values for a joint action gives agent ``a`` the ``a``-th (1.4.3's rule for
IAC and MAAC), so each agent's critic learns its own reward.
Usage: ``python per_agent_iac.py [OUT]``.
"""

import os
import sys

from comlrl.trainers.actor_critic.iac import IACConfig, IACTrainer
from datasets import Dataset
from transformers import AutoTokenizer

try:  # stories260k ships with comlrl-algos
    from comlrl.algos.models.loading import builtin_model_path as _builtin
except ImportError:
    _builtin = None
MODEL = os.environ.get("COMLRL_EXAMPLE_MODEL") or str(_builtin())
OUT = sys.argv[1] if len(sys.argv) > 1 else "./per_agent_iac_out"


def short_then_long(first, second):
    """[agent 0's reward, agent 1's reward] for the one joint action (1.4.3 calls the
    function once per joint action with one-element lists)."""
    a, b = len(first[0].split()), len(second[0].split())
    return [1.0 / (1.0 + a), b / (1.0 + b)]


trainer = IACTrainer(
    agent_model=MODEL,
    tokenizer=AutoTokenizer.from_pretrained(MODEL),
    train_dataset=Dataset.from_dict(
        {"prompt": ["Ben had a kite", "The sun came up", "A frog jumped", "Anna smiled"]}
    ),
    reward_func=short_then_long,
    formatters=[lambda ex: ex["prompt"]] * 2,
    args=IACConfig(
        num_agents=2,
        num_turns=1,
        use_separate_critic=False,
        num_generations=2,
        rollout_buffer_size=2,
        num_train_epochs=1,
        max_new_tokens=12,
        agent_learning_rate=1e-3,
    ),
)
rows = trainer.train()
print("IAC steps:", len(rows))
print("value loss per agent:", [round(rows[-1][f"value_loss/agent_{a}"], 4) for a in range(2)])
trainer.save_model(OUT)
print("saved:", sorted(os.listdir(OUT)))
