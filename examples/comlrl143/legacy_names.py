"""Pre-1.4.3 CoMLRL names on comlrl.trainers: the ``comlrl.trainers.magrpo`` module,
``MAGRPOTrainer(model=...)`` and the old config fields ``learning_rate``,
``per_device_train_batch_size`` and ``termination_threshold``.

Each old name works with a ``DeprecationWarning`` that names its 1.4.3 replacement
(docs/compat.md). The task: agent 1 should answer in about as many words as agent 0.
Usage: ``python legacy_names.py [OUT]`` (stories260k unless COMLRL_EXAMPLE_MODEL is set).
"""

import os
import sys
import warnings

warnings.simplefilter("always", DeprecationWarning)  # show every old name's warning

from comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402 (pre-1.4.3 path)

try:  # stories260k ships with comlrl-algos
    from comlrl.algos.models.loading import builtin_model_path as _builtin
except ImportError:
    _builtin = None
MODEL = os.environ.get("COMLRL_EXAMPLE_MODEL") or str(_builtin())
OUT = sys.argv[1] if len(sys.argv) > 1 else "./legacy_names_out"


def similar_word_counts(first, second):
    """1 when both completions have the same number of words, less as they drift apart."""
    return [1.0 / (1.0 + abs(len(a.split()) - len(b.split()))) for a, b in zip(first, second)]


config = MAGRPOConfig(  # this module's MAGRPOConfig defaults to one turn, as before 1.4.3
    learning_rate=1e-3,  # 1.4.3: agent_learning_rate
    per_device_train_batch_size=2,  # 1.4.3: rollout_buffer_size (examples per step)
    termination_threshold=None,  # 1.4.3: early_termination_threshold
    num_train_epochs=1,
    num_generations=2,
    max_new_tokens=12,
    eval_interval=0,
)
trainer = MAGRPOTrainer(
    model=MODEL,  # 1.4.3: agent_model
    num_agents=2,
    train_dataset=[{"prompt": p} for p in ("A bird sang", "The moon was", "Mia baked")],
    reward_func=similar_word_counts,
    args=config,
)
rows = trainer.train()
print("steps:", len(rows), "last reward:", round(rows[-1]["reward_mean"], 3))
trainer.save_model(f"{OUT}/models")
print("saved:", sorted(os.listdir(f"{OUT}/models")))
