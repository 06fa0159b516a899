"""comlrl.algos.training.update.node_chunks: CoMLRL 1.4.3's update schedule in chunks of tree nodes
(``update_chunk_nodes``): the node order, the plan, and the recipe's optimizer steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.actor_critic.config import ActorCriticConfig
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.records import PolicyBatch, Rollout, TurnRollout
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.update import node_chunks
from comlrl.algos.training.update.node_chunks import chunk_update_plan, preorder_nodes, select_nodes
from comlrl.algos.training.update.settings import UpdateSettings
from hypothesis import given, settings
from hypothesis import strategies as st

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(4)]


def _turn(t: int, child: list[list[int]]) -> TurnRollout:
    n, k = len(child), len(child[0])
    return TurnRollout(
        turn=t, example_index=torch.zeros(n, dtype=torch.long), parent=torch.zeros(n, dtype=torch.long),
        agents=(), joint_index=torch.zeros(k, 1, dtype=torch.long), rewards=torch.zeros(n, k),
        terminal=torch.zeros(n, k, dtype=torch.bool), child=torch.tensor(child, dtype=torch.long),
        returns=torch.zeros(n, k),
    )  # fmt: skip


def _tree(widths: list[int], k: int, keep: list[bool]) -> Rollout:
    """Turns of ``widths[0]`` roots, each joint action opening a child while ``keep`` says so
    (children numbered in breadth order, as the rollout numbers them)."""
    turns, flags, count = [], iter(keep * 100), widths[0]
    for t in range(len(widths)):
        child, nxt = [], 0
        for _ in range(count):
            row = []
            for _ in range(k):
                if t + 1 < len(widths) and next(flags):
                    row.append(nxt)
                    nxt += 1
                else:
                    row.append(-1)
            child.append(row)
        turns.append(_turn(t, child))
        count = nxt
        if not count:
            break
    return Rollout(examples=(), turns=tuple(turns))


def test_preorder_visits_a_node_then_each_joint_actions_subtree_as_143_buffers_them() -> None:
    # two examples, two joint actions per node, three turns
    ro = _tree([2, 1, 1], k=2, keep=[True])
    order = preorder_nodes(ro)
    assert order[:7] == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (2, 2), (2, 3)]
    assert order[7] == (0, 1) and len(order) == 14
    # chunks of 3 nodes, one step each (split: one per turn a chunk holds), nodes in pre-order
    assert chunk_update_plan(ro, 3)[:2] == [[(0, [0]), (1, [0]), (2, [0])], [(1, [1]), (2, [1, 2])]]
    split = chunk_update_plan(ro, 3, split_turns=True)
    assert split[:5] == [[(0, [0])], [(1, [0])], [(2, [0])], [(1, [1])], [(2, [1, 2])]]


@settings(max_examples=40, deadline=None)
@given(
    roots=st.integers(1, 3),
    k=st.integers(1, 3),
    keep=st.lists(st.booleans(), min_size=1, max_size=6),
    chunk=st.integers(1, 7),
    split=st.booleans(),
)
def test_plan_updates_every_node_once_in_chunks_of_at_most_r(
    roots: int, k: int, keep: list[bool], chunk: int, split: bool
) -> None:
    ro = _tree([roots, 1, 1], k=k, keep=keep)
    plan = chunk_update_plan(ro, chunk, split)
    flat = [(t, n) for step in plan for t, nodes in step for n in nodes]
    assert sorted(flat) == sorted(preorder_nodes(ro))
    assert all(sum(len(nodes) for _, nodes in step) <= chunk for step in plan)
    assert not split or all(len(step) == 1 for step in plan)
    # each chunk of the pre-order is whole in consecutive steps
    order = preorder_nodes(ro)
    chunks = [sorted(order[i : i + chunk]) for i in range(0, len(order), chunk)]
    steps = iter(plan)
    for expected in chunks:
        got: list[tuple[int, int]] = []
        while len(got) < len(expected):
            got += [(t, n) for t, nodes in next(steps) for n in nodes]
        assert sorted(got) == expected
    # children are numbered in breadth order, so a step's nodes of one turn ascend, and one
    # chunk of every node is the whole rollout, turn by turn (the default update's batches)
    assert all(nodes == sorted(nodes) for step in plan for _, nodes in step)
    if chunk >= len(order) and not split:
        assert plan == [[(t, list(range(turn.num_nodes))) for t, turn in enumerate(ro.turns)]]


def test_malformed_child_links_and_a_zero_chunk_are_refused() -> None:
    ro = Rollout(examples=(), turns=(_turn(0, [[0, 0]]), _turn(1, [[-1, -1]])))
    with pytest.raises(ValueError, match="child links"):
        preorder_nodes(ro)
    with pytest.raises(ValueError, match="chunk_nodes must be >= 1"):
        chunk_update_plan(_tree([1], 2, [False]), 0)


def test_select_nodes_keeps_whole_groups_in_the_given_order() -> None:
    ids = torch.arange(12).reshape(6, 2)
    batch = PolicyBatch(ids, torch.ones_like(ids), torch.ones(6, 1, dtype=torch.bool),
                        ids[:, 1:].float(), group_size=2)  # fmt: skip
    picked = select_nodes(batch, [2, 0])
    assert picked.input_ids[:, 0].tolist() == [8, 10, 0, 2]
    assert picked.behaviour_logprobs[:, 0].tolist() == [9.0, 11.0, 1.0, 3.0]
    assert picked.group_size == 2 and picked.completion_mask.dtype == torch.bool
    for outside in ([3], [0, -1]):  # torch alone says only "index out of range in self"
        with pytest.raises(IndexError, match=r"outside the batch's 3 nodes \(0 to 2\)"):
            select_nodes(batch, outside)


def test_actor_critic_configs_refuse_the_chunk_schedule() -> None:
    """The schedule is not a field of the actor-critic config: setting it (even to its
    group-baseline default) is an error that names it and says why."""
    for key, value in (
        ("update_chunk_nodes", 2),
        ("update_chunk_split_turns", True),  # not "set update_chunk_nodes"
        ("update_chunk_nodes", None),
    ):
        with pytest.raises(ValueError, match=f"unknown field '{key}'; {key} is a schedule of"):
            ActorCriticConfig(**{key: value})
    assert "update_chunk_nodes" not in ActorCriticConfig.model_fields
    with pytest.raises(ValueError, match="update_chunk_nodes"):
        TrainConfig(update_chunk_split_turns=True)


def test_chunks_without_the_ppo_clip_are_refused_before_training() -> None:
    """N2: later chunks weight completions by an importance ratio, unbounded without the
    clip (ratios of 4.9 to 353 were measured); the config names the fix."""
    with pytest.raises(ValueError, match=r"unbounded without the PPO clip: set clip_ratio"):
        TrainConfig(update_chunk_nodes=2)
    assert TrainConfig(update_chunk_nodes=2, clip_ratio=0.2).update_chunk_nodes == 2


def test_update_in_node_chunks_refuses_several_steps_without_a_clip(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """The library function itself (no config in front of it) refuses too; a plan of one
    step is on-policy and needs no clip."""
    trainer = _trainer(tiny_tokenizer, tmp_path)
    ro = trainer.step().rollout
    adv = group_baseline.group_advantages(ro, estimator="grpo")
    model, opt = trainer.agents[0].model, trainer.optimizers[0]
    with pytest.raises(ValueError, match=r"6 optimizer steps.*set UpdateSettings.clip_ratio"):
        node_chunks.update_in_node_chunks(model, opt, ro, adv, [0], UpdateSettings(), 1)
    stats = node_chunks.update_in_node_chunks(model, opt, ro, adv, [0], UpdateSettings(), 10**6)
    assert stats["optimizer_steps"] == 1.0


# --- the recipe's steps on a tiny model ------------------------------------------------------


def _reward(c1: list[str], c2: list[str]) -> list[float]:
    return [-abs(len(a) - len(b)) / 50.0 for a, b in zip(c1, c2, strict=True)]


def _transition(**kw: Any) -> list[str]:
    return [f"again: {c[:8]}" for c in kw["agent_completions"]]


def _trainer(tok: Any, out: Path, **overrides: Any) -> MultiAgentTrainer:
    torch.manual_seed(0)
    agents = [HFAgent(build_default_model(len(tok), seed=i), tok, name=f"a{i}") for i in range(2)]
    config = TrainConfig(
        num_steps=1, batch_size=2, num_generations=2, num_turns=2, max_new_tokens=4,
        output_dir=str(out), progress=False, parallel_agents=False, seed=0,
        **{"learning_rate": 1e-2, "clip_ratio": 0.2, **overrides},
    )  # fmt: skip
    return MultiAgentTrainer(
        agents, config, dataset=DATA, reward_func=_reward,
        formatters=[lambda ex: ex["text"]] * 2, transition=_transition,
    )  # fmt: skip


def _record_updates(trainer: MultiAgentTrainer, monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Per agent, the batches of every update_policy call of the chunked schedule."""
    calls: list[list[Any]] = [[] for _ in trainer.agents]
    real = node_chunks.update_policy
    models = [id(a.model) for a in trainer.agents]

    def spy(model: Any, optimizer: Any, batches: Any, advantages: Any, *a: Any, **k: Any) -> Any:
        calls[models.index(id(model))].append(list(batches))
        return real(model, optimizer, batches, advantages, *a, **k)

    monkeypatch.setattr(node_chunks, "update_policy", spy)
    return calls


def test_one_chunk_of_all_nodes_equals_todays_update_bit_for_bit(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    today = _trainer(tiny_tokenizer, tmp_path / "a")
    chunked = _trainer(tiny_tokenizer, tmp_path / "b", update_chunk_nodes=10**6)
    row_t, row_c = today.step().row, chunked.step().row
    assert row_c["optimizer_steps/agent_0"] == 1.0 and "optimizer_steps/agent_0" not in row_t
    for a in range(2):
        assert row_c[f"loss/agent_{a}"] == row_t[f"loss/agent_{a}"]
        params = zip(chunked.agents[a].model.parameters(), today.agents[a].model.parameters())
        assert all(torch.equal(p, q) for p, q in params)
    # the same chunk split by turn: one step per turn, other weights
    split = _trainer(tiny_tokenizer, tmp_path / "c", update_chunk_nodes=10**6,
                     update_chunk_split_turns=True)  # fmt: skip
    assert split.step().row["optimizer_steps/agent_0"] == 2.0
    params = zip(split.agents[0].model.parameters(), today.agents[0].model.parameters())
    assert not all(torch.equal(p, q) for p, q in params)


def test_chunks_of_one_node_take_one_step_per_node_in_143_order(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = _trainer(tiny_tokenizer, tmp_path, update_chunk_nodes=1)
    calls = _record_updates(trainer, monkeypatch)
    before = [p.detach().clone() for p in trainer.agents[0].model.parameters()]
    result = trainer.step()
    ro, row = result.rollout, result.row
    # 2 examples, each a root and its G=2 joint actions' children, in 1.4.3's env-step order
    order = preorder_nodes(ro)
    assert order == [(0, 0), (1, 0), (1, 1), (0, 1), (1, 2), (1, 3)]
    assert row["optimizer_steps/agent_0"] == row["optimizer_steps/agent_1"] == len(order)
    for a in range(2):
        assert len(calls[a]) == len(order)
        for (t, n), batches in zip(order, calls[a], strict=True):
            expected = select_nodes(ro.turns[t].agents[a].batch, [n]).input_ids
            assert len(batches) == 1 and torch.equal(batches[0].input_ids, expected)
    params = zip(before, trainer.agents[0].model.parameters(), strict=True)
    assert not all(torch.equal(p, q) for p, q in params)


def test_later_chunks_use_the_importance_ratio(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    real = node_chunks.update_policy

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(a[4].importance_ratio)
        return real(*a, **k)

    monkeypatch.setattr(node_chunks, "update_policy", spy)
    row = _trainer(tiny_tokenizer, tmp_path, update_chunk_nodes=2).step().row
    # 6 nodes per agent in chunks of 2: the first step on-policy, the two after it not
    assert seen == [False, True, True] * 2
    # after the first step the sampled completions are off-policy: the ratio moved from 1
    assert row["ratio_mean/agent_0"] != 1.0


def test_chunked_mismatch_metrics_measure_the_sampler_not_the_drift(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """The mismatch of each later chunk is taken before the first optimizer step: the
    float32 native sampler's behaviour log-probs are the trainer's (gap ~1e-7), however
    far the earlier chunks' steps moved the weights (drift 0.03-0.18 was reported)."""
    trainer = _trainer(tiny_tokenizer, tmp_path, update_chunk_nodes=1, learning_rate=5e-2)
    row = trainer.train_step()
    assert row["optimizer_steps/agent_0"] == 6.0
    assert row["ratio_mean/agent_0"] != pytest.approx(1.0, abs=1e-3)  # the weights moved
    for a in range(2):
        assert row[f"mismatch_abs_logp_diff/agent_{a}"] < 1e-5
        assert row[f"mismatch_kl/agent_{a}"] < 1e-6


def test_tis_with_chunks_clips_later_chunks_against_the_old_logprobs(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """With TIS the later chunks' PPO ratio is pi / pi_old (pi_old: the trainer before the
    step's first optimizer step), so the clip engages once the earlier chunks moved the
    weights; the truncated weight min(pi_old / pi_behaviour, C) carries only the sampler's
    gap (1 here: float32 native sampling)."""
    trainer = _trainer(
        tiny_tokenizer, tmp_path, update_chunk_nodes=1, learning_rate=2e-1, tis="token"
    )
    row = trainer.train_step()
    # measured: agent 0's clip fraction 0.04 (mean ratio 0.98)
    assert max(row[f"clip_fraction/agent_{a}"] for a in range(2)) > 0.0
    for a in range(2):
        assert row[f"ratio_mean/agent_{a}"] != pytest.approx(1.0, abs=1e-3)
        assert row[f"tis_weight_mean/agent_{a}"] == pytest.approx(1.0, abs=1e-4)
