"""comlrl.trainers: CoMLRL 1.4.3's private trainer hooks (thin adapters over ours)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from comlrl.trainers import (
    IACConfig,
    IACTrainer,
    MADPOIterTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
)
from comlrl.trainers.preference._iter_hooks143 import output_path
from hypothesis import given
from hypothesis import strategies as st


def test_output_path_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sections = {"config_sections": {"output": {"base_dir": "s"}}, "dir": "w"}
    assert output_path("d", "given", {"output_dir": "o"}) == str(tmp_path / "given")
    assert output_path("d", None, {"output_dir": "o", **sections}) == str(tmp_path / "o" / "d")
    assert output_path("d", None, sections) == str(tmp_path / "s" / "d")
    assert output_path("d", None, {"output_dir": "", "dir": "w"}) == str(tmp_path / "w" / "d")
    assert output_path("d", None, None) == str(tmp_path / "d")


@given(st.floats(-1000, 1000, allow_nan=False))
def test_axis_tick_label_reads_back_within_its_precision(value: float) -> None:
    label = MADPOIterTrainer._format_axis_tick(value)
    digits = len(label.split(".")[1]) if "." in label else 0
    assert abs(float(label) - value) <= 0.5 * 10**-digits + 1e-9


def test_reward_histogram_clips_into_the_declared_range() -> None:
    trainer = object.__new__(MADPOIterTrainer)
    trainer.reward_func = lambda *_: []
    trainer._reward_distribution_range = (0.0, 1.0)
    edges = trainer._reward_distribution_bin_edges()
    counts, _ = trainer._reward_distribution_counts([-5.0, 0.0, 0.99, 7.0], edges)
    assert (len(edges), int(counts[0]), int(counts[-1]), int(counts.sum())) == (17, 2, 2, 4)
    series = trainer._reward_distribution_json_series([0.5, math.inf], edges)
    assert series["sample_count"] == 1 and series["raw_rewards"] == [0.5]


def test_reference_kl_shaping_hooks_follow_1_4_3() -> None:
    trainer = object.__new__(MAGRPOTrainer)
    trainer.args = SimpleNamespace(reference_kl_enabled=True, reference_kl_coef=0.5)
    shaped = trainer._apply_reference_kl_to_returns(
        torch.tensor([1.0, 2.0, 3.0]), {"reference_kls": [0.2, 0.4]}
    )
    torch.testing.assert_close(shaped, torch.tensor([0.9, 1.8, 3.0]), rtol=0, atol=1e-6)
    assert trainer._kl_shaped_reward(1.0, {"reference_kls": [0.4]}, 1) == (
        1.0,
        {"reference_kl": 0.0, "reference_kl_penalty": 0.0, "environment_reward": 1.0},
    )
    trainer.args.reference_kl_enabled = False
    assert trainer._reference_kl_values(0, None, torch.zeros(1, 2), None, 1, [1]) == []


def test_iac_value_heads_with_reference_kl_train_and_measure_the_kl(stories260k: str) -> None:
    """IAC with value heads on the agents (1.4.3's ``use_separate_critic=False``) and
    ``reference_kl_enabled`` builds, gives each agent a frozen reference copy, and its
    second step measures a positive KL (the first step moved the policy away)."""
    torch.manual_seed(0)
    trainer = IACTrainer(
        agent_model=stories260k,
        reward_func=lambda c1, c2: [float(len(b)) / 10 for b in c2],
        train_dataset=[{"prompt": "Once upon a time"}, {"prompt": "The cat sat"}],
        args=IACConfig(
            num_turns=1, num_train_epochs=2, max_new_tokens=8, rollout_buffer_size=2,
            agent_learning_rate=1e-2, use_separate_critic=False, reference_kl_enabled=True,
            reference_kl_coef=0.5,
        ),
    )  # fmt: skip
    refs: list[Any] = trainer.reference_models
    assert len(refs) == 2 and refs[0] is not trainer.agents[0]
    assert not any(p.requires_grad for p in refs[0].parameters())
    history = trainer.train()
    kl = [v for k, v in history[-1].items() if "kl" in k and k.endswith("agent_0")]
    assert kl and kl[0] > 0, history[-1]


def test_iac_separate_critics_have_optimizers_without_train_dataset(stories260k: str) -> None:
    """1.4.3 builds one optimizer per separate critic at construction; a trainer without
    ``train_dataset`` (whose recipe run is never built) has them too, over each critic's
    trunk and value head."""
    trainer = IACTrainer(
        agent_model=stories260k,
        critic_model=stories260k,
        reward_func=lambda c1, c2: [0.0 for _ in c1],
        args=IACConfig(num_turns=1, use_separate_critic=True, critic_learning_rate=3e-4),
    )
    optimizers = trainer.critic_optimizers
    assert len(optimizers) == 2 and optimizers[0] is not optimizers[1]
    trunk = {id(p) for p in trainer.critics[0].parameters()}
    params = [p for g in optimizers[0].param_groups for p in g["params"]]
    assert trunk < {id(p) for p in params}  # the trunk and the head's parameters
    assert {g["lr"] for g in optimizers[0].param_groups} == {3e-4}
    shared = IACTrainer(
        agent_model=stories260k,
        reward_func=lambda c1, c2: [0.0 for _ in c1],
        args=IACConfig(num_turns=1, use_separate_critic=False),
    )
    assert shared.critic_optimizers == []


@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_sequence_stats_sum_the_response_token_log_probs(
    prompt: int, length: int, seed: int
) -> None:
    """1.4.3's ``_compute_sequence_stats`` against a loop over the response tokens."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, prompt + length, 5, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 5, (2, prompt + length), generator=g)
    got = object.__new__(IACTrainer)._compute_sequence_stats(ids, logits, prompt, length)
    want = torch.zeros(2, dtype=torch.float64)
    for b in range(2):
        for t in range(prompt, prompt + length):
            want[b] += torch.log_softmax(logits[b, t - 1], -1)[ids[b, t]]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_expand_rewards_follows_1_4_3_precedence() -> None:
    trainer = object.__new__(IACTrainer)
    trainer.args = SimpleNamespace(num_agents=2)
    assert trainer._expand_rewards([1.0, 2.0], 2) == [
        [1.0, 2.0],
        [1.0, 2.0],
    ]  # per generation first
    assert trainer._expand_rewards([1.0, 2.0], 3) == [[1.0] * 3, [2.0] * 3]
    with pytest.raises(ValueError, match="got 4"):
        trainer._expand_rewards([1.0] * 4, 3)


def test_agents_and_optimizers_can_be_assigned_only_before_the_run_exists() -> None:
    trainer = object.__new__(MAGRPOTrainer)
    trainer.agents = ["a", "b"]
    trainer.optimizers = ["o", "p"]
    assert trainer.agents == ["a", "b"] and trainer.optimizers == ["o", "p"]
    trainer._run_state = object()  # a built recipe run holds the models
    with pytest.raises(AttributeError, match="agents cannot be replaced"):
        trainer.agents = ["c"]
    with pytest.raises(AttributeError, match="optimizers cannot be replaced"):
        trainer.optimizers = ["q"]


class _Embedder(torch.nn.Module):
    """A backbone whose hidden state of token ``t`` is ``[t]`` (1.4.3's reward-model
    double: no ``last_hidden_state``, only ``hidden_states``)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_size=1)
        self.embedding = torch.nn.Embedding(10, 1)
        with torch.no_grad():
            self.embedding.weight.copy_(torch.arange(10, dtype=torch.float)[:, None])

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(hidden_states=[self.embedding(input_ids)])


def test_marlhf_joint_reward_model_reads_hidden_states_and_names_head_reward_head() -> None:
    from comlrl.trainers.preference.marlhf import JointRewardModel

    model = JointRewardModel(_Embedder())
    assert model.reward_head is model.head
    with torch.no_grad():
        model.reward_head.weight.fill_(2.0)
    ids = torch.tensor([[7, 8, 0], [0, 7, 9]])
    scores = model(ids, torch.tensor([[1, 1, 0], [0, 1, 1]]))
    torch.testing.assert_close(scores, torch.tensor([16.0, 18.0]), rtol=0, atol=1e-6)


def test_centralized_collaboration_splits_roles_for_the_task_reward_only() -> None:
    from types import SimpleNamespace

    from comlrl.trainers.preference import TaggedCentralizedComparatorAdapter
    from comlrl.trainers.preference.collaboration import CentralizedCollaboration

    seen: list[tuple[list[str], list[str], list[str]]] = []

    def reward(left: list[str], right: list[str], *, prompts: list[str]) -> list[float]:
        seen.append((left, right, prompts))
        return [float(len(left[0]) + 10 * len(right[0]))]

    collab = CentralizedCollaboration(
        TaggedCentralizedComparatorAdapter(), [lambda x: "L", lambda x: "R"], reward, 2
    )
    item = {"id": 1}
    assert "Agent 1 original prompt:\nR" in collab.build_prompt(item)
    joint = "<agent_0> ab </agent_0> <agent_1> c </agent_1>"
    # 2 + 10 * 1; an unparsable response gives every role "" (0 here)
    assert collab([joint, "no tags"], batch_items=[item]) == [12.0, 0.0]
    assert seen[0] == (["ab"], ["c"], ["L"])
    with pytest.raises(ValueError, match="batch_items"):
        collab([joint])
    assert collab.split_eval([[[joint]]], [item]) == [[["ab"]], [["c"]]]
    sample = SimpleNamespace(agent_idx=0, completion=joint, metadata={"batch_item": item})
    roles = collab.wrap_metrics_callback(lambda rows: rows)([sample])
    assert [(r.agent_idx, r.completion) for r in roles] == [(0, "ab"), (1, "c")]
    assert sample.completion == joint


def test_preference_configs_check_collaboration_mode_as_143() -> None:
    from comlrl.trainers.preference import MADPOConfig, MADPOIterConfig

    with pytest.raises(ValueError, match="collaboration_mode='joint'"):
        MADPOConfig(collaboration_mode="joint")
    assert MADPOIterConfig(collaboration_mode="Centralized").comparator_generation_mode == (
        "centralized"
    )
    with pytest.raises(ValueError, match="actor index 0"):
        MADPOIterConfig(collaboration_mode="centralized", comparator_centralized_agent_index=1)


def test_wandb_run_config_comes_from_the_trainer_and_magrpo_module_exposes_wandb(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    import comlrl.trainers.reinforce.magrpo as magrpo_module
    from comlrl.trainers._wandb import start_run

    fake = SimpleNamespace(init=lambda **kwargs: kwargs)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    trainer = SimpleNamespace(_wandb_run_config=lambda: {"algorithm": "MAGRPO", "num_roles": 2})
    init = start_run({"project": "p", "config_sections": {"x": 1}}, trainer)
    assert init["project"] == "p"
    assert init["config"] == {"algorithm": "MAGRPO", "num_roles": 2, "x": 1}
    assert magrpo_module.wandb is fake  # 1.4.3's module attribute, imported on use
    with pytest.raises(AttributeError, match="no_such_name"):
        magrpo_module.no_such_name  # noqa: B018


def _sample(agent: int, turn: int, target: float, old: float) -> Any:
    from comlrl.trainers.actor_critic import RolloutSample

    one = torch.ones(1)
    return RolloutSample(
        agent_idx=agent, prompt="p", completion="c", full_input_ids=torch.zeros(3, dtype=torch.long),
        attention_mask=torch.ones(3, dtype=torch.long), prompt_len=1, response_len=2,
        old_logprob=one, old_value=torch.tensor([old]), reward=torch.tensor([target]),
        returns=torch.tensor([target]), advantage=0 * one,
        metadata={"turn_idx": turn, "value_target": torch.tensor([target])},
    )  # fmt: skip


@given(st.lists(st.floats(-5, 5), min_size=2, max_size=8), st.booleans())
def test_prepared_advantages_are_target_minus_old_value_whitened_on_request(
    targets: list[float], whiten: bool
) -> None:
    """1.4.3's ``_prepare_advantages``: ``target - V_old``; with ``advantage_normalization``
    zero mean and unit population std over the samples (std floored at 1e-6)."""
    trainer = object.__new__(IACTrainer)
    trainer.args = SimpleNamespace(advantage_normalization=whiten)
    samples = [_sample(0, 0, t, 0.5) for t in targets]
    trainer._prepare_advantages(samples)
    raw = torch.tensor([t - 0.5 for t in targets])
    got = torch.cat([s.normalized_advantage for s in samples])
    torch.testing.assert_close(torch.cat([s.advantage for s in samples]), raw)
    want = (raw - raw.mean()) / raw.std(unbiased=False).clamp(min=1e-6) if whiten else raw
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_drained_buffers_update_each_agent_once_per_turn_in_index_order() -> None:
    trainer = object.__new__(IACTrainer)
    trainer.args = SimpleNamespace(num_agents=2, logging_steps=1)
    trainer.parallel_training, trainer.env_step = "none", 0
    calls: list[tuple[int, list[int]]] = []

    def update(agent: int, samples: list[Any]) -> dict[str, float]:
        calls.append((agent, [s.metadata["turn_idx"] for s in samples]))
        return {"loss": float(agent)}

    trainer._update = update  # type: ignore[method-assign]
    trainer.rollout_buffers[1] += [_sample(1, 1, 0.0, 0.0), _sample(1, 0, 0.0, 0.0)]
    trainer.rollout_buffers[0] += [_sample(0, 0, 0.0, 0.0)]
    metrics: dict[str, list[float]] = {}
    trainer._drain_ready_agent_buffers([1, 0, 1], metrics)
    assert calls == [(0, [0]), (1, [0]), (1, [1])]
    assert trainer.rollout_buffers == [[], []]
    assert metrics == {"turn_1/loss": [0.0, 1.0], "turn_2/loss": [1.0]}


def test_wandb_mode_disabled_ignores_wandb_config_only_without_wandb(
    stories260k: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``WANDB_MODE=disabled`` an installed wandb gets the config (and does nothing,
    as 1.4.3 relies on); without wandb the config is dropped instead of failing."""
    import comlrl.trainers._base as base

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(base, "wandb_installed", lambda: False)
    trainer = MAGRPOTrainer(
        agent_model=stories260k, num_agents=1, reward_func=lambda c: [0.0],
        wandb_config={"project": "p"}, args=MAGRPOConfig(num_turns=1),
    )  # fmt: skip
    assert trainer.wandb_config is None
