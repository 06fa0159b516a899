"""Issue 20's findings about comlrl.trainers against CoMLRL 1.4.3, one test each (each
fails on the code before its fix; docs/compat.md says what changed and why)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from comlrl.algos.functional.advantages import compute_advantages
from comlrl.algos.recipes.actor_critic.recipe import agent_rewards, critic_advantages
from comlrl.trainers import (
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MAREINFORCEConfig,
)
from comlrl.trainers._callbacks import CompatReward
from comlrl.trainers.reinforce import group_baseline_config


# --- finding 1: MAREINFORCE's default normalisation ---------------------------------------
@pytest.mark.parametrize("reward", [1.0, -0.5, 3.0])
def test_mareinforce_defaults_keep_an_all_equal_group_at_its_return(reward: float) -> None:
    """MAREINFORCEConfig() has advantage_normalization=True; a group whose G returns are
    equal must not be divided by its zero std (it gave r / 1e-6 = 1e6 per sample)."""
    fields = group_baseline_config(
        MAREINFORCEConfig(), num_agents=2, num_examples=4, has_eval=False
    )
    returns = torch.full((4,), reward)
    adv = compute_advantages(
        returns, estimator=fields["estimator"], group_ids=torch.zeros(4, dtype=torch.long),
        scale=fields["advantage_scale"],
    )  # fmt: skip
    torch.testing.assert_close(adv, returns, rtol=0, atol=0)


def test_estimators_with_a_baseline_keep_the_group_scaling() -> None:
    for mode in ("mean", "rloo", "max"):
        args = MAREINFORCEConfig(advantage_mode=mode)
        assert group_baseline_config(args, 2, 4, False)["advantage_scale"] == "group"
    plain = MAREINFORCEConfig(advantage_normalization=False)
    assert group_baseline_config(plain, 2, 4, False)["advantage_scale"] == "none"


# --- finding 5: IAC / MAAC per-agent rewards ----------------------------------------------
def test_per_agent_reward_values_are_kept_for_each_agent() -> None:
    reward = CompatReward(lambda c1, c2: [1.0, -1.0], 2, lambda ex: ex["prompt"], per_agent=True)
    batch = reward([["a", "b"], ["c", "d"]], [{"prompt": "p"}, {"prompt": "q"}])
    assert batch.rewards == [0.0, 0.0]  # the joint reward is their mean
    assert [info["agent_rewards"] for info in batch.infos] == [[1.0, -1.0], [1.0, -1.0]]
    joint_only = CompatReward(lambda c1, c2: [1.0, -1.0], 2, lambda ex: ex["prompt"])
    assert joint_only([["a"], ["c"]], [{"prompt": "p"}]).infos == [{}]


def _zero_values(ro: Any, num_critics: int) -> list[list[torch.Tensor]]:
    """A state critic's values (one per node) of 0 at every turn."""
    return [[torch.zeros(t.num_nodes) for t in ro.turns] for _ in range(num_critics)]


@pytest.mark.parametrize("method", ["iac", "maac"])
def test_actor_critic_agents_train_on_their_own_rewards(stories260k: str, method: str) -> None:
    """A reward returning [+1, -1] (one per agent) gives agent 0 advantage +1 and agent 1
    advantage -1 (1.4.3's rewards_matrix[agent_idx]); before, both trained on +1."""
    torch.manual_seed(0)
    common = dict(
        num_turns=1, num_train_epochs=1, max_new_tokens=4, rollout_buffer_size=2,
        num_generations=2, agent_devices="cpu", critic_devices="cpu", advantage_normalization=False,
    )  # fmt: skip
    data = [{"prompt": "Once upon a time"}, {"prompt": "The cat sat"}]
    trainer: Any
    if method == "iac":
        trainer = IACTrainer(
            agent_model=stories260k, reward_func=lambda c1, c2: [1.0, -1.0], train_dataset=data,
            args=IACConfig(use_separate_critic=False, **common),
        )  # fmt: skip
    else:
        trainer = MAACTrainer(
            agent_model=stories260k, critic_model=stories260k,
            reward_func=lambda c1, c2: [1.0, -1.0], train_dataset=data, args=MAACConfig(**common),
        )  # fmt: skip
    from comlrl.algos.recipes.actor_critic import recipe as actor_critic

    trainer._run  # noqa: B018 (builds the run)
    result = actor_critic.step(trainer._ac_run)  # one training step, its rollout handed back
    ro = result.rollout
    assert ro is not None
    own = agent_rewards(ro.turns, 1)
    assert own is not None and all(bool((r == -1.0).all()) for r in own)
    critics = 2 if method == "iac" else 1
    adv, targets = critic_advantages(
        ro, _zero_values(ro, critics), method, "v", gamma=1.0, lam=0.0, normalize=False
    )
    # values are 0, so each advantage is the agent's own reward
    torch.testing.assert_close(adv[0][0], torch.ones_like(adv[0][0]))
    torch.testing.assert_close(adv[0][1], -torch.ones_like(adv[0][1]))
    # IAC: critic a regresses on agent a's reward; MAAC: the shared critic on their mean
    expected = [1.0, -1.0] if method == "iac" else [0.0]
    for c, value in enumerate(expected):
        torch.testing.assert_close(targets[c][0], torch.full_like(targets[c][0], value))


# --- finding 7: semantics that differ from 1.4.3 ------------------------------------------
# MADPO's pairs and reference-free loss: test_compat_trainers.py
# (test_madpo_takes_dpo_steps_on_pairs_built_before_training). The two below document
# choices kept (docs/compat.md says why; so does the tempered log-probs'): their code did
# not change, so they pass on the old code too.
def test_q_critic_advantage_keeps_a_signal_once_q_fits() -> None:
    """IAC/MAAC critic_type='q': the baseline is the node's mean Q, not Q(h, a) of the
    scored action (1.4.3), whose advantage target - Q(h, a) is 0 for every action once Q
    fits the targets."""
    from comlrl.algos.functional.gae import q_advantages

    # two nodes, K = 3 joint actions each; Q fits the targets exactly
    targets = torch.tensor([[1.0, 0.0, 2.0], [-1.0, 3.0, 1.0]])
    fitted_q = targets.clone()
    adv = q_advantages(targets, fitted_q)
    # the signal is kept: each action against the node's mean Q (1.4.3's would be all 0)
    torch.testing.assert_close(adv, torch.tensor([[0.0, -1.0, 1.0], [-2.0, 2.0, 0.0]]))
    # the baseline target - advantage is one number per node, the same for every action,
    # also for a Q that does not fit (a Q(h, a) baseline would differ across the node)
    q = torch.tensor([[0.5, -2.0, 4.0], [1.0, 1.0, -5.0]])
    baseline = targets - q_advantages(targets, q)
    torch.testing.assert_close(baseline, q.mean(dim=1, keepdim=True).expand_as(q))


def test_cross_credit_mean_is_the_sum_up_to_a_constant() -> None:
    """joint_mode='cross': a completion's credit is the mean of its G^(A-1) joint returns
    (1.4.3: the sum), so the two differ by the same factor for every completion."""
    from comlrl.algos.functional.joint import credit_completions

    g, a = 3, 2
    joint_index = torch.cartesian_prod(torch.arange(g), torch.arange(g))  # [G^A, A]
    values = torch.arange(float(g**a)).view(1, -1)  # one node, K = G^A joint returns
    mean = credit_completions(values, joint_index, g)  # [A, 1, G]
    total = torch.stack(
        [torch.stack([values[0][joint_index[:, i] == c].sum() for c in range(g)]) for i in range(a)]
    ).view(a, 1, g)
    torch.testing.assert_close(total, mean * g ** (a - 1))
