"""MultiAgentTrainer: the update is the full-batch gradient, failures lose nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.models.logprobs import completion_logprobs
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import ConfigError, TrainConfig
from comlrl.algos.training.run.saving import save_agent_checkpoint
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.core import RewardBatch, RewardFunctionError, SamplingParams, Task
from comlrl.estimators.losses import policy_loss

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(6)]


def _length_reward(c1: list[str], c2: list[str]) -> list[float]:
    return [-abs(len(a) - len(b)) / 50.0 for a, b in zip(c1, c2)]


def _trainer(tok, tmp_path: Path, **overrides) -> MultiAgentTrainer:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(
        num_steps=2,
        batch_size=2,
        num_generations=3,
        max_new_tokens=8,
        learning_rate=1e-2,
        output_dir=str(tmp_path / "run"),
        progress=False,
        **overrides,
    )
    agents = [
        HFAgent(build_default_model(len(tok), seed=i), tok, name=f"agent_{i}") for i in range(2)
    ]
    return MultiAgentTrainer(
        agents,
        cfg,
        dataset=DATA,
        reward_func=_length_reward,
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# test"],
    )


@pytest.mark.parametrize("reduction", ["seq_mean_token_mean", "token_mean", "seq_sum"])
def test_micro_batches_over_several_turns_give_the_all_turns_gradient(
    tiny_tokenizer, reduction: str, recording_sgd
) -> None:  # type: ignore[no-untyped-def]
    """Two turns of different prompt lengths, micro-batched or not: the same accumulated gradient
    as one loss over all completions (tolerance: float32 sums in a different order)."""
    model = build_default_model(len(tiny_tokenizer), seed=0)
    agent = HFAgent(model, tiny_tokenizer)
    params = SamplingParams(num_generations=3, max_new_tokens=8)
    torch.manual_seed(0)
    batches = [
        agent.sample([d["text"] for d in DATA[:2]], params).batch,
        agent.sample([d["text"] + "\n# more" for d in DATA[2:5]], params).batch,
    ]
    advs = [torch.linspace(-1, 1, 6), torch.linspace(1, -0.5, 9)]
    grads = []
    for micro in (None, 3):
        opt = recording_sgd(model.parameters())  # keep the weights: compare gradients
        settings = UpdateSettings(
            loss_reduction=reduction,
            micro_batch_size=micro,
            max_grad_norm=None,
            max_completion_length=8,
        )
        update_policy(model, opt, batches, advs, settings)
        grads.append(opt.grads(model.parameters()))
    # the same loss written out over the concatenation of both turns
    model.zero_grad()
    logps = [completion_logprobs(model, b, slice(0, b.num_prompts)) for b in batches]
    length = max(lp.shape[1] for lp in logps)
    pad = lambda x, v: torch.nn.functional.pad(x, (0, length - x.shape[1]), value=v)  # noqa: E731
    loss, _ = policy_loss(
        torch.cat([pad(lp, 0.0) for lp in logps]),
        torch.cat(advs),
        torch.cat([pad(b.completion_mask, False) for b in batches]),
        reduction=reduction,
        max_completion_length=8,
    )
    loss.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    assert max(float(g.abs().max()) for g in expected) > 1e-4, "the update produced no gradient"
    for full, micro, want in zip(grads[0], grads[1], expected):
        torch.testing.assert_close(full, want, atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(micro, want, atol=1e-6, rtol=1e-4)


def test_training_writes_metrics_samples_and_loadable_checkpoints(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    trainer = _trainer(tiny_tokenizer, tmp_path, save_every=1)
    history = trainer.train()
    run = tmp_path / "run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] == [h["step"] for h in history]
    assert all(math.isfinite(r["loss/agent_1"]) and r["prompts_per_s"] > 0 for r in rows)
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert {len(s["completions"]) for s in samples} == {2}
    from transformers import AutoModelForCausalLM

    for tag in ("final", "checkpoints/step-000001", "checkpoints/step-000002"):
        model = AutoModelForCausalLM.from_pretrained(run / tag / "agent_1")
        assert model.config.vocab_size == len(tiny_tokenizer)
    final = AutoModelForCausalLM.from_pretrained(run / "final" / "agent_0")
    for p, q in zip(final.parameters(), trainer.agents[0].model.parameters()):
        torch.testing.assert_close(p, q, atol=0, rtol=0)


def test_parameters_change_only_through_the_update(tiny_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    trainer = _trainer(tiny_tokenizer, tmp_path)
    before = [p.detach().clone() for p in trainer.agents[1].model.parameters()]
    trainer.step()
    changed = any(
        not torch.equal(b, p) for b, p in zip(before, trainer.agents[1].model.parameters())
    )
    assert changed


def test_a_nan_reward_stops_the_step_before_any_update_and_names_the_sample(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(
        num_steps=1,
        batch_size=2,
        num_generations=2,
        max_new_tokens=4,
        output_dir=str(tmp_path),
        progress=False,
    )
    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer) for i in range(2)
    ]
    trainer = MultiAgentTrainer(
        agents,
        cfg,
        dataset=DATA,
        formatters=[lambda ex: ex["text"]] * 2,
        reward_func=lambda c1, c2, example=None: (
            [float("nan") if example["id"] >= 0 else 0.0] * len(c1)
        ),
    )
    before = [p.detach().clone() for p in trainer.agents[0].model.parameters()]
    with pytest.raises(RewardFunctionError, match="not finite") as info:
        trainer.step()
    assert info.value.example is not None and "text" in info.value.example
    assert all(torch.equal(b, p) for b, p in zip(before, trainer.agents[0].model.parameters()))


def test_checkpoint_save_is_atomic(
    tiny_tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    agent = HFAgent(build_default_model(len(tiny_tokenizer), seed=0), tiny_tokenizer)
    path = save_agent_checkpoint(agent, tmp_path / "ckpt")
    original = sorted(p.name for p in path.iterdir())

    def broken_save(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    monkeypatch.setattr(agent.model, "save_pretrained", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_agent_checkpoint(agent, path)
    assert sorted(p.name for p in path.iterdir()) == original


def test_agents_task_and_config_must_agree(tiny_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    class ThreeAgents(Task):
        name, num_agents = "three", 3

        def load(self, split="train"):  # type: ignore[no-untyped-def]
            return DATA

        def prompts(self, example, history=()):  # type: ignore[no-untyped-def]
            return ["a", "b", "c"]

        def reward(self, completions, examples):  # type: ignore[no-untyped-def]
            return RewardBatch([0.0] * len(examples))

    agents = [HFAgent(build_default_model(len(tiny_tokenizer)), tiny_tokenizer) for _ in range(2)]
    with pytest.raises(ConfigError, match="for 3 agents but 2 agents"):
        MultiAgentTrainer(agents, TrainConfig(output_dir=str(tmp_path)), task=ThreeAgents())
    with pytest.raises(ConfigError, match="num_agents=3"):
        MultiAgentTrainer(
            agents, TrainConfig(num_agents=3, output_dir=str(tmp_path)), task=ThreeAgents()
        )
    three = agents + [HFAgent(build_default_model(len(tiny_tokenizer)), tiny_tokenizer)]
    with pytest.raises(ConfigError, match="at most 1 turn"):
        MultiAgentTrainer(
            three,
            TrainConfig(num_agents=3, num_turns=2, output_dir=str(tmp_path)),
            task=ThreeAgents(),
        )
    with pytest.raises(ConfigError, match="dataset is empty"):
        MultiAgentTrainer(
            three,
            TrainConfig(num_agents=3, output_dir=str(tmp_path)),
            task=ThreeAgents(),
            dataset=[],
        )


def test_runs_are_reproducible_with_concurrent_per_agent_sampling(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = []
        for run in range(2):
            trainer = _trainer(tiny_tokenizer, tmp_path / str(run), seed=7)
            assert trainer.sample_pool.parallel
            ro = trainer.step().rollout
            assert ro is not None
            results.append(
                (
                    [c.token_ids.tolist() for g in ro.turns[0].agents[1].completions for c in g],
                    [p.detach().clone() for p in trainer.agents[1].model.parameters()],
                )
            )
        assert results[0][0] == results[1][0]
        for p, q in zip(results[0][1], results[1][1]):
            assert torch.equal(p, q)
    finally:
        torch.set_num_threads(before)


def test_concurrent_agent_forwards_and_updates_equal_sequential_ones(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Concurrent agents draw the same samples and take the same update as sequential ones.

    What is guaranteed: identical samples (per-agent random streams) and gradients equal up to
    float32 reduction order (each agent's matmuls run on 1 intra-op thread when concurrent,
    on 2 when sequential). So the comparison uses SGD, whose step is linear in the gradient:
    |dtheta| <= lr * |dgrad|. Gradients here are O(1) and round-off differences O(1e-6) at
    most, so atol = 1e-6 >= lr * 1e-4 leaves two orders of margin (measured on the build
    machine: 0.0), while a wrong update (another agent's advantages, a skipped agent) moves
    parameters by ~lr * |grad| ~ 1e-3. Adam would divide each gradient element by its own magnitude, turning round-off
    in near-zero elements into steps of size lr (the cause of an earlier flaky version of
    this test: 9 of 131072 elements off by 1.06e-5 after two Adam steps).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        params, samples = [], []
        for parallel in (True, False):
            trainer = _trainer(
                tiny_tokenizer, tmp_path / str(parallel), seed=5, parallel_agents=parallel
            )
            assert (
                trainer.update_pool.parallel is parallel
                and trainer.sample_pool.parallel is parallel
            )
            for i, agent in enumerate(trainer.agents):
                trainer.optimizers[i] = torch.optim.SGD(agent.model.parameters(), lr=1e-2)
            ro = trainer.step().rollout
            assert ro is not None
            samples.append(
                [c.token_ids.tolist() for s in ro.turns[0].agents for g in s.completions for c in g]
            )
            params.append(
                [p.detach().clone() for a in trainer.agents for p in a.model.parameters()]
            )
        assert samples[0] == samples[1]  # per-agent random streams: same samples either way
        moved = [
            p
            for a in _trainer(tiny_tokenizer, tmp_path / "init", seed=5).agents
            for p in a.model.parameters()
        ]
        assert any(not torch.equal(p, q) for p, q in zip(params[0], moved))
        for p, q in zip(*params):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
        assert torch.get_num_threads() == 2  # the caller's thread setting is untouched
    finally:
        torch.set_num_threads(before)


def test_agents_sharing_one_model_are_never_updated_concurrently(
    tiny_tokenizer, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    model = build_default_model(len(tiny_tokenizer), seed=0)
    agents = [HFAgent(model, tiny_tokenizer, name=f"agent_{i}") for i in range(2)]
    cfg = TrainConfig(
        num_steps=1,
        batch_size=2,
        num_generations=2,
        max_new_tokens=4,
        output_dir=str(tmp_path),
        progress=False,
    )
    trainer = MultiAgentTrainer(
        agents,
        cfg,
        dataset=DATA,
        reward_func=_length_reward,
        formatters=[lambda ex: ex["text"]] * 2,
    )
    assert not trainer.update_pool.parallel
