"""The options that run CoMLRL 1.4.3's algorithm in comlrl.algos: the reference KL in the
reward (``kl_mode="reward"``), the policy gradient of log-probs at another temperature
than the sampling one (``update_temperature``), an early end's reward counted once
(``hold_terminal_reward=False``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.actor_critic.config import ActorCriticConfig
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.update.logprobs import trainer_logprobs
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.estimators.kl_reward import sequence_kl

DATA = [{"text": f"def f{i}(x):\n    return x + {i}"} for i in range(4)]


def _equal(c1: list[str], c2: list[str]) -> list[float]:
    return [1.0] * len(c1)


def _trainer(tok: Any, out: Path, reward: Any = _equal, **overrides: Any) -> MultiAgentTrainer:
    torch.manual_seed(0)
    agents = [HFAgent(build_default_model(len(tok), seed=i), tok, name=f"a{i}") for i in range(2)]
    config = TrainConfig(
        **{
            "num_steps": 1, "batch_size": 2, "num_generations": 3, "max_new_tokens": 4,
            "learning_rate": 1e-2, "output_dir": str(out), "progress": False,
            "parallel_agents": False, "seed": 0, **overrides,
        }
    )  # fmt: skip
    return MultiAgentTrainer(
        agents, config, dataset=DATA, reward_func=reward, formatters=[lambda ex: ex["text"]] * 2,
        transition=lambda **kw: ["again"] * kw["num_agents"],
    )  # fmt: skip


def test_kl_in_the_reward_moves_agents_whose_task_rewards_are_equal(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Equal task rewards and a policy away from its reference: ``kl_coef * sum_t k`` per
    completion, subtracted from the return, gives each completion its own advantage (a KL
    loss term would leave them all 0); the update itself carries no KL term."""
    trainer = _trainer(tiny_tokenizer, tmp_path, kl_coef=0.5, kl_mode="reward")
    with torch.no_grad():
        for agent in trainer.agents:
            for p in agent.model.parameters():
                p.add_(0.3 * torch.randn_like(p))
    run = trainer
    assert run.update_settings.kl_coef == 0.0  # not in the loss
    seen: list[Any] = []
    real = group_baseline.group_advantages

    def spy(ro: Any, **kw: Any) -> Any:
        want = [  # the penalty from the pure function, before the update moves anything
            [
                0.5 * sequence_kl(
                    trainer_logprobs(run.agents[a].model, s.batch, run.update_settings),
                    trainer_logprobs(run.ref_models[a], s.batch, run.update_settings),
                    s.batch.completion_mask,
                )
                for a, s in enumerate(turn.agents)
            ]
            for turn in ro.turns
        ]  # fmt: skip
        adv = real(ro, **kw)
        seen.append((kw["penalties"], want, adv))
        return adv

    monkeypatch.setattr(group_baseline, "group_advantages", spy)
    row = trainer.train_step()
    penalties, want, adv = seen[0]
    for got_a, want_a in zip(penalties[0], want[0], strict=True):
        torch.testing.assert_close(got_a, want_a)  # same numbers, same code path: exact
        assert float(got_a.max() - got_a.min()) > 1e-3
    for a in range(2):
        assert float(adv[0][a].abs().max()) > 0.5  # group-scaled: O(1) where a loss term gives 0
        assert row[f"reward_kl/agent_{a}"] > 0.0
        assert row[f"reward_kl_penalty/agent_{a}"] == pytest.approx(
            0.5 * row[f"reward_kl/agent_{a}"]
        )
        assert f"kl/agent_{a}" not in row  # no KL term in the loss


def test_kl_mode_reward_is_checked_with_the_config() -> None:
    # k1 is a valid reward penalty (Ziegler et al.'s log ratio) but not a loss term
    assert TrainConfig(kl_coef=0.1, kl_mode="reward", kl_estimator="k1").kl_mode == "reward"
    with pytest.raises(ValueError, match="k1"):
        TrainConfig(kl_coef=0.1, kl_estimator="k1")
    with pytest.raises(ValueError, match="kl_mode='reward' is a setting of the group-baseline"):
        ActorCriticConfig(kl_coef=0.1, kl_mode="reward")


def test_a_retempered_update_differentiates_its_own_temperature_and_ratios_its_own_logprobs(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """``update_temperature=1`` with sampling at 0.5: the loss's log-probs are the
    untempered ones, the PPO ratio of the first pass is exactly 1 (taken against the
    trainer's own log-probs, not the tempered behaviour ones) and the sampler mismatch,
    which compares one temperature with another, is not reported."""
    trainer = _trainer(tiny_tokenizer, tmp_path, temperature=0.5, update_temperature=1.0)
    run = trainer
    assert (run.update_settings.temperature, run.update_settings.sampling_temperature) == (1.0, 0.5)
    assert run.update_settings.tis_level is None
    ro = trainer.step().rollout  # one step to get a rollout
    batch = ro.turns[0].agents[0].batch
    model = copy.deepcopy(run.agents[0].model)
    settings = UpdateSettings(
        temperature=1.0, sampling_temperature=0.5, clip_ratio=0.2, max_grad_norm=None
    )
    adv = torch.linspace(-1.0, 1.0, batch.completion_mask.shape[0])
    stats = update_policy(
        model, torch.optim.SGD(model.parameters(), lr=0.0), [batch], [adv], settings
    )
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert "mismatch_kl" not in stats
    untempered = trainer_logprobs(model, batch, settings)
    tempered = trainer_logprobs(model, batch, UpdateSettings(temperature=0.5))
    mask = batch.completion_mask
    torch.testing.assert_close(tempered[mask], batch.behaviour_logprobs[mask], atol=1e-5, rtol=0)
    assert float((untempered[mask] - tempered[mask]).abs().max()) > 1e-2
    with pytest.raises(ValueError, match="tis_level='token' with temperature=1.0"):
        UpdateSettings(temperature=1.0, sampling_temperature=0.5, tis_level="token")
    with pytest.raises(ValueError, match="tis='token' with update_temperature=1.0"):
        TrainConfig(temperature=0.5, update_temperature=1.0, tis="token")


@pytest.mark.parametrize(("hold", "factor"), [(True, 3.0), (False, 1.0)])
def test_an_early_end_is_held_or_counted_once(
    tiny_tokenizer: Any, tmp_path: Path, hold: bool, factor: float
) -> None:
    """Every reward (1.0) ends its episode at turn 0 of 3: held, the return is 3 (gamma 1);
    counted once (CoMLRL 1.4.3), it is the reward."""
    trainer = _trainer(
        tiny_tokenizer, tmp_path, num_turns=3, early_termination_threshold=0.5,
        hold_terminal_reward=hold,
    )  # fmt: skip
    ro = trainer.step().rollout
    assert len(ro.turns) == 1
    torch.testing.assert_close(ro.turns[0].returns, factor * ro.turns[0].rewards)
