"""The group-baseline recipe's advantage options: whose returns a baseline is taken over
(``advantage_stats``: each agent's own, Dr. MAS; or the agents' pooled) and which completions
(``advantage_group``: a tree node's, or a turn's of one example, AT-GRPO), and the
``grad_norm_ratio`` metric."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.records import Rollout, TurnRollout
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import ConfigError, TrainConfig, load_config
from comlrl.algos.training.update.grad_norms import grad_norm_ratio
from comlrl.estimators.advantages import Scale, compute_advantages
from comlrl.estimators.joint import credit_completions, joint_action_indices

NAMES = ("grpo", "rloo", "remax", "reinforce")
SCALES: tuple[Scale, ...] = ("none", "group", "batch")
G = 2


def _turn(t: int, example_index: list[int], returns: torch.Tensor) -> TurnRollout:
    n = len(example_index)
    joint = joint_action_indices(2, G, "cross")  # K = 4: each completion its own credit
    k = joint.shape[0]
    samples = SimpleNamespace(batch=SimpleNamespace(group_size=G))  # all group_advantages reads
    return TurnRollout(
        turn=t, example_index=torch.tensor(example_index), parent=torch.zeros(n, dtype=torch.long),
        agents=(samples, samples),  # type: ignore[arg-type]
        joint_index=joint, rewards=returns, terminal=torch.zeros(n, k, dtype=torch.bool),
        child=torch.full((n, k), -1), returns=returns,
    )  # fmt: skip


def _rollout() -> Rollout:
    """Two examples, two turns; at turn 1 example 0's tree has two nodes, example 1's one.
    Joint returns weight agent 1's part ten times agent 0's, so the credited returns of the
    two agents differ in range (cross joint actions)."""
    gen = torch.Generator().manual_seed(3)
    turns = []
    for t, examples in enumerate(([0, 1], [0, 0, 1])):
        parts = torch.randint(0, 3, (len(examples), G, 2), generator=gen).float()
        joint = joint_action_indices(2, G, "cross")
        returns = parts[:, joint[:, 0], 0] + 10 * parts[:, joint[:, 1], 1]  # [N, K]
        turns.append(_turn(t, examples, returns))
    return Rollout(examples=({}, {}), turns=tuple(turns))


def _credited(ro: Rollout) -> list[torch.Tensor]:
    return [credit_completions(t.returns, t.joint_index, G) for t in ro.turns]  # [A, N, G]


@pytest.mark.parametrize(("name", "scale"), list(itertools.product(NAMES, SCALES)))
def test_defaults_are_each_agents_own_returns_over_its_node_group(name: str, scale: Scale) -> None:
    # advantage_stats=agent advantage_group=node: one compute_advantages call per turn and
    # agent with the nodes as groups (what the recipe computed before these options)
    ro = _rollout()
    got = group_baseline.group_advantages(ro, estimator=name, scale=scale)
    for t, credited in enumerate(_credited(ro)):
        for a in range(2):
            want = compute_advantages(credited[a], estimator=name, scale=scale).reshape(-1)
            torch.testing.assert_close(got[t][a], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("name", "scale"), list(itertools.product(NAMES, SCALES)))
def test_turn_groups_pool_one_examples_nodes_per_agent(name: str, scale: Scale) -> None:
    ro = _rollout()
    got = group_baseline.group_advantages(ro, estimator=name, scale=scale, group="turn")
    for t, (turn, credited) in enumerate(zip(ro.turns, _credited(ro), strict=True)):
        ids = turn.example_index.repeat_interleave(G)
        for a in range(2):
            want = compute_advantages(
                credited[a].reshape(-1), estimator=name, group_ids=ids, scale=scale
            )
            torch.testing.assert_close(got[t][a], want, rtol=1e-6, atol=1e-6)
    # at turn 1 example 0 has two nodes: its four completions per agent are one group
    mean_only = group_baseline.group_advantages(ro, estimator="grpo", scale="none", group="turn")
    assert abs(float(mean_only[1][0][:4].sum())) < 1e-5
    node = group_baseline.group_advantages(ro, estimator="grpo", scale="none")
    assert not torch.allclose(node[1][0], mean_only[1][0])


@pytest.mark.parametrize(("name", "scale"), list(itertools.product(NAMES, SCALES)))
def test_global_stats_pool_the_agents(name: str, scale: Scale) -> None:
    ro = _rollout()
    got = group_baseline.group_advantages(ro, estimator=name, scale=scale, stats="global")
    for t, credited in enumerate(_credited(ro)):
        n = credited.shape[1]
        ids = torch.arange(n).repeat_interleave(G).repeat(2)
        want = compute_advantages(
            credited.reshape(-1), estimator=name, group_ids=ids, scale=scale
        ).reshape(2, -1)
        for a in range(2):
            torch.testing.assert_close(got[t][a], want[a], rtol=1e-6, atol=1e-6)


def test_global_stats_give_the_low_range_agent_smaller_advantages_agent_stats_do_not() -> None:
    ro = _rollout()

    def spread(stats: str) -> float:  # agent 1's largest advantage over agent 0's
        adv = group_baseline.group_advantages(ro, estimator="grpo", stats=stats)
        return float(adv[0][1].abs().max() / adv[0][0].abs().max())

    assert spread("global") > 3.0  # agent 1's part weighs 10x: pooled, agent 0 shrinks
    # own group std, G = 2: every varying group's advantages are +-1 for both agents
    assert spread("agent") == pytest.approx(1.0, rel=1e-5)


def test_bad_option_values_fail_naming_the_value_and_the_choices() -> None:
    with pytest.raises(
        ConfigError, match=r"advantage_stats: Input should be 'agent' or 'global'.*'team'"
    ):
        load_config(None, ["advantage_stats=team"])
    with pytest.raises(
        ConfigError, match=r"advantage_group: Input should be 'node' or 'turn'.*'example'"
    ):
        load_config(None, ["advantage_group=example"])
    cfg = load_config(None, ["advantage_stats=global", "advantage_group=turn"])
    assert isinstance(cfg, TrainConfig)
    assert (cfg.advantage_stats, cfg.advantage_group) == ("global", "turn")


def test_grad_norm_ratio_is_the_largest_over_the_median_agent() -> None:
    assert grad_norm_ratio([2.0, 8.0]) == 4.0  # two agents: larger over smaller
    assert grad_norm_ratio([1.0, 2.0, 6.0]) == 3.0
    assert grad_norm_ratio([1.0, 2.0, 3.0, 9.0]) == 4.5  # lower middle of four
    assert grad_norm_ratio([0.0, 0.0]) == 1.0
    assert grad_norm_ratio([0.0, 3.0]) is None  # unbounded
    assert grad_norm_ratio([5.0]) is None


def _reward(completions_1: list[str], completions_2: list[str]) -> list[float]:
    return [len(a) % 3 + 10.0 * (len(b) % 3) for a, b in zip(completions_1, completions_2)]


def test_a_step_logs_the_agents_grad_norms_and_their_ratio(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer, name=f"a{i}")
        for i in range(2)
    ]
    config = TrainConfig(
        num_steps=1, batch_size=2, num_generations=2, max_new_tokens=4, output_dir=str(tmp_path),
        progress=False, parallel_agents=False, seed=0, joint_mode="cross",
        advantage_stats="global", advantage_group="turn",
    )  # fmt: skip
    trainer = MultiAgentTrainer(
        agents, config, dataset=[{"p": "a"}, {"p": "b"}], reward_func=_reward,
        formatters=[lambda ex: ex["p"]] * 2,
    )  # fmt: skip
    row = trainer.step().row
    norms = [row["grad_norm/agent_0"], row["grad_norm/agent_1"]]
    assert row["grad_norm_ratio"] == pytest.approx(max(norms) / min(norms))
