"""comlrl.trainers: CoMLRL 1.4.3's API (configs, reward forms, errors) on our recipes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.core import JointAction, RewardFunctionError
from comlrl.trainers import (
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MADPOConfig,
    MADPOIterConfig,
    MADPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLHFConfig,
    MARLHFIterConfig,
    MARLHFTrainer,
    MARLOOConfig,
    UnsupportedFieldError,
)
from comlrl.trainers._callbacks import CompatEnvironment, CompatReward, build_formatters
from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, group_baseline_config

COMLRL143_PYTHON = Path(os.environ.get("COMLRL143_PYTHON", "/work/venv-comlrl143/bin/python"))

# --- config defaults --------------------------------------------------------------------
# Read from CoMLRL 1.4.3 (pip install comlrl==1.4.3; comlrl/trainers/*/*.py dataclass
# fields, in declaration order) when these tests were written.
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
_MADPO_EXTRA = {
    "preference_num_candidates": 80, "preference_pairs_per_sample": 16,
    "pair_selection": "reward_gap", "dpo_beta": 0.1, "use_environment_step": True,
    "environment_steps_per_pair": 2,
}  # fmt: skip
MADPO_143 = {
    **{k: v for k, v in MAGRPO_143.items() if k not in ("num_generations",)},
    "collaboration_mode": "decentralized", "num_turns": 1,
    "early_termination_threshold": None, **_MADPO_EXTRA,
}  # fmt: skip
MARLHF_143 = {
    **MADPO_143, "rl_algorithm": "magrpo", "num_generations": 4, "reward_model_name": None,
    "reward_model_device": "cuda:0", "reward_learning_rate": 1e-05,
    "reward_num_train_epochs": 1, "reward_train_batch_size": 1, "reward_max_length": None,
    "reward_freeze_backbone": False, "critic_model_name": None, "critic_learning_rate": None,
    "critic_devices": None, "use_separate_critic": True, "critic_type": "v",
    "value_loss_coef": 0.6, "value_clip_range": 0.2, "critic_value_head_hidden_dim": None,
    "value_head_hidden_dim": None,
}  # fmt: skip
# 1.4.3's iterative fields (preference/iterative.py) and the iterative trainers' overrides
ITERATIVE_143 = {
    "num_iterations": 6, "preference_replay_mode": "current", "preference_replay_k": None,
    "preference_replay_lambda": None, "preference_replay_sample_size": None,
    "preference_replay_dir": None, "log_reward_distribution": False,
    "policy_checkpoint_dir": None, "comparator_policy": "current",
    "comparator_generation_mode": "decentralized", "comparator_centralized_agent_index": 0,
    "comparator_model_name": None, "comparator_agents": None, "comparator_devices": None,
    "comparator_num_candidates": None, "comparator_history_k": None,
    "comparator_api_url": None, "comparator_api_format": "generic",
    "comparator_api_model": None, "comparator_api_max_n_per_request": None,
    "comparator_api_timeout": 120.0, "comparator_api_headers": None,
    "comparator_api_key": None, "comparator_api_key_env": None,
    "comparator_api_key_header": "Authorization", "comparator_api_key_prefix": "Bearer",
    "comparator_api_response_field": "completions", "comparator_api_extra_body": None,
    "preference_num_candidates": 20, "preference_pairs_per_sample": 4,
    "pair_selection": "comparator_reward",
}  # fmt: skip
EXPECTED = {
    MAGRPOConfig: MAGRPO_143,
    MAREINFORCEConfig: {**MAGRPO_143, "advantage_mode": "raw"},
    MARLOOConfig: {**MAGRPO_143, "advantage_mode": "rloo"},
    MAReMaxConfig: {**MAGRPO_143, "advantage_mode": "max"},
    IACConfig: IAC_143,
    MAACConfig: MAAC_143,
    MADPOConfig: MADPO_143,
    MARLHFConfig: MARLHF_143,
    CentralizedMAGRPOConfig: {**MAGRPO_143, "num_turns": 1, "collaboration_mode": "centralized"},
    MADPOIterConfig: {**MADPO_143, **ITERATIVE_143, "num_train_epochs": 1},
    MARLHFIterConfig: {
        **MARLHF_143, **ITERATIVE_143, "num_train_epochs": 2, "reward_num_train_epochs": 2,
        "preference_scoring_reward": "task",
    },
}  # fmt: skip


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_config_fields_and_defaults_equal_comlrl_1_4_3(cls: type) -> None:
    assert _defaults(cls) == EXPECTED[cls]


@pytest.mark.skipif(
    not COMLRL143_PYTHON.exists(),
    reason=f"no CoMLRL 1.4.3 environment at {COMLRL143_PYTHON} (set COMLRL143_PYTHON)",
)
def test_config_defaults_equal_the_installed_comlrl_1_4_3() -> None:
    script = (
        "import dataclasses, json, comlrl.trainers as t, comlrl.trainers.reinforce as r\n"
        "import comlrl.trainers.preference as p\n"
        f"names = {[c.__name__ for c in EXPECTED]!r}\n"
        "cls = lambda n: getattr(t, n, None) or getattr(p, n, None) or getattr(r, n)\n"
        "print(json.dumps({n: {f.name: f.default for f in dataclasses.fields(cls(n))}"
        " for n in names}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(COMLRL143_PYTHON), "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    if out.returncode != 0:
        pytest.skip(f"CoMLRL 1.4.3 did not import: {out.stderr.strip().splitlines()[-1:]}")
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    for cls in EXPECTED:
        assert _defaults(cls) == theirs[cls.__name__], cls.__name__


def test_config_post_init_fills_train_batch_size_and_rejects_bad_counts() -> None:
    assert MAGRPOConfig(rollout_buffer_size=3).train_batch_size == 3
    assert (
        IACConfig(agent_learning_rate=1e-3, critic_learning_rate=None).critic_learning_rate == 1e-3
    )
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        MAGRPOConfig(num_generations=1)
    with pytest.raises(ValueError, match="advantage_mode='median'"):
        MAGRPOConfig(advantage_mode="median")
    with pytest.raises(ValueError, match="num_generations=1"):
        IACConfig(num_turns=2, num_generations=2)
    with pytest.raises(TypeError, match="beta"):  # neither a 1.4.3 nor a pre-1.4.3 field
        MAGRPOConfig(beta=0.1)  # type: ignore[call-arg]


# --- config translation -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "estimator"),
    [("mean", "grpo"), ("raw", "reinforce"), ("max", "remax"), ("rloo", "rloo")],
)
def test_advantage_mode_maps_to_our_estimator(mode: str, estimator: str) -> None:
    fields = group_baseline_config(MAGRPOConfig(advantage_mode=mode), 2, 10, has_eval=False)
    assert fields["estimator"] == estimator


def test_translation_keeps_the_units_of_comlrl_fields() -> None:
    args = MAGRPOConfig(
        num_train_epochs=3, rollout_buffer_size=4, discount=0.5, top_k=None, joint_mode="cross",
        advantage_normalization=False, eval_interval=8, eval_num_samples=2,
        reference_kl_enabled=True, reference_kl_coef=0.05, agent_learning_rate=1e-4,
    )  # fmt: skip
    fields = group_baseline_config(args, 2, 10, has_eval=True)
    assert fields["num_steps"] == math.ceil(3 * 10 / 4)  # epochs * examples / examples per step
    assert fields["batch_size"] == 4
    assert fields["gamma"] == 0.5 and fields["top_k"] == 0 and fields["joint_mode"] == "cross"
    assert fields["advantage_scale"] == "none" and fields["kl_coef"] == 0.05
    assert fields["eval_every"] == 2 and fields["eval_limit"] == 2  # 8 examples = 2 steps
    assert fields["learning_rate"] == 1e-4 and fields["optimizer"] == "adamw"
    assert fields["termination_scope"] == "node"  # CoMLRL's rule: a node's mean reward
    assert group_baseline_config(args, 2, 10, has_eval=False)["eval_every"] == 0


# --- reward function forms --------------------------------------------------------------
EXAMPLE = {"prompt": "Once", "id": 7}


def _score(func: Any, num_agents: int = 2, processor: Any = None) -> list[float]:
    reward = CompatReward(func, num_agents, lambda ex: "P:" + ex["prompt"], processor)
    completions = [["a", "bbb"], ["cc", "d"]][:num_agents]
    return reward(completions, [EXAMPLE, EXAMPLE]).rewards


def _length_ratio(c1: list[str], c2: list[str]) -> list[float]:
    return [len(b) / len(a) for a, b in zip(c1, c2)]


class _Callable:
    def __call__(self, c1: list[str], c2: list[str]) -> list[float]:
        return _length_ratio(c1, c2)


REWARD_FORMS: dict[str, Any] = {
    "per-agent lists": _length_ratio,
    "prompts first": lambda prompts, c1, c2: [
        len(b) / len(a) if prompts == ["P:Once"] else -1.0 for a, b in zip(c1, c2)
    ],
    "one list of agents": lambda comps: [len(comps[1][0]) / len(comps[0][0])],
    "var-positional": lambda *cs: [len(cs[1][0]) / len(cs[0][0])],
    "batch_items keyword": lambda c1, c2, batch_items=None: [
        len(c2[0]) / len(c1[0]) if batch_items == [EXAMPLE] else -1.0
    ],
    "keyword-only batch_items": lambda c1, c2, *, batch_items: [
        len(c2[0]) / len(c1[0]) if batch_items[0]["id"] == 7 else -1.0
    ],
    "prompts keyword": lambda c1, c2, prompts=None: [
        len(c2[0]) / len(c1[0]) if prompts == ["P:Once"] else -1.0
    ],
    "var-keyword": lambda c1, c2, **kw: [
        len(c2[0]) / len(c1[0]) if set(kw) == {"prompts", "batch_items"} else -1.0
    ],
    "returns a tensor": lambda c1, c2: torch.tensor(_length_ratio(c1, c2), dtype=torch.float64),
    "returns a scalar": lambda c1, c2: len(c2[0]) / len(c1[0]),
    "callable object": _Callable(),
    "no readable signature": type("_NoSignature", (_Callable,), {"__signature__": "unreadable"})(),
}


@pytest.mark.parametrize("form", list(REWARD_FORMS))
def test_every_comlrl_reward_form_scores_each_joint_action(form: str) -> None:
    # exact: ratios of small integers computed in float64 by the same expression
    assert _score(REWARD_FORMS[form]) == [2.0, 1 / 3]


def test_single_agent_reward_forms() -> None:
    assert _score(lambda c: [float(len(c[0]))], num_agents=1) == [1.0, 3.0]
    assert _score(lambda prompts, c: [float(len(prompts[0]))], num_agents=1) == [6.0, 6.0]


def test_reward_processor_is_applied_to_each_reward() -> None:
    # exact: the processor applied to the same float64 ratios
    assert _score(_length_ratio, processor=lambda r: 100.0 * r) == [200.0, 100.0 * (1 / 3)]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_reward_raises_instead_of_being_replaced(bad: float) -> None:
    with pytest.raises(RewardFunctionError, match="not finite"):
        _score(lambda c1, c2: [bad])


def test_reward_function_error_names_the_joint_action() -> None:
    def broken(c1: list[str], c2: list[str]) -> list[float]:
        raise KeyError("label")

    with pytest.raises(RewardFunctionError, match="raised KeyError") as info:
        _score(broken)
    assert info.value.completions == ("a", "cc")


# --- formatters and the transition -------------------------------------------------------
def test_formatters_none_one_or_one_per_agent() -> None:
    assert [f(EXAMPLE) for f in build_formatters(None, 2)] == ["Once", "Once"]
    assert [f(EXAMPLE) for f in build_formatters(lambda ex: ex["prompt"] + "!", 2)] == ["Once!"] * 2
    two = build_formatters(
        [lambda ex: "A", lambda ex, external_prompts=None: external_prompts or "B"], 2
    )
    assert [f(EXAMPLE) for f in two] == ["A", "B"]
    assert [f(EXAMPLE, external_prompts="X") for f in two] == ["A", "X"]
    with pytest.raises(ValueError, match="3 formatters for num_agents=2"):
        build_formatters([str, str, str], 2)


@pytest.mark.parametrize("passthrough", [False, True])
def test_transition_gets_comlrl_arguments_and_prompts_go_through_formatters(
    passthrough: bool,
) -> None:
    seen: dict[str, Any] = {}

    def transition(**kwargs: Any) -> list[str]:
        seen.update(kwargs)
        return [f"next-{i}" for i in range(kwargs["num_agents"])]

    formatters = build_formatters(
        [lambda ex: "T0:" + ex["prompt"], lambda ex, external_prompts=None: f"[{ex['prompt']}]"], 2
    )
    env = CompatEnvironment(
        formatters, CompatReward(_length_ratio, 2, formatters[0]), transition, passthrough
    )
    root = env.root(EXAMPLE)
    assert root.prompts == ("T0:Once", "[Once]")
    child, _ = env.step(EXAMPLE, root, JointAction((0, 0), ("x", "y")), {}, 0)
    assert seen == {
        "prompt": "Once",
        "agent_completions": ["x", "y"],
        "num_agents": 2,
        "prompt_history_per_agent": [["T0:Once"], ["[Once]"]],
        "response_history_per_agent": [["x"], ["y"]],
    }
    # without passthrough the formatter sees an example whose "prompt" is the external one
    assert child.prompts == (("next-0", "next-1") if passthrough else ("T0:next-0", "[next-1]"))


# --- unsupported settings fail early -----------------------------------------------------
def _build(cls: Any, **kwargs: Any) -> Any:
    # the checks run before any model is loaded: the model name is never read
    base = {
        "agent_model": "no/such-model",
        "reward_func": _length_ratio,
        "train_dataset": [EXAMPLE],
    }
    return cls(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("cls", "args", "field"),
    [
        (MARLHFTrainer, MARLHFConfig(num_turns=2), "num_turns"),
        (MARLHFTrainer, MARLHFConfig(joint_mode="cross"), "joint_mode"),
        (MARLHFTrainer, MARLHFConfig(pair_selection="all"), "pair_selection"),
        (MARLHFTrainer, MARLHFConfig(parallel_training="mp", agent_devices=["cpu", "meta"]), "agent_devices"),
        (MADPOTrainer, MADPOConfig(parallel_training="mp", agent_devices=["cpu", "meta"]), "agent_devices"),
    ],
)  # fmt: skip
def test_unsupported_field_raises_naming_it(cls: Any, args: Any, field: str) -> None:
    with pytest.raises(UnsupportedFieldError, match=rf"\.{field}="):
        _build(cls, args=args)


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that says it has 4 CUDA devices (nothing is allocated on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # parallel_training='none': every agent on the first device named (1.4.3)
        ({}, {"device": "auto"}),
        ({"agent_devices": "cuda:1"}, {"device": "cuda:1"}),
        ({"agent_devices": ["cuda:1", "cuda:2"]}, {"device": "cuda:1"}),
        # 'mp': agent i on agent_devices[i]; one device -> all there; 'auto' spreads
        ({"parallel_training": "mp", "agent_devices": ["cuda:1", "cuda:3"]}, {"agent_devices": ["cuda:1", "cuda:3"]}),
        ({"parallel_training": "MP", "agent_devices": ["cuda:2"]}, {"device": "cuda:2"}),
        ({"parallel_training": "mp", "agent_devices": "auto"}, {"agent_devices": ["cuda:0", "cuda:1"]}),
        # reference copies only where the reference KL is on
        ({"reference_devices": ["cuda:3"]}, {"device": "auto"}),
        ({"reference_kl_enabled": True, "reference_devices": ["cuda:3"]}, {"device": "auto", "reference_devices": ["cuda:3", "cuda:3"]}),
    ],
)  # fmt: skip
def test_1_4_3_device_settings_map_to_our_placement(
    four_gpus: None, fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    from comlrl.algos import TrainConfig
    from comlrl.trainers._base import check_common_fields, device_fields

    args = MAGRPOConfig(num_turns=1, **fields)
    check_common_fields(args)
    got = device_fields(args, 2)
    assert got == expected
    TrainConfig(num_agents=2, kl_coef=0.1, **got)  # our config accepts the placement


def test_1_4_3_critic_devices_map_to_ours(four_gpus: None) -> None:
    from comlrl.trainers._base import check_common_fields, critic_device_names

    iac = IACConfig(num_turns=1, critic_devices=["cuda:2"])
    check_common_fields(iac)
    assert critic_device_names(iac, 2) == ["cuda:2", "cuda:2"]
    iac = IACConfig(num_turns=1, critic_devices=["cuda:2", "cuda:3"])
    assert critic_device_names(iac, 2) == ["cuda:2", "cuda:3"]
    # value heads live on their agents: 1.4.3 ignores critic_devices there
    assert (
        critic_device_names(IACConfig(use_separate_critic=False, critic_devices="cuda:3"), 2)
        is None
    )
    assert critic_device_names(MAACConfig(critic_devices="cuda:1"), 2) == ["cuda:1"]
    assert critic_device_names(MAACConfig(), 2) is None
    with pytest.raises(ValueError, match="critic_devices lists 2 devices; give 1 or 1"):
        critic_device_names(MAACConfig(critic_devices=["cuda:0", "cuda:1"]), 2)


def test_bad_1_4_3_device_settings_fail_before_any_model_loads() -> None:
    with pytest.raises(ValueError, match="critic_devices: device 'cuda:5' does not exist"):
        _build(IACTrainer, args=IACConfig(num_turns=1, critic_devices=["cpu", "cuda:5"]))
    with pytest.raises(ValueError, match="critic_devices: device 'cuda:5' does not exist"):
        _build(MAACTrainer, args=MAACConfig(num_turns=1, critic_devices="cuda:5"))
    with pytest.raises(ValueError, match="parallel_training='ddp'.*'none'.*'mp'"):
        _build(MAGRPOTrainer, args=MAGRPOConfig(num_turns=1, parallel_training="ddp"))
    with pytest.raises(ValueError, match="agent_devices lists 3 devices; give 1 or 2"):
        _build(
            MAGRPOTrainer,
            args=MAGRPOConfig(num_turns=1, parallel_training="mp", agent_devices=["cpu"] * 3),
        )
    with pytest.raises(ValueError, match="'cuda:7' does not exist"):
        _build(
            MAGRPOTrainer,
            args=MAGRPOConfig(num_turns=1, parallel_training="mp", agent_devices=["cpu", "cuda:7"]),
        )
    with pytest.raises(ValueError, match="needs agent_devices"):
        MAGRPOTrainer(agent_model="no/such-model", reward_func=_length_ratio, train_dataset=[EXAMPLE],
                      args=_mp_without_devices())  # fmt: skip


def _mp_without_devices() -> Any:
    args = MAGRPOConfig(num_turns=1)
    args.parallel_training = "mp"  # 1.4.3's config refuses this itself; set after construction
    args.agent_devices = None
    return args


def test_unsupported_arguments_raise() -> None:
    with pytest.raises(UnsupportedFieldError, match="metrics_callback"):
        _build(IACTrainer, metrics_callback=lambda rollouts: {})
    with pytest.raises(TypeError, match="takes args=MARLHFConfig"):
        _build(MARLHFTrainer, args=MADPOConfig())
    with pytest.raises(TypeError, match="takes args=IACConfig"):
        _build(IACTrainer, args=MAGRPOConfig())
    with pytest.raises(ValueError, match="needs external_transition"):
        _build(MAGRPOTrainer, args=MAGRPOConfig(num_turns=2))
    with pytest.raises(ValueError, match="reward_func must be a callable"):
        _build(MAGRPOTrainer, reward_func=None, args=MAGRPOConfig(num_turns=1))


# --- tiny runs on stories260k -------------------------------------------------------------
PROMPTS = ["Once upon a time", "The cat sat", "Lily had a red", "Tom went to the"]


def _dataset() -> Any:
    try:
        from datasets import Dataset
    except ImportError:  # datasets is absent: the list form is the same rows
        return [{"prompt": p} for p in PROMPTS]
    return Dataset.from_dict({"prompt": PROMPTS})


def _weights(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_saved_equal(path: Path, model: Any) -> None:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(path)
    for name, tensor in model.state_dict().items():  # a float32 round trip is exact
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)


def test_datasets_objects_are_accepted_when_installed() -> None:
    datasets = pytest.importorskip(
        "datasets", reason="datasets (a comlrl-compat dependency) is not installed"
    )
    from comlrl.trainers._base import as_examples

    ds = datasets.Dataset.from_dict({"prompt": PROMPTS, "n": [1, 2, 3, 4]})
    assert as_examples(ds, "train_dataset")[1] == {"prompt": "The cat sat", "n": 2}


def test_magrpo_multi_turn_trains_and_save_model_writes_loadable_weights(
    stories260k: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    calls: list[int] = []

    def transition(
        prompt: str, agent_completions: list[str], num_agents: int, **_: Any
    ) -> list[str]:
        calls.append(num_agents)
        return [f"{prompt} and then" for _ in range(num_agents)]

    trainer = MAGRPOTrainer(
        agent_model=stories260k,
        num_agents=2,
        train_dataset=_dataset(),
        eval_dataset=[{"prompt": p} for p in PROMPTS[:2]],
        reward_func=lambda c1, c2, batch_items=None: [float(len(b) > len(a)) for a, b in zip(c1, c2)],
        formatters=[lambda ex: ex["prompt"], lambda ex, external_prompts=None: ex["prompt"] + ","],
        external_transition=transition,
        args=MAGRPOConfig(
            num_train_epochs=1, num_generations=2, max_new_tokens=8, num_turns=2,
            early_termination_threshold=None, agent_learning_rate=1e-3, eval_interval=2,
            eval_num_samples=2,
        ),
    )  # fmt: skip
    before = [_weights(m) for m in trainer.agents]
    history = trainer.train()
    assert len(history) == 2 and all(math.isfinite(r["reward_mean"]) for r in history)
    assert calls, "the transition opened the second turn"
    assert any(not torch.equal(before[0][k], v) for k, v in trainer.agents[0].state_dict().items())
    metrics = trainer.evaluate()
    assert set(metrics) >= {"eval/turn_1/reward_mean", "eval/turn_2/expected_return"}
    paths = trainer.save_model(tmp_path / "out")
    assert [p.name for p in paths] == ["agent_0", "agent_1"]
    _assert_saved_equal(paths[1], trainer.agents[1])


@pytest.mark.parametrize("separate", [True, False])
def test_iac_trains_a_step_and_saves_agents_and_critics(
    stories260k: str, tmp_path: Path, separate: bool
) -> None:
    torch.manual_seed(0)
    trainer = IACTrainer(
        agent_model=stories260k,
        critic_model=stories260k if separate else None,
        reward_func=lambda c1, c2: [float(len(b)) / 10 for b in c2],
        train_dataset=_dataset(),
        args=IACConfig(
            num_turns=1, num_train_epochs=1, max_new_tokens=8, rollout_buffer_size=4,
            agent_learning_rate=1e-3, use_separate_critic=separate,
        ),
    )  # fmt: skip
    history = trainer.train()
    assert len(history) == 1 and math.isfinite(history[0]["value_loss/agent_0"])
    paths = trainer.save_model(tmp_path / "ac")
    _assert_saved_equal(tmp_path / "ac" / "agent_0", trainer.agents[0])
    critic_dir = tmp_path / "ac" / "agent_1" / ("critic" if separate else "")
    assert (critic_dir / "value_head.safetensors").is_file(), paths


def test_madpo_takes_dpo_steps_on_pairs_built_before_training(
    stories260k: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CoMLRL 1.4.3's MADPO (issue 20, finding 7): every pair is built from the initial
    policy before the first update, train_batch_size counts pairs, and the loss has no
    reference model. Before, each step sampled new pairs from the current policy and the
    DPO loss used a frozen reference (first margin exactly 0, loss log 2)."""
    from comlrl.algos.recipes.preference.madpo import recipe as preference

    torch.manual_seed(0)
    scored: list[int] = []

    def longer_second(c1: list[str], c2: list[str]) -> list[float]:
        scored.append(1)
        return [float(len(c2[0]) - len(c1[0]))]

    seen_at_update: list[int] = []
    update = preference.madpo_update

    def counting_update(run: Any, pairs: Any) -> dict[str, float]:
        seen_at_update.append(len(scored))
        return update(run, pairs)

    monkeypatch.setattr(preference, "madpo_update", counting_update)
    trainer = MADPOTrainer(
        agent_model=stories260k,
        num_agents=2,
        train_dataset=_dataset(),
        reward_func=longer_second,
        args=MADPOConfig(
            num_train_epochs=2, rollout_buffer_size=2, train_batch_size=3,
            preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8,
            agent_learning_rate=1e-3,
        ),
    )  # fmt: skip
    before = _weights(trainer.agents[1])
    rows = trainer.train()
    # 4 prompts x 4 candidates scored once, all before the first update
    assert len(scored) == 4 * len(PROMPTS)
    assert seen_at_update == [len(scored)] * len(rows)
    assert rows[0]["margin"] != 0.0  # no reference: the policy's own log-prob gap
    num_pairs = len(trainer.preference_pairs)
    assert 1 <= num_pairs <= 2 * len(PROMPTS)
    assert len(rows) == 2 * math.ceil(num_pairs / 3)
    assert (
        all(r["num_pairs"] <= 3 for r in rows)
        and sum(r["num_pairs"] for r in rows) == 2 * num_pairs
    )
    assert any(not torch.equal(before[k], v) for k, v in trainer.agents[1].state_dict().items())
    _assert_saved_equal(trainer.save_model(tmp_path / "dpo")[0], trainer.agents[0])


def test_madpo_trains_with_the_checkpoint_arguments_at_their_defaults(stories260k: str) -> None:
    """A 1.4.3 script may pass ``train(resume_from_checkpoint=None)``: MADPO trains then
    (its checkpoints are tested in test_compat_preference_checkpoint.py); a bad
    ``checkpoint_interval`` and an unknown keyword are refused before anything trains."""
    trainer = MADPOTrainer(
        agent_model=stories260k,
        num_agents=2,
        train_dataset=_dataset(),
        reward_func=lambda c1, c2: [float(len(c2[0]) - len(c1[0]))],
        args=MADPOConfig(
            num_train_epochs=1, rollout_buffer_size=2, train_batch_size=2,
            preference_num_candidates=2, preference_pairs_per_sample=1, max_new_tokens=4,
        ),
    )  # fmt: skip
    with pytest.raises(ValueError, match="checkpoint_interval"):
        trainer.train(checkpoint_interval=0)
    with pytest.raises(UnsupportedFieldError, match="save_steps"):
        trainer.train(save_steps=1)
    assert trainer.preference_pairs == []
    rows = trainer.train(resume_from_checkpoint=None, checkpoint_interval=1)
    assert all(math.isfinite(r["loss"]) for r in rows)


# --- MARLHF --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("algorithm", "name", "mode"),
    [
        ("magrpo", "magrpo", "mean"),
        ("mareforce", "mareinforce", "raw"),  # 1.4.3's alias
        ("MAReMax", "maremax", "max"),
        ("marloo", "marloo", "rloo"),
        ("iac", "iac", "mean"),
    ],
)
def test_marlhf_rl_algorithm_sets_the_advantage_mode_as_in_1_4_3(
    algorithm: str, name: str, mode: str
) -> None:
    cfg = MARLHFConfig(rl_algorithm=algorithm)
    assert (cfg.rl_algorithm, cfg.advantage_mode) == (name, mode)


def test_marlhf_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="rl_algorithm='ppo'"):
        MARLHFConfig(rl_algorithm="ppo")
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        MARLHFConfig(num_generations=1)
    assert MARLHFConfig(rl_algorithm="iac", num_generations=1).num_generations == 1
    with pytest.raises(ValueError, match="reward_train_batch_size must be >= 1"):
        MARLHFConfig(reward_train_batch_size=0)
    with pytest.raises(ValueError, match="critic_type='w'"):
        MARLHFConfig(critic_type="w")


def test_marlhf_unsupported_arguments_raise_before_loading() -> None:
    with pytest.raises(UnsupportedFieldError, match="metrics_callback"):
        _build(MARLHFTrainer, metrics_callback=lambda rows: {})
    # the adapter is checked in either mode, as 1.4.3 does
    with pytest.raises(TypeError, match="build_prompt must be callable"):
        _build(MARLHFTrainer, centralized_comparator_adapter=object())


@pytest.mark.parametrize("algorithm", ["magrpo", "iac"])
def test_marlhf_fits_the_reward_model_then_trains_on_its_scores(
    stories260k: str, tmp_path: Path, algorithm: str
) -> None:
    torch.manual_seed(0)
    task_calls: list[int] = []

    def longer_second(c1: list[str], c2: list[str]) -> list[float]:
        task_calls.append(1)
        return [float(len(c2[0]) > len(c1[0]))]

    trainer = MARLHFTrainer(
        agent_model=stories260k,
        num_agents=2,
        train_dataset=_dataset(),
        eval_dataset=[{"prompt": p} for p in PROMPTS[:2]],
        reward_func=longer_second,
        args=MARLHFConfig(
            rl_algorithm=algorithm, num_train_epochs=1, rollout_buffer_size=4,
            preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8,
            agent_learning_rate=1e-3, reward_learning_rate=1e-3, reward_train_batch_size=2,
            reward_num_train_epochs=2, num_generations=2 if algorithm == "magrpo" else 1,
            reward_model_device=None, eval_interval=0,
        ),
    )  # fmt: skip
    before = _weights(trainer.agents[0])
    head_before = trainer.reward_model.head.weight.detach().clone()
    history = trainer.train()
    pairs = sum(len(p) for p in trainer.preference_pairs)
    assert pairs >= 1 and trainer.reward_model_history, "pairs were labelled and the RM fitted"
    assert not torch.equal(head_before, trainer.reward_model.head.weight)
    # 2 epochs over the pairs in batches of 2
    assert len(trainer.reward_model_history) == 2 * math.ceil(pairs / 2)
    assert len(history) == 1
    # reward_func labelled the 4 prompts x 4 candidate joint actions and nothing else: the
    # RL stage is rewarded by the model
    labelled = len(PROMPTS) * 4
    assert len(task_calls) == labelled
    # the learned reward is a real-valued score, the task reward a 0/1 indicator
    assert {history[0]["reward_min"], history[0]["reward_max"]} - {0.0, 1.0}
    assert any(not torch.equal(before[k], v) for k, v in trainer.agents[0].state_dict().items())
    metrics = trainer.evaluate()
    assert len(task_calls) == labelled + 2, "evaluation scores with the task reward"
    assert metrics["eval/turn_1/reward_mean"] in (0.0, 0.5, 1.0)
    paths = trainer.save_model(tmp_path / "marlhf")
    assert [p.name for p in paths] == ["agent_0", "agent_1"]
    _assert_saved_equal(paths[0], trainer.agents[0])


# --- centralized MAGRPO and the names that are not implemented ----------------------------
class _SplitAtComma:
    """Role 0 writes up to the first comma, role 1 the rest (stories260k writes commas)."""

    def __init__(self) -> None:
        self.prompts: list[list[str]] = []
        self.parsed: list[str] = []

    def build_prompt(self, item: dict[str, Any], agent_prompts: list[str]) -> str:
        self.prompts.append(list(agent_prompts))
        return " ".join(agent_prompts)

    def parse_completion(self, completion: str, item: dict[str, Any], num_agents: int) -> list[str]:
        self.parsed.append(completion)
        head, _, tail = completion.partition(",")
        return [head, tail]


def test_tagged_adapter_round_trip_and_parse_error() -> None:
    from comlrl.trainers.preference import (
        CentralizedComparatorParseError,
        TaggedCentralizedComparatorAdapter,
    )

    adapter = TaggedCentralizedComparatorAdapter()
    prompt = adapter.build_prompt({}, ["write A", "write B"])
    assert "write A" in prompt and "<agent_1>" in prompt
    text = "<agent_0> one </agent_0> noise <AGENT_1>two\n</agent_1>"
    assert adapter.parse_completion(text, {}, 2) == ["one", "two"]
    assert adapter.parse_completion("<agent_1>x</agent_1>", {}, 2) == ["", "x"]
    with pytest.raises(CentralizedComparatorParseError, match="no <agent_i> section"):
        adapter.parse_completion("plain text", {}, 2)


def test_centralized_magrpo_checks_its_arguments_before_loading() -> None:
    from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer

    assert (CentralizedMAGRPOConfig().num_turns, CentralizedMAGRPOConfig().collaboration_mode) == (
        1,
        "centralized",
    )
    with pytest.raises(ValueError, match="num_turns=2"):
        CentralizedMAGRPOConfig(num_turns=2)
    base = {
        "agent_model": "no/such-model",
        "reward_func": _length_ratio,
        "train_dataset": [EXAMPLE],
    }
    with pytest.raises(ValueError, match="needs args=CentralizedMAGRPOConfig"):
        CentralizedMAGRPOTrainer(centralized_adapter=_SplitAtComma(), args=MAGRPOConfig(), **base)
    with pytest.raises(ValueError, match="num_agents=3 but args.num_agents=2"):
        CentralizedMAGRPOTrainer(centralized_adapter=_SplitAtComma(), num_agents=3, **base)
    with pytest.raises(TypeError, match="centralized_adapter.build_prompt"):
        CentralizedMAGRPOTrainer(centralized_adapter=object(), **base)


def test_centralized_magrpo_trains_one_policy_on_parsed_role_outputs(
    stories260k: str, tmp_path: Path
) -> None:
    from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer

    torch.manual_seed(0)
    seen: list[tuple[str, str]] = []
    logged: dict[str, Any] = {}

    def second_longer(c1: list[str], c2: list[str]) -> list[float]:
        seen.append((c1[0], c2[0]))
        return [float(len(c2[0]) > len(c1[0]))]

    def eval_logger(agent_completions_turns: Any, **_: Any) -> list[dict[str, float]]:
        logged["roles"] = agent_completions_turns
        return [{"n": 1.0}]

    adapter = _SplitAtComma()
    trainer = CentralizedMAGRPOTrainer(
        centralized_adapter=adapter,
        agent_model=stories260k,
        train_dataset=_dataset(),
        eval_dataset=[{"prompt": p} for p in PROMPTS[:2]],
        reward_func=second_longer,
        reward_processor=lambda r: 10.0 * r,
        formatters=[lambda ex: "A: " + ex["prompt"], lambda ex: "B: " + ex["prompt"]],
        eval_logger=eval_logger,
        eval_aggregator=lambda rows, num_turns: {"rows": float(len(rows))},
        args=CentralizedMAGRPOConfig(
            num_train_epochs=1, num_generations=4, max_new_tokens=16, rollout_buffer_size=4,
            agent_learning_rate=1e-3, eval_interval=0,
        ),
    )  # fmt: skip
    assert len(trainer.agents) == 1
    assert adapter.prompts[0] == ["A: Once upon a time", "B: Once upon a time"]
    before = _weights(trainer.agents[0])
    (row,) = trainer.train()
    # 4 prompts x 4 joint responses: each parsed into its role outputs, which the reward sees
    assert len(seen) == len(adapter.parsed) == 4 * 4
    assert seen == [(t.partition(",")[0], t.partition(",")[2]) for t in adapter.parsed]
    # the processor is applied once to the 0/1 role-level reward (exact: 10.0 * {0, 1})
    assert {row["reward_min"], row["reward_max"]} <= {0.0, 10.0}
    assert any(not torch.equal(before[k], v) for k, v in trainer.agents[0].state_dict().items())
    metrics = trainer.evaluate()
    assert metrics["eval/rows"] == 1.0
    assert len(logged["roles"]) == 2 and len(logged["roles"][0]) == 2  # [role][example][turn]
    assert [p.name for p in trainer.save_model(tmp_path / "c")] == ["agent_0"]


def test_formatter_strings_reach_the_model_as_they_are_even_with_a_chat_template(
    stories260k: str,
) -> None:
    # CoMLRL 1.4.3 tokenizes the formatters' strings as they are; ours must not wrap them
    # in a chat template (prompt_format=auto would, for an instruct model's tokenizer).
    trainer = MAGRPOTrainer(
        agent_model=stories260k,
        num_agents=2,
        train_dataset=_dataset(),
        reward_func=lambda c1, c2, batch_items=None: [0.0] * len(c1),
        formatters=[lambda ex: ex["prompt"], lambda ex: ex["prompt"] + ","],
        args=MAGRPOConfig(num_train_epochs=1, num_generations=2, max_new_tokens=4, num_turns=1),
    )
    for tok in trainer.tokenizers:
        tok.chat_template = "<|im_start|>{{ messages[0]['content'] }}"
    agents = trainer._hf_agents()
    assert [a.prompt_format for a in agents] == ["raw", "raw"]
    assert agents[0].render(["The cat sat"]) == ["The cat sat"]
