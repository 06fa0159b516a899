"""comlrl.utils: CoMLRL 1.4.3's user-facing helpers, and clear errors for the rest."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from comlrl.utils import _NOT_PROVIDED, NotProvidedError, RewardProcessors, ensure_pad_token

COMLRL143_PYTHON = Path(os.environ.get("COMLRL143_PYTHON", "/work/venv-comlrl143/bin/python"))
# CoMLRL 1.4.3's comlrl.utils.__all__ (read from its comlrl/utils/__init__.py)
UTILS_ALL_143 = [
    "read_checkpoint_metadata", "build_formatters", "ensure_pad_token", "ensure_tokenizer",
    "apply_tokenizer_specials", "resolve_tokenizers", "infer_model_name",
    "resolve_model_sources", "clone_reference_models", "load_reference_models_from_sources",
    "reference_kl_coef", "reference_kl_enabled", "reference_kl_for_sequence",
    "resolve_reference_devices", "validate_reference_kl_config", "RewardProcessors",
    "call_reward_function", "normalize_reward_lengths", "resolve_reward_range",
    "set_reward_range", "DistributedContext", "local_context", "unwrap_model",
]  # fmt: skip


def test_the_tutorial_import_path_works() -> None:
    module = importlib.import_module("comlrl.utils.reward_processor")
    assert module.RewardProcessors is RewardProcessors


@pytest.mark.parametrize("x", [-2.5, 0.0, 0.25, 3.0])
def test_reward_processors_scale_and_shift(x: float) -> None:
    # exact: one float multiplication / addition, as 1.4.3's lambdas
    assert RewardProcessors.scale(factor=100.0)(x) == 100.0 * x
    assert RewardProcessors.shift(value=-1.5)(x) == x - 1.5
    assert RewardProcessors.scale()(x) == x and RewardProcessors.shift()(x) == x


@pytest.mark.parametrize("name", UTILS_ALL_143)
def test_every_1_4_3_utils_name_is_provided_or_fails_naming_it(name: str) -> None:
    import comlrl.utils

    if name in comlrl.utils.__all__:
        assert getattr(comlrl.utils, name) is not None
        return
    with pytest.raises(NotProvidedError, match=rf"comlrl\.utils\.{name} .* use "):
        exec(f"from comlrl.utils import {name}", {})


def test_unknown_names_are_plain_attribute_errors() -> None:
    import comlrl.utils

    assert not hasattr(comlrl.utils, "no_such_helper")
    provided = set(comlrl.utils.__all__) - {"NotProvidedError"}
    assert not provided & set(_NOT_PROVIDED)
    assert provided | set(_NOT_PROVIDED) == set(UTILS_ALL_143)


def test_ensure_pad_token_uses_eos_and_rejects_a_tokenizer_without_either() -> None:
    class Tok:
        def __init__(self, eos: str | None) -> None:
            self.pad_token, self.eos_token = None, eos

        @property
        def pad_token_id(self) -> int | None:
            return None if self.pad_token is None else 0

    assert ensure_pad_token(Tok("</s>")).pad_token == "</s>"
    with pytest.raises(ValueError, match="no pad token and no EOS token"):
        ensure_pad_token(Tok(None))


@pytest.mark.skipif(
    not COMLRL143_PYTHON.exists(),
    reason=f"no CoMLRL 1.4.3 environment at {COMLRL143_PYTHON} (set COMLRL143_PYTHON)",
)
def test_utils_names_equal_the_installed_comlrl_1_4_3() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(COMLRL143_PYTHON), "-c", "import json, comlrl.utils as u; print(json.dumps(u.__all__))"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    if out.returncode != 0:
        pytest.skip(f"CoMLRL 1.4.3 did not import: {out.stderr.strip().splitlines()[-1:]}")
    assert json.loads(out.stdout.strip().splitlines()[-1]) == UTILS_ALL_143


@pytest.mark.parametrize(
    "module",
    [
        "comlrl.trainers",
        "comlrl.trainers.reinforce",
        "comlrl.trainers.actor_critic",
        "comlrl.trainers.preference",
        "comlrl.utils",
        # CoMLRL 1.4.3's submodule paths
        "comlrl.trainers.reinforce.magrpo",
        "comlrl.trainers.reinforce.mareinforce",
        "comlrl.trainers.reinforce.marloo",
        "comlrl.trainers.reinforce.maremax",
        "comlrl.trainers.reinforce.centralized_magrpo",
        "comlrl.trainers.actor_critic.ac_base",
        "comlrl.trainers.actor_critic.iac",
        "comlrl.trainers.actor_critic.maac",
        "comlrl.trainers.preference.madpo",
        "comlrl.trainers.preference.marlhf",
        "comlrl.trainers.preference.iterative",
        "comlrl.trainers.preference.centralized",
        "comlrl.utils.reward_utils",
        "comlrl.utils.formatters",
        "comlrl.utils.reference_kl",
        "comlrl.utils.wandb_utils",
        "comlrl.utils.distributed",
    ],
)
def test_every_public_name_of_the_compat_modules_imports(module: str) -> None:
    loaded = importlib.import_module(module)
    assert [n for n in loaded.__all__ if not hasattr(loaded, n)] == []


# CoMLRL 1.4.3's __all__ of each trainers module (read from the installed 1.4.3 with
# `python -c "import comlrl.trainers.X as m; print(m.__all__)"`).
TRAINERS_ALL_143 = {
    "comlrl.trainers": [
        "ActorCriticTrainerBase", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer",
        "MAGRPOConfig", "MAGRPOTrainer", "MADPOConfig", "MADPOTrainer", "MARLHFConfig",
        "MARLHFTrainer", "JointRewardModel", "MAREINFORCEConfig", "MAREINFORCETrainer",
        "MAReMaxConfig", "MAReMaxTrainer", "MARLOOConfig", "MARLOOTrainer",
    ],
    "comlrl.trainers.reinforce": [
        "MAGRPOConfig", "MAGRPOTrainer", "CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer",
        "MAREINFORCEConfig", "MAREINFORCETrainer", "MAReMaxConfig", "MAReMaxTrainer",
        "MARLOOConfig", "MARLOOTrainer",
    ],
    "comlrl.trainers.actor_critic": [
        "ActorCriticTrainerBase", "IACConfig", "IACTrainer", "RolloutSample", "MAACConfig",
        "MAACTrainer",
    ],
    "comlrl.trainers.preference": [
        "MADPOConfig", "MADPOTrainer", "CentralizedComparatorAdapter",
        "CentralizedComparatorParseError", "TaggedCentralizedComparatorAdapter",
        "MADPOIterConfig", "MADPOIterTrainer", "MARLHFConfig", "MARLHFTrainer",
        "MARLHFIterConfig", "MARLHFIterTrainer", "JointRewardModel",
    ],
}  # fmt: skip
# Internals of 1.4.3 that are deliberately not provided (docs/compat.md); none today
# (RolloutSample is provided as 1.4.3's record, comlrl/trainers/actor_critic/_hooks143.py).
NOT_PROVIDED_143: set[tuple[str, str]] = set()


@pytest.mark.parametrize("module", sorted(TRAINERS_ALL_143))
def test_every_comlrl_1_4_3_trainers_name_is_provided_or_refused_clearly(module: str) -> None:
    loaded = importlib.import_module(module)
    for name in TRAINERS_ALL_143[module]:
        if (module, name) in NOT_PROVIDED_143:
            with pytest.raises(NotProvidedError, match=f"{name}.*not provided"):
                getattr(loaded, name)
        else:
            assert name in loaded.__all__, f"{module}.{name} missing from __all__"
            assert getattr(loaded, name) is not None
    base = importlib.import_module("comlrl.trainers").ActorCriticTrainerBase
    trainers = importlib.import_module("comlrl.trainers")
    assert issubclass(trainers.IACTrainer, base) and issubclass(trainers.MAACTrainer, base)
