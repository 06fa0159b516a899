"""Evaluation: pass@k, verdicts from reward infos, multi-turn summaries, isolated random streams."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.records import AgentSamples, PolicyBatch, Rollout, TurnRollout
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.environment import CallbackEnvironment
from comlrl.algos.rollout.evaluate import (
    eval_sampling,
    evaluate,
    joint_action_passed,
    pass_at_k,
    summarize_rollouts,
)
from comlrl.algos.training.config.rl import ConfigError, TrainConfig, load_config
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(6)]


def _length_reward(c1: list[str], c2: list[str]) -> list[float]:
    return [-abs(len(a) - len(b)) / 50.0 for a, b in zip(c1, c2)]


@given(
    st.integers(1, 30).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_is_the_exact_combinatorial_estimator(nck: tuple[int, int, int]) -> None:
    """Chen et al. 2021 eq. 1 written with binomials (exact in fractions) vs. the product form."""
    n, c, k = nck
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_edges_and_bad_arguments() -> None:
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0 and pass_at_k(5, 3, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    for n, c, k in [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)]:
        with pytest.raises(ValueError, match=f"n={n}, c={c}, k={k}"):
            pass_at_k(n, c, k)


@pytest.mark.parametrize(
    ("info", "passed"),
    [
        ({"status": "passed", "passed": 3, "total": 3}, True),
        ({"status": "failed", "passed": 2, "total": 3}, False),
        ({"status": "timeout", "passed": 0, "total": 3}, False),
        ({"passed": 3, "total": 3}, True),
        ({"passed": 0, "total": 0}, False),
        ({"words": 12, "level_reached": 2}, None),
        ({}, None),
    ],
)
def test_a_joint_action_passes_only_when_its_verdict_says_all_tests_passed(
    info: dict, passed: bool | None
) -> None:
    assert joint_action_passed(info) is passed


def _turn(
    t: int, passed: list[list[bool]], child: list[list[int]], example_index: list[int]
) -> TurnRollout:
    n, k = len(passed), len(passed[0])
    batch = PolicyBatch(
        torch.zeros(n * k, 2, dtype=torch.long),
        torch.ones(n * k, 2, dtype=torch.long),
        torch.ones(n * k, 1, dtype=torch.bool),
        torch.zeros(n * k, 1),
        group_size=k,
    )
    samples = AgentSamples(("p",) * n, (), batch)
    return TurnRollout(
        turn=t,
        example_index=torch.tensor(example_index),
        parent=torch.full((n,), -1),
        agents=(samples, samples),
        joint_index=torch.tensor([[j, j] for j in range(k)]),
        rewards=torch.tensor([[float(p) for p in row] for row in passed]),
        terminal=torch.tensor([[c < 0 for c in row] for row in child]),
        child=torch.tensor(child),
        returns=torch.zeros(n, k),
        infos=tuple({"status": "passed" if p else "failed"} for row in passed for p in row),
    )


def test_multi_turn_summary_credits_a_problem_solved_after_feedback() -> None:
    """Problem 0 passes at turn 0 (joint action 0) and after feedback (joint action 1);
    problem 1 fails turn 0 and passes only after feedback on joint action 1."""
    turn0 = _turn(0, [[True, False], [False, False]], [[-1, 0], [1, 2]], [0, 1])
    turn1 = _turn(1, [[False, True], [False, False], [True, False]], [[-1, -1]] * 3, [0, 1, 1])
    row = summarize_rollouts([Rollout(examples=({}, {}), turns=(turn0, turn1))])
    assert row["num_problems"] == 2.0
    assert row["pass@1"] == pytest.approx((1 / 2 + 0) / 2)
    assert row["pass@2"] == pytest.approx((1 + 0) / 2)
    assert row["pass@1/final"] == pytest.approx((2 / 2 + 1 / 2) / 2)
    assert row["pass@2/final"] == pytest.approx(1.0)
    assert row["solved_rate"] == pytest.approx(1.0)
    assert row["turn_0/pass_rate"] == pytest.approx(1 / 4) and row[
        "turn_1/pass_rate"
    ] == pytest.approx(2 / 6)
    assert row["turn_0/reward_mean"] == pytest.approx(1 / 4) and row["turn_1/num_nodes"] == 3.0


def test_no_pass_keys_without_verdicts() -> None:
    turn = _turn(0, [[True, False]], [[-1, -1]], [0])
    turn = TurnRollout(**{**turn.__dict__, "infos": ({"words": 3}, {"words": 4})})
    row = summarize_rollouts([Rollout(examples=({},), turns=(turn,))])
    assert not any(k.startswith(("pass@", "solved")) for k in row) and row["reward_mean"] == 0.5


def test_greedy_evaluation_refuses_k_samples() -> None:
    assert eval_sampling(1, 8, greedy=True).top_k == 1
    with pytest.raises(ValueError, match="same completion 4 times"):
        eval_sampling(4, 8, greedy=True)
    with pytest.raises(ConfigError, match="eval_num_samples=3 with eval_greedy=true"):
        load_config(None, ["eval_num_samples=3"])
    assert TrainConfig(eval_num_samples=3, eval_greedy=False).eval_num_samples == 3


def _agents(tok) -> list[HFAgent]:  # type: ignore[no-untyped-def]
    agents = [
        HFAgent(build_default_model(len(tok), seed=i), tok, name=f"agent_{i}") for i in range(2)
    ]
    for i, a in enumerate(agents):
        a.seed(100 + i)
    return agents


def test_evaluation_repeats_and_leaves_the_training_streams_alone(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    agents = _agents(tiny_tokenizer)
    env = CallbackEnvironment(
        [lambda ex: ex["text"], lambda ex: ex["text"] + "\n#"], _length_reward
    )
    before = [a.generator.get_state() for a in agents]  # type: ignore[union-attr]
    global_before = torch.get_rng_state()
    sampled = eval_sampling(3, 8, greedy=False)
    rows = [evaluate(agents, env, DATA[:3], sampled, batch_size=2, seed=s)[0] for s in (0, 0, 1)]
    for a, state in zip(agents, before):
        assert torch.equal(a.generator.get_state(), state)  # type: ignore[union-attr]
    assert torch.equal(torch.get_rng_state(), global_before)
    assert rows[0]["reward_mean"] == rows[1]["reward_mean"] != rows[2]["reward_mean"]
    assert rows[0]["num_problems"] == 3.0 and "pass@1" not in rows[0]
    greedy = [
        evaluate(agents, env, DATA[:3], eval_sampling(1, 8, greedy=True), seed=s)[1] for s in (0, 1)
    ]
    assert greedy[0][0].turns[0].agents[1].texts() == greedy[1][0].turns[0].agents[1].texts()


def _length_trainer(tokenizer, out: Path, *, with_eval: bool, **overrides: object):  # type: ignore[no-untyped-def]
    """Two tiny agents on DATA with the length reward, output in ``out`` (evaluation set
    DATA[3:] when ``with_eval``); ``overrides`` go to the TrainConfig."""
    cfg = TrainConfig(
        **{
            "num_steps": 3,
            "batch_size": 2,
            "num_generations": 3,
            "max_new_tokens": 8,
            "learning_rate": 1e-2,
            "output_dir": str(out),
            "progress": False,
            "parallel_agents": False,
            **overrides,
        }
    )
    return MultiAgentTrainer(
        _agents(tokenizer),
        cfg,
        dataset=DATA,
        reward_func=_length_reward,
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n#"],
        eval_dataset=DATA[3:] if with_eval else None,
    )


def test_evaluating_during_training_does_not_change_the_training_rows(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    def run(name: str, **overrides: object) -> list[dict[str, float]]:
        out = tmp_path / name
        return _length_trainer(tiny_tokenizer, out, with_eval=bool(overrides), **overrides).train()

    plain = run("plain")
    with_eval = run("eval", eval_every=2, eval_greedy=False, eval_num_samples=2, eval_limit=2)
    for a, b in zip(plain, with_eval, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["loss/agent_0"] == b["loss/agent_0"]
    rows = [json.loads(x) for x in (tmp_path / "eval" / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2] and rows[0]["num_problems"] == 2.0
    assert not (tmp_path / "plain" / "eval.jsonl").exists()


def test_eval_on_start_adds_a_step_0_row_and_leaves_training_alone(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    def untimed(row: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in row.items() if not k.startswith("time/")}

    def run(name: str, on_start: bool) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
        trainer = _length_trainer(
            tiny_tokenizer,
            tmp_path / name,
            with_eval=True,
            num_steps=2,
            eval_every=2,
            eval_on_start=on_start,
            eval_limit=2,
        )
        before = trainer.evaluate() if on_start else None
        history = trainer.train()
        path = tmp_path / name / "eval.jsonl"
        rows = [untimed(json.loads(x)) for x in path.read_text().splitlines()]
        if before is not None:  # the step-0 row is the untrained agents' evaluation
            assert rows[0] == untimed(before)
        return history, rows

    plain, plain_evals = run("plain", on_start=False)
    started, start_evals = run("start", on_start=True)
    assert [r["step"] for r in plain_evals] == [2] and [r["step"] for r in start_evals] == [0, 2]
    assert start_evals[1] == plain_evals[0]  # same weights, same evaluation streams
    for a, b in zip(plain, started, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["loss/agent_0"] == b["loss/agent_0"]


def test_eval_on_start_without_evaluation_is_refused() -> None:
    with pytest.raises(ValidationError, match="eval_on_start=true but eval_every=0"):
        TrainConfig(eval_on_start=True)
    assert TrainConfig(eval_every=3, eval_on_start=True).eval_on_start


def test_evaluation_needs_an_evaluation_set(tiny_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(num_steps=1, eval_every=1, output_dir=str(tmp_path), progress=False)
    with pytest.raises(ConfigError, match="eval_every=1 but no evaluation set"):
        MultiAgentTrainer(
            _agents(tiny_tokenizer),
            cfg,
            dataset=DATA,
            reward_func=_length_reward,
            formatters=[lambda ex: ex["text"], lambda ex: ex["text"]],
        )
