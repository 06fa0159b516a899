"""The per-agent, per-turn metric names of a step when agents share one model object.

Agents that share a model take one optimizer step on the sum of their losses
(``test_shared_model_update.py``); the batches of that step are agent-major (agent 0's
turns, then agent 1's), so a metric named by batch position would call agent 1's turn 0
``turn_2``. Every ``turn_<t>/.../agent_<a>`` must be agent ``a``'s turn-``t`` value, the
same whether the agents share a model or not, in the default update and the chunked one.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.models.logprobs import completion_logprobs
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.records import PolicyBatch, Rollout
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.update.metric_sums import split_terms
from comlrl.estimators.kl import kl_penalty

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(4)]
TURNS = 3


def _reward(c1: list[str], c2: list[str]) -> list[float]:
    # even total length: reward 1, which ends the episode (early_termination_threshold)
    return [float((len(a) + len(b)) % 2 == 0) for a, b in zip(c1, c2, strict=True)]


def _transition(**kw: Any) -> list[str]:
    return [f"again: {c[:8]}" for c in kw["agent_completions"]]


def _perturb(model: Any) -> None:
    """Move the policy away from its reference copy (same noise for every model), so the
    KL of each turn's completions is non-zero and differs between turns and agents."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))


def _trainer(tok: Any, out: Path, *, shared: bool, **overrides: Any) -> MultiAgentTrainer:
    torch.manual_seed(0)
    model = build_default_model(len(tok), seed=0)
    models = [model, model] if shared else [model, copy.deepcopy(model)]
    agents = [HFAgent(m, tok, name=f"a{i}") for i, m in enumerate(models)]
    config = TrainConfig(
        num_steps=1, batch_size=2, num_generations=2, num_turns=TURNS, max_new_tokens=5,
        learning_rate=1e-2, output_dir=str(out), progress=False, parallel_agents=False,
        seed=0, kl_coef=0.1, early_termination_threshold=0.5, **overrides,
    )  # fmt: skip
    trainer = MultiAgentTrainer(
        agents, config, dataset=DATA, reward_func=_reward,
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# two"],
        transition=_transition,
    )  # fmt: skip
    for m in {id(a.model): a.model for a in trainer.agents}.values():
        _perturb(m)  # after setup took the reference copies
    return trainer


def _kl_by_hand(
    policy: Any, ref: Any, batch: PolicyBatch, temperature: float
) -> tuple[float, float]:
    """Token sum and token count of the k3 KL of one agent's completions of one turn."""
    rows = slice(0, batch.num_prompts)
    with torch.no_grad():
        logp = completion_logprobs(policy, batch, rows, temperature=temperature, fused=False)
        ref_logp = completion_logprobs(ref, batch, rows, temperature=temperature, fused=False)
    mask = batch.completion_mask.bool()
    kl = kl_penalty(logp, ref_logp, "k3")
    return float(kl[mask].double().sum()), float(mask.sum())


def _check_row(row: dict[str, float], ro: Rollout, policy: Any, refs: list[Any]) -> None:
    turns = len(ro.turns)
    for a in range(2):
        total, count = 0.0, 0.0
        for t in range(turns):
            batch = ro.turns[t].agents[a].batch
            s, n = _kl_by_hand(policy, refs[a], batch, 1.0)
            total, count = total + s, count + n
            assert row[f"turn_{t}/kl/agent_{a}"] == pytest.approx(s / n, rel=1e-4, abs=1e-7), (a, t)
            lengths = batch.completion_mask.sum(dim=1).float()
            assert row[f"turn_{t}/completion_len_mean/agent_{a}"] == pytest.approx(
                float(lengths.mean())
            )
        assert row[f"kl/agent_{a}"] == pytest.approx(total / count, rel=1e-4, abs=1e-7)
        for key in ("loss", "grad_norm", "clip_fraction", "ratio_mean"):
            assert f"{key}/agent_{a}" in row, (key, a)
    # no metric names a turn the rollout does not have (batch positions 3.. of 2 agents)
    named = {int(m.group(1)) for k in row if (m := re.match(r"turn_(\d+)/", k))}
    assert named == set(range(turns))


@pytest.mark.parametrize("chunked", [False, True], ids=["update_policy", "one_node_chunk"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared_model", "separate_models"])
def test_turn_metrics_of_each_agent_are_that_agents_turn(
    tiny_tokenizer: Any, tmp_path: Path, shared: bool, chunked: bool
) -> None:
    extra = {"update_chunk_nodes": 10**6, "clip_ratio": 0.2} if chunked else {}
    trainer = _trainer(tiny_tokenizer, tmp_path, shared=shared, **extra)
    run = trainer
    before = copy.deepcopy(run.agents[0].model).eval()  # both agents' policy before the step
    result = run.step()
    ro, row = result.rollout, result.row
    assert ro is not None
    # early termination: later turns hold fewer nodes than the joint actions before them
    nodes = [turn.num_nodes for turn in ro.turns]
    assert len(nodes) == TURNS and nodes[1] < 2 * nodes[0], nodes
    assert run.ref_models is not None
    _check_row(row, ro, before, run.ref_models)
    if shared:  # one step: its loss (the sum of both terms) and grad norm for both agents
        assert row["loss/agent_0"] == row["loss/agent_1"]
        assert row["grad_norm/agent_0"] == row["grad_norm/agent_1"]
        assert row["turn_0/kl/agent_0"] != row["turn_0/kl/agent_1"]


def test_actor_critic_turn_metrics_of_shared_actors_are_each_agents_turn(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    from comlrl.algos.models.value import Critic
    from comlrl.algos.recipes.actor_critic.recipe import ActorCriticConfig, MAACTrainer

    torch.manual_seed(0)
    model = build_default_model(len(tiny_tokenizer), seed=0)
    agents = [HFAgent(model, tiny_tokenizer, name=f"agent_{i}") for i in range(2)]
    critic = Critic(build_default_model(len(tiny_tokenizer), seed=9), tiny_tokenizer, kind="v")
    cfg = ActorCriticConfig(
        num_steps=1, batch_size=2, num_generations=1, num_turns=TURNS, max_new_tokens=5,
        critic_mode="separate", output_dir=str(tmp_path), progress=False, log_samples=0,
        kl_coef=0.1, early_termination_threshold=0.5, parallel_agents=False,
    )  # fmt: skip
    trainer = MAACTrainer(
        agents, cfg, critics=[critic], dataset=DATA, reward_func=_reward,
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# two"],
        transition=_transition,
    )  # fmt: skip
    _perturb(model)
    before = copy.deepcopy(model).eval()
    result = trainer.step()
    assert result.rollout is not None
    assert trainer.ref_models is not None
    _check_row(result.row, result.rollout, before, trainer.ref_models)
    assert result.row["loss/agent_0"] == result.row["loss/agent_1"]


def test_split_terms_gives_each_member_its_own_terms_and_the_shared_step() -> None:
    stats = {"loss": 3.0, "grad_norm": 0.5, "term_0/kl": 0.1, "term_2/turn_1/kl": 0.2}
    got = split_terms(stats, [0, 2])
    assert got == {
        0: {"loss": 3.0, "grad_norm": 0.5, "kl": 0.1},
        2: {"loss": 3.0, "grad_norm": 0.5, "turn_1/kl": 0.2},
    }
    assert split_terms({"kl": 0.1}, [1]) == {1: {"kl": 0.1}}
    with pytest.raises(ValueError, match="names term 5, not one of the members"):
        split_terms({"term_5/kl": 0.1}, [0, 2])


def test_update_policy_refuses_turn_labels_that_do_not_fit_the_batches(tiny_model: Any) -> None:
    from comlrl.algos.training.update.policy import update_policy
    from comlrl.algos.training.update.settings import UpdateSettings

    ids = torch.arange(8).reshape(4, 2)
    batch = PolicyBatch(ids, torch.ones_like(ids), torch.ones(4, 1, dtype=torch.bool),
                        torch.zeros(4, 1), group_size=2)  # fmt: skip
    opt = torch.optim.SGD(tiny_model.parameters(), lr=0.0)
    adv = [torch.zeros(4), torch.zeros(4)]
    with pytest.raises(ValueError, match="turns has 1 labels for 2 batches"):
        update_policy(tiny_model, opt, [batch, batch], adv, UpdateSettings(), turns=[0])
    with pytest.raises(ValueError, match=r"turns must be rollout turns \(>= 0\), got \[0, -1\]"):
        update_policy(tiny_model, opt, [batch, batch], adv, UpdateSettings(), turns=[0, -1])


@pytest.mark.parametrize("split", [False, True], ids=["chunks", "chunks_split_by_turn"])
def test_chunked_steps_on_a_shared_model_log_every_agents_turns(
    tiny_tokenizer: Any, tmp_path: Path, split: bool
) -> None:
    trainer = _trainer(tiny_tokenizer, tmp_path, shared=True, update_chunk_nodes=2, clip_ratio=0.2,
                       update_chunk_split_turns=split)  # fmt: skip
    result = trainer.step()
    assert result.rollout is not None
    row, turns = result.row, len(result.rollout.turns)
    named = {int(m.group(1)) for k in row if (m := re.match(r"turn_(\d+)/", k))}
    assert named == set(range(turns))
    for a in range(2):
        assert all(f"turn_{t}/ratio_mean/agent_{a}" in row for t in range(turns))
        assert row[f"optimizer_steps/agent_{a}"] > 1
    assert not any(k.startswith("term_") or "/term_" in k for k in row)
