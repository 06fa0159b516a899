"""comlrl.trainers: multi-turn MAGRPO takes CoMLRL 1.4.3's optimizer steps (one per turn of
each ``rollout_buffer_size`` rollout-tree nodes, in 1.4.3's buffer order)."""

from __future__ import annotations

import collections
import math
from typing import Any

import pytest
import torch
from comlrl.trainers import MAGRPOConfig, MAGRPOTrainer
from torch.optim.optimizer import register_optimizer_step_post_hook


def _preorder_turns(turns: int, branches: int, t: int = 0) -> list[int]:
    """The turn of each node of one full tree, in 1.4.3's env-step (pre-)order."""
    below = [] if t + 1 == turns else _preorder_turns(turns, branches, t + 1) * branches
    return [t, *below]


def steps_143(examples: int, turns: int, branches: int, buffer: int, batch: int) -> int:
    """1.4.3's optimizer steps per agent for one epoch (``magrpo.py`` ``_train_step_returns``,
    ``_process_buffer``, ``_update_from_samples``): every example's nodes go, in pre-order, into
    the agent's buffer, which persists across examples; a buffer of ``buffer`` nodes is
    updated per turn, each turn's nodes in steps of ``batch`` (``train_batch_size``); the
    epoch's end updates what is left."""
    steps, held = 0, []

    def drain() -> int:
        counts = collections.Counter(held)
        held.clear()
        return sum(math.ceil(n / batch) for n in counts.values())

    for _ in range(examples):
        for t in _preorder_turns(turns, branches):
            held.append(t)
            if len(held) >= buffer:
                steps += drain()
    return steps + drain()


@pytest.mark.parametrize(
    ("examples", "turns", "branches", "buffer", "batch", "measured"),
    [(4, 2, 2, 2, 2, 10), (4, 2, 2, 3, 3, 8), (4, 2, 2, 4, 4, 6), (5, 3, 2, 2, 2, 30),
     (4, 2, 2, 2, 1, 12), (4, 2, 2, 4, 2, 8), (6, 2, 3, 3, 3, 14), (4, 3, 2, 2, 2, 24),
     (4, 3, 2, 4, 4, 18)],
)  # fmt: skip
def test_the_1_4_3_step_count_derivation_matches_1_4_3_runs(
    examples: int, turns: int, branches: int, buffer: int, batch: int, measured: int
) -> None:
    # ``measured``: optimizer.step calls per agent of CoMLRL 1.4.3's MAGRPOTrainer.train()
    # on stories260k (G = branches, aligned joint actions, early_termination_threshold=None)
    assert steps_143(examples, turns, branches, buffer, batch) == measured


@pytest.mark.parametrize(
    ("examples", "turns", "gens", "buffer"), [(4, 2, 2, 2), (6, 2, 3, 3), (4, 3, 2, 4)]
)
def test_multi_turn_magrpo_takes_1_4_3_optimizer_steps(
    stories260k: str, examples: int, turns: int, gens: int, buffer: int
) -> None:
    # the examples fill whole steps of train_batch_size (= buffer): a last, short step wraps
    # around to the data's start here (docs/compat.md, "Batching"), unlike 1.4.3
    torch.manual_seed(0)

    def reward(c1: list[str], c2: list[str]) -> list[float]:
        return [float(len(b) > len(a)) for a, b in zip(c1, c2, strict=True)]

    def transition(
        prompt: str, agent_completions: list[str], num_agents: int, **_: Any
    ) -> list[str]:
        return [f"{prompt} then" for _ in range(num_agents)]

    trainer = MAGRPOTrainer(
        agent_model=stories260k, num_agents=2, reward_func=reward,
        train_dataset=[{"prompt": f"Once upon a time {i}"} for i in range(examples)],
        formatters=[lambda ex: ex["prompt"]] * 2, external_transition=transition,
        args=MAGRPOConfig(
            num_train_epochs=1, num_generations=gens, max_new_tokens=4, num_turns=turns,
            early_termination_threshold=None, rollout_buffer_size=buffer, eval_interval=0,
            agent_learning_rate=1e-3,
        ),
    )  # fmt: skip
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    counts: collections.Counter[int] = collections.Counter()
    handle = register_optimizer_step_post_hook(lambda opt, *_: counts.update([id(opt)]))
    try:
        rows = trainer.train()
    finally:
        handle.remove()
    expected = steps_143(examples, turns, gens, buffer, buffer)
    assert sorted(counts.values()) == [expected, expected]
    assert sum(row["optimizer_steps/agent_0"] for row in rows) == expected
    assert all(math.isfinite(row["loss/agent_0"]) for row in rows)
    after = list(trainer.agents[0].parameters())
    assert not all(torch.equal(p, q) for p, q in zip(before, after, strict=True))
