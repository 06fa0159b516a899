"""comlrl.trainers (reinforce, actor-critic): 1.4.3's configs keep their defaults and
translate onto the comlrl.algos recipe configs; the trainers run the comlrl.algos trainers.

Each translation is checked on the recipe config a trainer really builds, so a wrong
mapping (an estimator, a schedule, a learning rate, a critic setting) fails here.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import comlrl.algos as algos
import pytest
from comlrl.trainers import (
    CentralizedMAGRPOConfig,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MARLOOConfig,
    MARLOOTrainer,
    UnsupportedFieldError,
)

# CoMLRL 1.4.3's dataclass fields and defaults (comlrl/trainers/*/*.py of its sdist).
MAGRPO_143 = {
    "num_train_epochs": 20, "agent_learning_rate": 5e-06, "logging_steps": 50,
    "num_agents": 2, "parallel_training": "none", "agent_devices": None,
    "num_generations": 4, "max_new_tokens": 256, "temperature": 0.6, "top_p": 0.6,
    "top_k": 50, "num_turns": 2, "discount": 1.0, "joint_mode": "aligned",
    "early_termination_threshold": -0.2, "external_prompt_passthrough": False,
    "eval_interval": 16, "eval_num_samples": 4, "eval_batch_size": 1,
    "rollout_buffer_size": 2, "train_batch_size": None, "advantage_normalization": True,
    "advantage_mode": "mean", "reference_kl_enabled": False, "reference_kl_coef": 0.1,
    "reference_devices": None,
}  # fmt: skip
IAC_143 = {
    "agent_learning_rate": 5e-06, "critic_learning_rate": 5e-06, "rollout_buffer_size": 8,
    "train_batch_size": None, "value_clip_range": 0.2, "value_loss_coef": 0.6,
    "advantage_normalization": True, "max_new_tokens": 256, "temperature": 0.6,
    "top_p": 0.6, "top_k": None, "num_train_epochs": 40, "use_separate_critic": True,
    "critic_type": "v", "critic_value_head_hidden_dim": None, "value_head_hidden_dim": None,
    "num_agents": 2, "num_turns": 2, "parallel_training": "none", "agent_devices": None,
    "critic_devices": None, "external_prompt_passthrough": False, "discount": 1.0,
    "num_generations": 1, "eval_interval": 16, "eval_num_samples": 4, "eval_batch_size": 1,
    "early_termination_threshold": -0.2, "logging_steps": 1, "reference_kl_enabled": False,
    "reference_kl_coef": 0.1, "reference_devices": None,
}  # fmt: skip
MAAC_143 = {
    "agent_learning_rate": 5e-06, "critic_learning_rate": 5e-06, "rollout_buffer_size": 8,
    "train_batch_size": None, "value_loss_coef": 0.6, "advantage_normalization": True,
    "max_new_tokens": 256, "temperature": 0.6, "top_p": 0.6, "top_k": None,
    "num_train_epochs": 40, "num_agents": 2, "num_generations": 1, "num_turns": 2,
    "parallel_training": "none", "agent_devices": None, "critic_devices": None,
    "external_prompt_passthrough": False, "discount": 1.0, "critic_type": "v",
    "early_termination_threshold": -0.2, "eval_interval": 16, "eval_num_samples": 4,
    "eval_batch_size": 1, "logging_steps": 1, "reference_kl_enabled": False,
    "reference_kl_coef": 0.1, "reference_devices": None,
}  # fmt: skip
EXPECTED = {
    MAGRPOConfig: MAGRPO_143,
    MAREINFORCEConfig: {**MAGRPO_143, "advantage_mode": "raw"},
    MARLOOConfig: {**MAGRPO_143, "advantage_mode": "rloo"},
    MAReMaxConfig: {**MAGRPO_143, "advantage_mode": "max"},
    CentralizedMAGRPOConfig: {**MAGRPO_143, "num_turns": 1, "collaboration_mode": "centralized"},
    IACConfig: IAC_143,
    MAACConfig: MAAC_143,
}

DATA = [{"prompt": p} for p in ("Once upon a time", "The dog", "Tim had a", "In the park")]


def joint_length(a: list[str], b: list[str]) -> list[float]:
    return [float(len(x) + len(y)) for x, y in zip(a, b)]


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_config_fields_and_defaults_are_1_4_3s(cls: type) -> None:
    assert {f.name: f.default for f in dataclasses.fields(cls)} == EXPECTED[cls]


def _magrpo(tiny_model: Any, tiny_tokenizer: Any, cls: type = MAGRPOTrainer, **fields: Any) -> Any:
    args = {"num_turns": 1, "num_generations": 2, "max_new_tokens": 4, **fields}
    config_cls = {MAREINFORCETrainer: MAREINFORCEConfig, MARLOOTrainer: MARLOOConfig}.get(
        cls, MAGRPOConfig
    )
    return cls(
        agents=[tiny_model, tiny_model],
        tokenizer=tiny_tokenizer,
        train_dataset=DATA,
        eval_dataset=DATA[:1],
        reward_func=joint_length,
        args=config_cls(**args),
    )


@pytest.mark.parametrize(
    ("cls", "mode", "algos_cls", "estimator", "scale"),
    [
        (MAGRPOTrainer, None, algos.MAGRPOTrainer, "grpo", "group"),
        (MARLOOTrainer, None, algos.MARLOOTrainer, "rloo", "group"),
        (MAREINFORCETrainer, None, algos.MAREINFORCETrainer, "reinforce", "none"),
        (MAGRPOTrainer, "max", algos.MAReMaxTrainer, "remax", "group"),
    ],
)
def test_advantage_mode_picks_the_algos_trainer_of_its_estimator(
    tiny_model: Any,
    tiny_tokenizer: Any,
    cls: type,
    mode: str | None,
    algos_cls: type,
    estimator: str,
    scale: str,
) -> None:
    extra = {"advantage_mode": mode} if mode else {}
    trainer = _magrpo(tiny_model, tiny_tokenizer, cls, **extra)
    assert type(trainer.recipe_trainer) is algos_cls
    assert trainer.config.estimator == estimator
    assert trainer.config.advantage_scale == scale
    assert trainer.config.loss_reduction == "seq_sum"


def test_the_schedule_and_sampling_translate_with_their_units(
    tiny_model: Any, tiny_tokenizer: Any
) -> None:
    trainer = _magrpo(
        tiny_model,
        tiny_tokenizer,
        num_train_epochs=3,
        rollout_buffer_size=3,
        agent_learning_rate=1e-4,
        temperature=0.7,
        top_p=0.9,
        top_k=None,
        discount=0.5,
        joint_mode="cross",
        eval_interval=6,
        eval_num_samples=1,
    )
    cfg = trainer.config
    # 3 epochs of 4 examples at 3 examples per step: ceil(12 / 3) = 4 steps
    assert (cfg.num_steps, cfg.batch_size, cfg.shuffle) == (4, 3, False)
    assert (cfg.learning_rate, cfg.optimizer, cfg.weight_decay, cfg.max_grad_norm) == (
        1e-4,
        "adamw",
        0.01,
        None,
    )
    assert (cfg.temperature, cfg.top_p, cfg.top_k) == (0.7, 0.9, 0)
    # 1.4.3's REINFORCE family trains on the undiscounted return whatever discount says
    assert (cfg.gamma, cfg.joint_mode, cfg.num_generations) == (1.0, "cross", 2)
    # eval_interval counts examples: every 6 examples = every 2 steps, on 1 example
    assert (cfg.eval_every, cfg.eval_limit, cfg.eval_on_start) == (2, 1, True)
    assert cfg.kl_coef == 0.0


def test_multi_turn_keeps_1_4_3s_update_schedule(tiny_model: Any, tiny_tokenizer: Any) -> None:
    trainer = MAGRPOTrainer(
        agents=[tiny_model, tiny_model],
        tokenizer=tiny_tokenizer,
        train_dataset=DATA,
        reward_func=joint_length,
        external_transition=lambda **kw: ["again"] * kw["num_agents"],
        args=MAGRPOConfig(num_generations=2, max_new_tokens=4, rollout_buffer_size=2),
    )
    cfg = trainer.config
    assert (cfg.num_turns, cfg.early_termination_threshold, cfg.termination_scope) == (
        2,
        -0.2,
        "node",
    )
    assert (cfg.update_chunk_nodes, cfg.update_chunk_split_turns, cfg.clip_ratio) == (2, True, 0.2)


def test_reference_kl_turns_on_the_recipes_kl(tiny_model: Any, tiny_tokenizer: Any) -> None:
    trainer = _magrpo(tiny_model, tiny_tokenizer, reference_kl_enabled=True, reference_kl_coef=0.05)
    assert trainer.config.kl_coef == 0.05


@pytest.mark.parametrize("separate", [True, False])
def test_iac_translates_onto_the_algos_actor_critic_recipe(
    tiny_model: Any, tiny_tokenizer: Any, separate: bool
) -> None:
    import copy

    trainer = IACTrainer(
        agents=[tiny_model, copy.deepcopy(tiny_model)],
        critics=[copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)] if separate else None,
        tokenizer=tiny_tokenizer,
        train_dataset=DATA,
        reward_func=joint_length,
        args=IACConfig(
            num_turns=1,
            use_separate_critic=separate,
            max_new_tokens=4,
            critic_learning_rate=2e-4,
            value_loss_coef=0.3,
            value_clip_range=0.1,
            critic_type="q",
        ),
    )
    assert isinstance(trainer.recipe_trainer, algos.IACTrainer)
    cfg = trainer.config
    assert cfg.critic_mode == ("separate" if separate else "shared")
    assert (cfg.gae_lambda, cfg.clip_ratio, cfg.loss_reduction) == (0.0, None, "seq_sum")
    assert (cfg.critic_learning_rate, cfg.value_loss_coef, cfg.value_clip_range) == (
        2e-4,
        0.3,
        0.1,
    )
    assert cfg.critic_type == "q" and cfg.num_generations == 1
    assert len(trainer.critic_optimizers) == (2 if separate else 0)


def test_maac_has_one_centralised_critic(tiny_model: Any, tiny_tokenizer: Any) -> None:
    import copy

    trainer = MAACTrainer(
        agents=[tiny_model, copy.deepcopy(tiny_model)],
        critics=[tiny_model],  # an agent's own model object: the critic gets a copy
        tokenizer=tiny_tokenizer,
        train_dataset=DATA,
        reward_func=joint_length,
        args=MAACConfig(num_turns=1, max_new_tokens=4, num_train_epochs=1, rollout_buffer_size=4),
    )
    assert isinstance(trainer.recipe_trainer, algos.MAACTrainer)
    assert len(trainer.recipe_trainer.critics) == 1
    assert trainer.critics[0] is not tiny_model
    rows = trainer.train()
    assert len(rows) == 1 and "value_loss" in " ".join(rows[0])


def test_settings_without_a_translation_raise_before_loading() -> None:
    with pytest.raises(UnsupportedFieldError, match="metrics_callback"):
        IACTrainer(agent_model="no/such-model", reward_func=joint_length, metrics_callback=print)
    with pytest.raises(ValueError, match="advantage_mode"):
        MAGRPOConfig(advantage_mode="median")
    with pytest.raises(ValueError, match="agent_devices lists 3 devices"):
        MAGRPOTrainer(
            agent_model="no/such-model",
            reward_func=joint_length,
            args=MAGRPOConfig(parallel_training="mp", agent_devices=["cpu"] * 3, num_turns=1),
        )


def test_eval_logger_is_accepted_with_a_warning(tiny_model: Any, tiny_tokenizer: Any) -> None:
    with pytest.warns(UserWarning, match="eval_logger and eval_aggregator are not called"):
        MAGRPOTrainer(
            agents=[tiny_model, tiny_model],
            tokenizer=tiny_tokenizer,
            reward_func=joint_length,
            eval_logger=lambda **kw: [],
            args=MAGRPOConfig(num_turns=1),
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _magrpo(tiny_model, tiny_tokenizer)
