"""Agents that share one model object: one optimizer step on the sum of their losses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.core import SamplingParams

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(4)]


@pytest.mark.parametrize("reduction", ["seq_mean_token_mean", "token_mean"])
def test_terms_give_the_sum_of_each_agents_own_loss_gradient(
    tiny_tokenizer: Any, reduction: str, recording_sgd: Any
) -> None:
    model = build_default_model(len(tiny_tokenizer), seed=0)
    agent = HFAgent(model, tiny_tokenizer)
    agent.seed(0)
    params = SamplingParams(num_generations=2, max_new_tokens=6)
    a0 = [agent.sample([d["text"] for d in DATA[:2]], params).batch]  # agent 0: 1 turn, 4 rows
    a1 = [agent.sample([d["text"] for d in DATA[2:3]], params).batch]  # agent 1: 2 rows
    adv0, adv1 = [torch.tensor([1.0, -1.0, 0.5, -0.5])], [torch.tensor([2.0, -2.0])]
    settings = UpdateSettings(max_grad_norm=None, max_completion_length=6, loss_reduction=reduction)

    def grads(batches: list[Any], advs: list[torch.Tensor], terms: list[int] | None) -> list[Any]:
        opt = recording_sgd(model.parameters())
        update_policy(model, opt, batches, advs, settings, terms=terms)
        return opt.grads(model.parameters())  # type: ignore[no-any-return]

    want = [g0 + g1 for g0, g1 in zip(grads(a0, adv0, None), grads(a1, adv1, None), strict=True)]
    got = grads(a0 + a1, adv0 + adv1, [0, 1])
    assert max(float(g.abs().max()) for g in want) > 1e-4
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)
    # one term over both agents' rows is their mean (row-weighted), not the sum
    mean = grads(a0 + a1, adv0 + adv1, None)
    assert not all(torch.allclose(m, w, atol=1e-6) for m, w in zip(mean, want, strict=True))
    with pytest.raises(ValueError, match="terms has 1 labels for 2 batches"):
        update_policy(
            model,
            torch.optim.SGD(model.parameters(), lr=0.0),
            a0 + a1,
            adv0 + adv1,
            settings,
            terms=[0],
        )


def test_agents_on_one_model_object_take_one_optimizer_step(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    model = build_default_model(len(tiny_tokenizer), seed=0)
    agents = [HFAgent(model, tiny_tokenizer, name=f"agent_{i}") for i in range(2)]
    cfg = TrainConfig(
        num_steps=1,
        batch_size=2,
        num_generations=2,
        max_new_tokens=4,
        optimizer="adamw",
        output_dir=str(tmp_path),
        progress=False,
    )
    trainer = MultiAgentTrainer(
        agents,
        cfg,
        dataset=DATA,
        reward_func=lambda c1, c2: [float(len(a) - len(b)) for a, b in zip(c1, c2, strict=True)],
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# second"],
    )
    steps: list[int] = []
    for i, opt in enumerate(trainer.optimizers):
        original = opt.step

        def counted(*args: Any, _i: int = i, _step: Any = original, **kwargs: Any) -> Any:
            steps.append(_i)
            return _step(*args, **kwargs)

        opt.step = counted  # type: ignore[method-assign]
    row = trainer.step().row
    assert steps == [0]  # one step, on the first sharer's optimizer (one set of Adam moments)
    assert trainer.optimizers[1].state == {}
    assert all(v["step"] == 1 for v in trainer.optimizers[0].state.values())
    assert row["loss/agent_0"] == row["loss/agent_1"]


def test_maac_actors_on_one_model_object_take_one_optimizer_step(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    from comlrl.algos.models.value import Critic
    from comlrl.algos.recipes.actor_critic.recipe import ActorCriticConfig, MAACTrainer

    cfg = ActorCriticConfig(
        num_steps=1,
        batch_size=2,
        num_generations=1,
        num_turns=1,
        max_new_tokens=4,
        critic_mode="separate",
        output_dir=str(tmp_path),
        progress=False,
        log_samples=0,
    )
    model = build_default_model(len(tiny_tokenizer), seed=0)
    agents = [HFAgent(model, tiny_tokenizer, name=f"agent_{i}") for i in range(2)]
    critic = Critic(build_default_model(len(tiny_tokenizer), seed=9), tiny_tokenizer, kind="v")
    trainer = MAACTrainer(
        agents,
        cfg,
        critics=[critic],
        dataset=DATA,
        reward_func=lambda c1, c2: [float(len(a) - len(b)) for a, b in zip(c1, c2, strict=True)],
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"] + "\n# second"],
    )
    base = trainer
    steps: list[int] = []
    for i, opt in enumerate(base.optimizers):
        original = opt.step

        def counted(*args: Any, _i: int = i, _step: Any = original, **kwargs: Any) -> Any:
            steps.append(_i)
            return _step(*args, **kwargs)

        opt.step = counted  # type: ignore[method-assign]
    row = trainer.step().row
    assert steps == [0]
    assert row["loss/agent_0"] == row["loss/agent_1"]
