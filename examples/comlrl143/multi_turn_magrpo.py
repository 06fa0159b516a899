"""CoMLRL 1.4.3 multi-turn MAGRPO with a custom external transition (the "Multi-Turn
Interaction" guide's interface: prompt, agent_completions, num_agents and the per-agent
histories in; one next prompt per agent out), evaluation with eval_logger/eval_aggregator.

Runs unchanged under CoMLRL 1.4.3 and under this repository's ``comlrl.trainers``.
Swapped: the model (-> stories260k, COMLRL_EXAMPLE_MODEL) and sizes for a CPU.
"""

import os

from comlrl.trainers import MAGRPOConfig, MAGRPOTrainer
from datasets import Dataset

try:  # stories260k, shipped with comlrl-algos; under CoMLRL 1.4.3 set COMLRL_EXAMPLE_MODEL
    from comlrl.algos.models.loading import builtin_model_path as _builtin
except ImportError:
    _builtin = None
MODEL = os.environ.get("COMLRL_EXAMPLE_MODEL") or str(_builtin())


def revise(
    prompt,
    agent_completions,
    num_agents,
    prompt_history_per_agent=None,
    response_history_per_agent=None,
):
    return [f"{prompt} {agent_completions[i][:40]} Then" for i in range(num_agents)]


def reward(prompts, completions1, completions2):
    # prompts first: CoMLRL passes the formatted prompt list when the function asks for it
    return [
        float(len(set(a.split()) & set(b.split()))) / 5.0
        for a, b in zip(completions1, completions2)
    ]


def eval_logger(agent_completions_turns, batch_items, prompts):
    return [
        {
            "turns": len(agent_completions_turns[0][i]),
            "chars": sum(len(t) for t in agent_completions_turns[1][i]),
        }
        for i in range(len(batch_items))
    ]


def eval_aggregator(metrics, num_turns):
    return {f"turn_{num_turns}/mean_chars": sum(m["chars"] for m in metrics) / len(metrics)}


data = Dataset.from_dict(
    {"prompt": ["The cat sat", "A boy had a ball", "The sun was hot", "Mia liked to sing"]}
)
trainer = MAGRPOTrainer(
    agent_model=MODEL,
    num_agents=2,
    train_dataset=data,
    eval_dataset=data,
    reward_func=reward,
    formatters=lambda ex: ex["prompt"],
    external_transition=revise,
    eval_logger=eval_logger,
    eval_aggregator=eval_aggregator,
    args=MAGRPOConfig(
        num_turns=2,
        num_generations=2,
        max_new_tokens=12,
        num_train_epochs=1,
        early_termination_threshold=None,
        eval_interval=2,
        eval_num_samples=2,
        agent_learning_rate=1e-3,
    ),
)
trainer.train()
print("eval:", trainer.evaluate())
