"""Every public name of comlrl.trainers (reinforce, actor-critic) and comlrl.utils imports,
and 1.4.3's comlrl.utils names that are not provided say what to use instead."""

from __future__ import annotations

import importlib

import comlrl.trainers
import comlrl.utils
import pytest

#: the preference trainers' names (tested beside their trainers)
PREFERENCE = {"MADPO", "MARLHF", "JointRewardModel", "CentralizedComparator", "TaggedCentralized"}


@pytest.mark.parametrize(
    "name", [n for n in comlrl.trainers.__all__ if not n.startswith(tuple(PREFERENCE))]
)
def test_every_trainers_name_imports(name: str) -> None:
    assert getattr(comlrl.trainers, name) is not None


@pytest.mark.parametrize("name", comlrl.utils.__all__)
def test_every_utils_name_imports(name: str) -> None:
    assert getattr(comlrl.utils, name) is not None


@pytest.mark.parametrize(
    "module",
    [
        "comlrl.trainers.reinforce.magrpo",
        "comlrl.trainers.reinforce.mareinforce",
        "comlrl.trainers.reinforce.marloo",
        "comlrl.trainers.reinforce.maremax",
        "comlrl.trainers.reinforce.centralized_magrpo",
        "comlrl.trainers.actor_critic.ac_base",
        "comlrl.trainers.actor_critic.iac",
        "comlrl.trainers.actor_critic.maac",
    ],
)
def test_1_4_3_module_paths_import(module: str) -> None:
    assert importlib.import_module(module).__all__


def test_a_1_4_3_internal_helper_names_its_replacement() -> None:
    with pytest.raises(comlrl.utils.NotProvidedError, match="resume_from_checkpoint"):
        comlrl.utils.read_checkpoint_metadata  # noqa: B018
