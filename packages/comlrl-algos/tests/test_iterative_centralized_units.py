"""The pieces of the centralized and iterative recipes, without models: role formats
(:mod:`comlrl.algos.rollout.joint_policy`), the comparator's history bookkeeping, the
rounds' pair split, and the iterative config's rules."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from comlrl.algos.recipes.preference.config import IterativeSection
from comlrl.algos.recipes.preference.iterative.comparator import Comparator
from comlrl.algos.recipes.preference.iterative.replay import PreferenceReplay
from comlrl.algos.recipes.preference.iterative.rounds import IterativeRounds
from comlrl.algos.recipes.preference.pairs import IterPair
from comlrl.algos.rollout.joint_policy import (
    CentralizedReward,
    RoleParseError,
    SentenceRoles,
    TaggedRoles,
    centralized_callbacks,
    split_roles,
)
from comlrl.algos.training.config.rl import ConfigError
from comlrl.core import RewardBatch, SamplingParams
from hypothesis import given, settings
from hypothesis import strategies as st

_WORDS = st.text(alphabet="abc xyz", min_size=1, max_size=12).map(str.strip).filter(bool)


@settings(max_examples=80, deadline=None)
@given(st.lists(_WORDS, max_size=9), st.integers(1, 5))
def test_sentence_roles_hand_out_every_sentence_in_order_in_near_equal_runs(
    sentences: list[str], roles: int
) -> None:
    text = " ".join(f"{s}." for s in sentences)
    out = SentenceRoles().parse_completion(text, {}, roles)
    assert len(out) == roles
    # nothing lost or reordered: the runs, read in order, are the sentences
    got = [s for o in out for s in re.split(r"(?<=\.)\s+", o) if s]
    assert got == [f"{s}." for s in sentences]
    sizes = [len([s for s in re.split(r"(?<=\.)\s+", o) if s]) for o in out]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_sentence_roles_prompt_joins_the_role_prompts_in_order() -> None:
    assert SentenceRoles().build_prompt({}, [" Once upon a time. ", "In the end,"]) == (
        "Once upon a time. In the end,"
    )


def test_tagged_roles_read_sections_and_an_untagged_answer_is_empty_for_every_role() -> None:
    tagged = TaggedRoles()
    assert "<agent_1>" in tagged.build_prompt({}, ["a", "b"])
    assert tagged.parse_completion("<agent_1> x </agent_1>", {}, 2) == ["", "x"]
    with pytest.raises(RoleParseError, match="no <agent_i> section"):
        tagged.parse_completion("plain story", {}, 2)
    assert split_roles(tagged, "plain story", {}, 2) == ["", ""]


def test_split_roles_rejects_a_format_that_returns_the_wrong_shape() -> None:
    class Bad:
        def __init__(self, value: Any) -> None:
            self.value = value

        def build_prompt(self, item: Any, prompts: Any) -> str:
            return "p"

        def parse_completion(self, completion: str, item: Any, n: int) -> Any:
            return self.value

    with pytest.raises(TypeError, match="list of 2 strings"):
        split_roles(Bad("one string"), "x", {}, 2)
    with pytest.raises(ValueError, match="must return 2 strings"):
        split_roles(Bad(["only one"]), "x", {}, 2)
    with pytest.raises(TypeError, match="build_prompt must be callable"):
        CentralizedReward(object(), None, 2)


def test_centralized_reward_scores_the_parsed_roles_as_joint_actions() -> None:
    seen: list[Any] = []

    def role_reward(completions: Any, examples: Any) -> RewardBatch:
        seen.append(completions)
        return RewardBatch(torch.tensor([float(len(b) > len(a)) for a, b in zip(*completions)]))

    prompt, reward = centralized_callbacks(
        lambda ex: [f"A {ex['x']}", f"B {ex['x']}"], role_reward, 2, SentenceRoles()
    )
    assert prompt({"x": 1}) == "A 1 B 1"
    out = reward([["One. Two three four.", "Five six. Seven."]], [{"x": 1}, {"x": 2}])
    assert seen == [[["One.", "Five six."], ["Two three four.", "Seven."]]]
    assert out.rewards.tolist() == [1.0, 0.0]
    empty, _ = centralized_callbacks(lambda ex: ["", ""], role_reward, 2, SentenceRoles())
    with pytest.raises(ValueError, match="non-empty prompt"):
        empty({})


def _agent(value: float) -> Any:
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    return SimpleNamespace(model=model, tokenizer=None)


def test_history_comparator_keeps_only_the_snapshots_later_rounds_read() -> None:
    agents = [_agent(0.0)]
    cmp = Comparator("history", agents, history_k=3, num_rounds=5)
    cmp.start()
    assert [cmp.snapshot_index(r) for r in range(5)] == [0, 0, 0, 1, 2]
    kept = []
    for r in range(5):
        with torch.no_grad():
            agents[0].model.weight.fill_(float(r + 1))  # round r's update
        cmp.finish_round(r)
        kept.append(sorted(cmp.snapshots))
        if r == 1:  # snapshot 1 is the policy after round 0 (weight 1), not the live one
            assert float(cmp.snapshots[1][0]["weight"]) == 1.0
    # snapshot i (the policy after round i - 1) lives until round i + k - 1 has read it;
    # none is taken that no round reads (round 3's snapshot would serve round 5)
    assert kept == [[0, 1], [0, 1, 2], [1, 2], [2], []]


def test_comparator_rejects_unknown_policies_and_missing_models() -> None:
    with pytest.raises(ValueError, match="comparator='api'"):
        Comparator("api", [_agent(0.0)])
    with pytest.raises(ValueError, match="needs comparator models"):
        Comparator("model", [_agent(0.0)])
    with pytest.raises(ValueError, match="3 comparator models for 2 agents"):
        Comparator("model", [_agent(0.0), _agent(1.0)], sources=["a", "b", "c"], load=str)
    with pytest.raises(ValueError, match="need a load= function"):
        Comparator("model", [_agent(0.0)], sources="name")


def _pair(i: int) -> IterPair:
    return IterPair(0, {"i": i}, ("p",), ("c",), ("r",), ((1,),), ((2,),), ((3,),),
                    1.0, 0.0, "current", "comparator")  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 20), st.integers(1, 6))
def test_a_rounds_pairs_are_split_over_its_steps_once_each(num: int, parts: int) -> None:
    rounds = IterativeRounds(
        Comparator("current", []),
        PreferenceReplay("current", None, None, None, random.Random(0)),
        sampling=SamplingParams(num_generations=2),
        comparator_sampling=SamplingParams(num_generations=2),
        pair_selection="all",
        pairs_per_prompt=None,
        seed=0,
    )
    chunks = rounds.split([_pair(i) for i in range(num)], parts)
    assert len(chunks) == parts
    assert sorted(p.example["i"] for c in chunks for p in c) == list(range(num))
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"replay_mode": "nearest_k"}, "needs replay_k"),
        ({"replay_k": 2}, "needs replay_mode='nearest_k'"),
        ({"replay_mode": "lambda_decay"}, "needs replay_lambda"),
        ({"replay_sample_size": 4}, "other than 'current'"),
        ({"comparator": "model"}, "needs comparator_models"),
        ({"comparator_models": ["m"]}, "only it reads them"),
        ({"comparator_history_k": 2}, "needs comparator='history'"),
    ],
)
def test_iterative_config_names_a_field_its_mode_does_not_read(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        IterativeSection.build(**fields)


def test_rounds_of_a_run() -> None:
    cfg = IterativeSection.build(steps_per_round=4)
    assert [cfg.num_rounds(n) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
