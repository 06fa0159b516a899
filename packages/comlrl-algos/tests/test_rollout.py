"""rollout(): the multi-turn tree as data (shape, transition contract, termination, branching),
and agents of the user's own class."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.environment import CallbackEnvironment, TaskEnvironment
from comlrl.algos.rollout.tree import TreeSettings, rollout
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.core import Completion, Feedback, RewardBatch, SamplingParams, Task
from comlrl.estimators.returns import tree_returns

EXAMPLES = [{"id": i, "prompt": f"def f{i}(x):"} for i in range(3)]
PARAMS = SamplingParams(num_generations=2, max_new_tokens=6)


def _reward(c1: list[str], c2: list[str]) -> list[float]:
    return [float(len(a) % 5 + len(b) % 3) for a, b in zip(c1, c2)]


@pytest.fixture
def agents(tiny_tokenizer):  # type: ignore[no-untyped-def]
    out = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer, name=f"a{i}")
        for i in range(2)
    ]
    for i, a in enumerate(out):
        a.seed(100 + i)
    return out


def _env(calls: list[dict]) -> CallbackEnvironment:  # type: ignore[type-arg]
    def transition(
        prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent
    ):  # type: ignore[no-untyped-def]
        calls.append(
            dict(
                prompt=prompt,
                completions=list(agent_completions),
                num_agents=num_agents,
                prompts=prompt_history_per_agent,
                responses=response_history_per_agent,
            )
        )
        return [f"{prompt} #revise {a}" for a in range(num_agents)]

    return CallbackEnvironment(
        [lambda ex: ex["prompt"], lambda ex: ex["prompt"] + " # main"], _reward, transition
    )


def test_two_turns_follow_comlrls_transition_contract_and_link_the_tree(agents) -> None:  # type: ignore[no-untyped-def]
    calls: list[dict] = []  # type: ignore[type-arg]
    ro = rollout(agents, EXAMPLES, _env(calls), PARAMS, TreeSettings(num_turns=2))
    t0, t1 = ro.turns
    k = 2  # align: K = G
    assert t0.num_nodes == 3 and t1.num_nodes == 3 * k
    assert len(calls) == 3 * k
    first = calls[0]
    assert first["prompt"] == "def f0(x):" and first["num_agents"] == 2
    # histories run along the branch up to and including this turn
    assert first["prompts"] == [["def f0(x):"], ["def f0(x): # main"]]
    assert first["responses"] == [[c] for c in first["completions"]]
    assert first["completions"] == [t0.agents[a].completions[0][0].text for a in range(2)]
    # children: prompts from the transition, parents point back at their joint action
    assert t1.agents[1].prompts[0] == "def f0(x): #revise 1"
    assert t1.parent.tolist() == list(range(3 * k))
    assert t0.child.reshape(-1).tolist() == list(range(3 * k))
    assert t1.example_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert bool(t1.terminal.all()) and not bool(t0.terminal.any())
    expected = tree_returns(
        [t0.rewards, t1.rewards], [t0.child, t1.child], [t0.terminal, t1.terminal], 1.0
    )
    torch.testing.assert_close(t0.returns, expected[0])
    torch.testing.assert_close(t0.returns, t0.rewards + t1.rewards.mean(dim=1).view(3, k))


def test_cross_mode_expands_every_combination(agents) -> None:  # type: ignore[no-untyped-def]
    ro = rollout(
        agents, EXAMPLES[:1], _env([]), PARAMS, TreeSettings(num_turns=2, joint_mode="cross")
    )
    assert ro.turns[0].rewards.shape == (1, 4) and ro.turns[1].num_nodes == 4


def test_the_branching_limit_keeps_the_best_or_a_random_joint_action(agents) -> None:  # type: ignore[no-untyped-def]
    ro = rollout(agents, EXAMPLES, _env([]), PARAMS, TreeSettings(num_turns=2, max_branches=1))
    t0 = ro.turns[0]
    assert ro.turns[1].num_nodes == 3
    for n in range(3):
        best = int(torch.argmax(t0.rewards[n]))  # ties go to the lower index, as argmax
        assert int(t0.child[n, best]) >= 0 and int((t0.child[n] >= 0).sum()) == 1
    # the pruned sibling gets its expanded sibling's future (bootstrapped), not nothing
    n, pruned = 0, 1 - int(torch.argmax(t0.rewards[0]))
    assert float(t0.returns[n, pruned]) == pytest.approx(
        float(t0.rewards[n, pruned] + ro.turns[1].rewards[0].mean())
    )
    ro = rollout(
        agents,
        EXAMPLES,
        _env([]),
        PARAMS,
        TreeSettings(num_turns=2, max_branches=1, branch_select="random"),
        rng=random.Random(3),
    )
    assert ro.turns[1].num_nodes == 3


def test_early_termination_per_joint_action_and_per_node(agents) -> None:  # type: ignore[no-untyped-def]
    threshold = 2.5
    ro = rollout(
        agents,
        EXAMPLES,
        _env([]),
        PARAMS,
        TreeSettings(num_turns=2, early_termination_threshold=threshold),
    )
    t0 = ro.turns[0]
    assert torch.equal(t0.terminal, t0.rewards > threshold)
    assert torch.equal(t0.child >= 0, t0.rewards <= threshold)
    # an early end's reward is held for the skipped turn (gamma = 1: twice the reward)
    torch.testing.assert_close(t0.returns[t0.terminal], 2 * t0.rewards[t0.terminal])
    ro = rollout(
        agents,
        EXAMPLES,
        _env([]),
        PARAMS,
        TreeSettings(num_turns=2, early_termination_threshold=threshold, termination_scope="node"),
    )
    t0 = ro.turns[0]
    ended = t0.rewards.mean(dim=1) > threshold
    assert torch.equal(t0.terminal, ended[:, None].expand_as(t0.terminal))


class _RevisionTask(Task):
    """Two agents; the episode ends when agent 0 wrote an even number of characters."""

    name, num_agents, max_turns = "revise", 2, 3

    def load(self, split="train"):  # type: ignore[no-untyped-def]
        return EXAMPLES

    def prompts(self, example, history=()):  # type: ignore[no-untyped-def]
        notes = "".join(f"\n# turn {i}: {fb.texts[0]}" for i, fb in enumerate(history))
        return [example["prompt"] + notes, example["prompt"] + notes + " # main"]

    def reward(self, completions, examples):  # type: ignore[no-untyped-def]
        return RewardBatch(
            _reward(completions[0], completions[1]), [{"n": len(a)} for a in completions[0]]
        )

    def feedback(self, example, joint_action, info, turn):  # type: ignore[no-untyped-def]
        return Feedback(texts=(f"length {info['n']}", "ok"), done=info["n"] % 2 == 0)


def test_task_feedback_builds_the_next_prompts_and_done_ends_the_branch(agents) -> None:  # type: ignore[no-untyped-def]
    ro = rollout(
        agents, EXAMPLES, TaskEnvironment(_RevisionTask()), PARAMS, TreeSettings(num_turns=3)
    )
    t0 = ro.turns[0]
    done = torch.tensor([[t0.infos[n * 2 + j]["n"] % 2 == 0 for j in range(2)] for n in range(3)])
    assert torch.equal(t0.terminal, done) and torch.equal(t0.child >= 0, ~done)
    if len(ro.turns) > 1:
        t1 = ro.turns[1]
        parent = int(t1.parent[0])
        assert t1.agents[0].prompts[0].endswith(f"# turn 0: length {t0.infos[parent]['n']}")
        assert t0.feedback[parent] is not None and not t0.feedback[parent].done


class OwnAgent:
    """A user's agent: only the comlrl.core.Agent protocol plus model and tokenizer."""

    def __init__(self, model, tokenizer) -> None:  # type: ignore[no-untyped-def]
        self.name, self.model, self.tokenizer = "own", model, tokenizer

    @torch.no_grad()
    def generate(self, prompts, params):  # type: ignore[no-untyped-def]
        enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        out = self.model.generate(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            do_sample=True,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.num_generations,
            pad_token_id=0,
            eos_token_id=0,
        )
        ids = out[:, enc["input_ids"].shape[1] :]
        groups = []
        for p in range(len(prompts)):
            group = []
            for row in ids[p * params.num_generations : (p + 1) * params.num_generations]:
                n = int((row == 0).nonzero()[0]) + 1 if bool((row == 0).any()) else len(row)
                group.append(
                    Completion(
                        self.tokenizer.decode(row[:n], skip_special_tokens=True), row[:n], None
                    )
                )
            groups.append(group)
        return groups


def test_an_agent_class_of_the_users_own_trains(tiny_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # OwnAgent samples from torch's global stream: seed it, so whether the step's rewards
    # differ (and the weights move) does not depend on which tests ran before in this process
    torch.manual_seed(0)
    agents = [
        OwnAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer) for i in range(2)
    ]
    before = [p.detach().clone() for p in agents[0].model.parameters()]
    cfg = TrainConfig(
        num_steps=1,
        batch_size=2,
        num_generations=2,
        max_new_tokens=5,
        learning_rate=1e-2,
        output_dir=str(tmp_path),
        progress=False,
        parallel_agents=False,
    )
    trainer = MultiAgentTrainer(
        agents, cfg, dataset=EXAMPLES, reward_func=_reward, formatters=[lambda ex: ex["prompt"]] * 2
    )
    row = trainer.step().row
    assert math.isfinite(row["loss/agent_0"]), row["loss/agent_0"]
    assert any(not torch.equal(b, p) for b, p in zip(before, agents[0].model.parameters()))


def test_a_two_turn_step_reports_per_turn_metrics(agents, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(
        num_steps=1,
        batch_size=2,
        num_generations=2,
        max_new_tokens=5,
        num_turns=2,
        gamma=0.9,
        kl_coef=0.05,
        clip_ratio=0.2,
        output_dir=str(tmp_path),
        progress=False,
    )
    calls: list[dict] = []  # type: ignore[type-arg]
    env = _env(calls)
    trainer = MultiAgentTrainer(
        agents,
        cfg,
        dataset=EXAMPLES,
        reward_func=_reward,
        formatters=env.formatters,
        transition=env._transition,
    )
    history = trainer.train()
    row = history[0]
    for t in (0, 1):
        for key in (
            "reward_mean",
            "return_mean",
            "num_nodes",
            "advantage_mean/agent_0",
            "completion_len_mean/agent_1",
            "kl/agent_0",
            "clip_fraction/agent_1",
        ):
            assert f"turn_{t}/{key}" in row, f"turn_{t}/{key}"
    assert row["turn_1/num_nodes"] == 4 and len(calls) == 4
    samples = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert any('"turn": 1' in s for s in samples)
