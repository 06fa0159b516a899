"""comlrl.trainers runs CoMLRL 1.4.3's algorithm, not a neighbour of it: the reference KL in
the reward, the policy gradient of the untempered log-probs, the undiscounted return with
an early end counted once, evaluation before the first step (issue 40, items 4-6 and 23).

The numbers are checked against 1.4.3's own maths written out here as loops (its
``_compute_loss_with_gradients``, ``_apply_reference_kl_to_returns`` and
``reference_kl_for_sequence``: each sequence unpadded, batch of one, ``log_softmax`` of the
raw logits).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.recipes.group_baseline.recipe import GroupBaselineRecipe
from comlrl.trainers import IACConfig, IACTrainer, MAGRPOConfig, MAGRPOTrainer

DATA = [{"prompt": p} for p in ("Once upon a time", "The dog", "Tim had a", "In the park")]

# float32 forwards of a 2-layer model in two layouts (padded batch vs one unpadded row):
# round-off of ~1e-6 per log-prob, summed over <= 4 tokens and divided by a group std
TOL = dict(atol=2e-4, rtol=2e-4)


def equal_rewards(a: list[str], b: list[str]) -> list[float]:
    """Every joint action earns 1: only the KL penalty can tell completions apart."""
    return [1.0] * len(a)


def _trainer(model: Any, tok: Any, reward: Any = equal_rewards, **fields: Any) -> MAGRPOTrainer:
    args = dict(num_turns=1, num_generations=3, max_new_tokens=4, rollout_buffer_size=2)
    args.update(num_train_epochs=1, eval_interval=0, temperature=0.7, top_p=1.0, top_k=None)
    return MAGRPOTrainer(
        agents=[model, copy.deepcopy(model)],
        tokenizer=tok,
        train_dataset=DATA[:2],
        reward_func=reward,
        args=MAGRPOConfig(**{**args, **fields}),
    )


def by_length(a: list[str], b: list[str]) -> list[float]:
    return [float(len(x)) for x in a]


def _untempered_logprobs(model: Any, batch: Any) -> list[list[float]]:
    """1.4.3's log-probs: each row unpadded (prompt + completion tokens), one forward,
    ``log_softmax`` of the raw logits at each completion token."""
    out = []
    s = batch.prompt_length
    for ids, attn, mask in zip(batch.input_ids, batch.attention_mask, batch.completion_mask):
        prompt = ids[:s][attn[:s].bool()]
        completion = ids[s:][mask]
        seq = torch.cat([prompt, completion]).unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=seq).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        out.append(logp.gather(-1, completion.unsqueeze(-1)).squeeze(-1).tolist())
    return out


def _spy_advantages(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    real = group_baseline.group_advantages

    def spy(ro: Any, **kw: Any) -> Any:
        adv = real(ro, **kw)
        seen.append((ro, adv))
        return adv

    monkeypatch.setattr(group_baseline, "group_advantages", spy)
    return seen


def test_reference_kl_is_1_4_3s_reward_penalty_not_a_loss_term(
    tiny_model: Any, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Equal task rewards: 1.4.3's advantages are those of ``1 - coef * sum_t k3`` per
    completion (non-zero once the policy left its reference); a KL loss term gives zeros."""
    coef = 0.5
    trainer = _trainer(
        tiny_model, tiny_tokenizer, reference_kl_enabled=True, reference_kl_coef=coef
    )
    cfg = trainer.config
    assert (cfg.kl_mode, cfg.kl_coef, cfg.kl_estimator) == ("reward", coef, "k3")
    references = [copy.deepcopy(m) for m in trainer.agents]  # the initial weights
    torch.manual_seed(1)
    with torch.no_grad():  # move the policies away from their references
        for model in trainer.agents:
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
    policies = [copy.deepcopy(m) for m in trainer.agents]  # as they sample, before the update
    seen = _spy_advantages(monkeypatch)
    rows = trainer.train()
    ro, adv = seen[0]
    for a in range(2):
        batch = ro.turns[0].agents[a].batch
        pol = _untempered_logprobs(policies[a], batch)
        ref = _untempered_logprobs(references[a], batch)
        kl = [
            sum(math.exp(r - p) - (r - p) - 1.0 for p, r in zip(ps, rs)) for ps, rs in zip(pol, ref)
        ]
        returns = torch.tensor([1.0 - coef * k for k in kl]).reshape(-1, 3)
        centred = returns - returns.mean(dim=1, keepdim=True)  # advantage_mode="mean"
        want = centred / returns.std(dim=1, unbiased=False, keepdim=True).clamp(min=1e-6)
        torch.testing.assert_close(adv[0][a], want.reshape(-1), **TOL)
        assert float(adv[0][a].abs().max()) > 0.5  # not the zeros of a KL loss term
        assert rows[0][f"reward_kl/agent_{a}"] == pytest.approx(sum(kl) / len(kl), rel=1e-3)


def test_the_policy_gradient_differentiates_the_untempered_log_probs(
    tiny_model: Any, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1.4.3's MAGRPO loss is ``-A * sum_t log_softmax(logits)`` at T=1 whatever the
    sampling temperature; the recipe's loss at step 1 is exactly that, averaged over the
    completions and divided by the constant C = max_new_tokens (``seq_sum``)."""
    trainer = _trainer(tiny_model, tiny_tokenizer, by_length, temperature=0.5)
    run = trainer.recipe_trainer
    settings = run.update_settings
    assert (settings.temperature, settings.sampling_temperature) == (1.0, 0.5)
    assert trainer.config.update_temperature == 1.0
    models = [copy.deepcopy(a.model) for a in run.agents]
    seen = _spy_advantages(monkeypatch)
    rows = trainer.train()
    ro, adv = seen[0]
    for a in range(2):
        batch = ro.turns[0].agents[a].batch
        logp = _untempered_logprobs(models[a], batch)
        loss = -sum(float(A) * sum(lp) for A, lp in zip(adv[0][a], logp)) / len(logp) / 4
        assert rows[0][f"loss/agent_{a}"] == pytest.approx(loss, rel=1e-4, abs=1e-6)


def test_magrpo_returns_are_undiscounted_and_an_early_end_counts_once(
    tiny_model: Any, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1.4.3's MAGRPO trains on the undiscounted sum down the tree (its discount is not
    used, as a warning says) and does not hold an early end's reward; its actor-critic
    TD targets do discount."""
    with pytest.warns(UserWarning, match=r"discount=0.5.*do not use discount"):
        trainer = MAGRPOTrainer(
            agents=[tiny_model, copy.deepcopy(tiny_model)],
            tokenizer=tiny_tokenizer,
            train_dataset=DATA[:2],
            reward_func=equal_rewards,
            external_transition=lambda **kw: ["again"] * kw["num_agents"],
            args=MAGRPOConfig(
                num_turns=3, discount=0.5, num_generations=2, max_new_tokens=4,
                rollout_buffer_size=2, num_train_epochs=1, eval_interval=0,
                early_termination_threshold=0.5,  # every reward (1.0) ends the episode
            ),
        )  # fmt: skip
        cfg = trainer.config
    assert (cfg.gamma, cfg.hold_terminal_reward) == (1.0, False)
    seen = _spy_advantages(monkeypatch)
    trainer.train()
    rollout = seen[0][0]
    assert len(rollout.turns) == 1  # ended at turn 0 of 3: 1.4.3's return is the reward
    torch.testing.assert_close(rollout.turns[0].returns, rollout.turns[0].rewards)
    iac = IACTrainer(
        agents=[tiny_model, copy.deepcopy(tiny_model)],
        tokenizer=tiny_tokenizer,
        train_dataset=DATA,
        reward_func=equal_rewards,
        external_transition=lambda **kw: ["again"] * kw["num_agents"],
        args=IACConfig(discount=0.5, use_separate_critic=False, max_new_tokens=4),
    )
    assert (iac.config.gamma, iac.config.hold_terminal_reward) == (0.5, False)
    assert iac.config.update_temperature == 1.0


def test_evaluation_runs_before_the_first_step_as_in_1_4_3(
    tiny_model: Any, tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1.4.3 evaluates before its first batch and every eval_interval examples after."""
    trainer = MAGRPOTrainer(
        agents=[tiny_model, copy.deepcopy(tiny_model)],
        tokenizer=tiny_tokenizer,
        train_dataset=DATA,
        eval_dataset=DATA[:1],
        reward_func=equal_rewards,
        args=MAGRPOConfig(
            num_turns=1, num_generations=2, max_new_tokens=4, rollout_buffer_size=2,
            num_train_epochs=1, eval_interval=2, eval_num_samples=1,
        ),
    )  # fmt: skip
    steps: list[int] = []
    real = GroupBaselineRecipe.evaluate
    monkeypatch.setattr(
        GroupBaselineRecipe,
        "evaluate",
        lambda recipe: steps.append(recipe.global_step) or real(recipe),
    )
    trainer.train()
    # before step 1 and after each step of 2 examples (1.4.3 evaluates before examples
    # 0 and 2; the evaluation after the last step is the recipe's, listed in docs/compat.md)
    assert steps == [0, 1, 2]
