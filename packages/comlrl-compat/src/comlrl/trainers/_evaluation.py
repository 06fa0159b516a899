"""CoMLRL 1.4.3's evaluation protocol on our rollout: one sampled joint action per turn on
the first ``eval_num_samples`` evaluation examples, its per-turn reward means and expected
returns, and ``eval_logger`` / ``eval_aggregator``'s metrics."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["evaluate_protocol"]


def evaluate_protocol(trainer: Any, num_eval_samples: int | None = None) -> dict[str, float]:
    """The metrics of :meth:`comlrl.trainers._base.CompatTrainer.evaluate` for ``trainer``
    (a :class:`~comlrl.trainers._base.CompatTrainer`): ``eval/turn_<t>/reward_mean``,
    ``eval/turn_<t>/expected_return`` (the undiscounted reward sum from turn ``t`` on;
    turns cut by early termination count 0) and ``eval/<key>`` from ``eval_aggregator``;
    ``{}`` without ``eval_dataset`` or examples. Scores with ``trainer.eval_reward`` when
    set (MARLHF trains on a learned reward and reports the task's)."""
    if trainer._eval_rows is None:
        return {}
    from comlrl.algos.rollout import evaluate as evaluation
    from comlrl.core import SamplingParams

    n = int(trainer.args.eval_num_samples if num_eval_samples is None else num_eval_samples)
    rows = trainer._eval_rows[:n]
    if not rows:
        return {}
    run, cfg = trainer._base_run(), trainer.config
    params = SamplingParams.from_config(cfg, 1)
    env = run.env
    # MARLHF trains on a learned reward and reports the task's
    if trainer.eval_reward is not None:
        env = copy.copy(env)
        env.reward = trainer.eval_reward
    _, rollouts = evaluation.evaluate(
        run.agents, env, rows, params, run.tree, batch_size=cfg.batch_size, seed=cfg.seed
    )
    turns = int(trainer.args.num_turns)
    # per example: per turn its (single) joint action's texts and reward
    completions: list[list[list[str]]] = [[[] for _ in rows] for _ in range(trainer.num_agents)]
    rewards: list[list[float]] = [[] for _ in rows]
    offset = 0
    for ro in rollouts:
        for turn in ro.turns:
            for node in range(turn.num_nodes):
                ex = offset + int(turn.example_index[node])
                rewards[ex].append(float(turn.rewards[node, 0]))
                k = turn.joint_index[0]
                for a in range(trainer.num_agents):
                    completions[a][ex].append(turn.agents[a].completions[node][int(k[a])].text)
        offset += len(ro.examples)
    out: dict[str, float] = {}
    for t in range(turns):
        at_t = [r[t] if t < len(r) else 0.0 for r in rewards]
        out[f"eval/turn_{t + 1}/reward_mean"] = sum(at_t) / len(at_t)
        out[f"eval/turn_{t + 1}/expected_return"] = sum(sum(r[t:]) for r in rewards) / len(rewards)
    logger, aggregator = (
        getattr(trainer, "eval_logger", None),
        getattr(trainer, "eval_aggregator", None),
    )
    if logger is not None and aggregator is not None:
        detailed = logger(
            agent_completions_turns=trainer._eval_role_completions(completions, rows),
            batch_items=rows,
            prompts=[r.get("prompt", "") for r in rows],
        )
        for key, value in aggregator(detailed, num_turns=turns).items():
            out[f"eval/{key}"] = value
    return out
