"""The coop_story suite: built-in seeds, short prompts, reward parts."""

from __future__ import annotations

import pytest
from comlrl.core import get_task
from comlrl.envs import CoopStoryTask
from comlrl.envs.writing import story_reward, story_seeds
from hypothesis import given
from hypothesis import strategies as st

KW = ["lily", "ball", "park"]


def test_seeds_and_disjoint_splits() -> None:
    seeds = story_seeds()
    assert len(seeds) == 320 and seeds == story_seeds()  # fixed
    assert len({(s["name"], s["place"], s["object"]) for s in seeds}) == 320
    t = CoopStoryTask()
    train, test = t.load("train"), t.load("test")
    assert (len(train), len(test)) == (280, 40)
    assert not {s["seed_id"] for s in train} & {s["seed_id"] for s in test}
    assert len(CoopStoryTask(limit=5).load("train")) == 5


def test_prompts_are_short_and_name_the_keywords() -> None:
    t = get_task("coop_story")
    for ex in t.load("train")[:50]:
        begin, end = t.prompts(ex)
        assert len(begin) < 120 and len(end) < 120
        for keyword in ex["keywords"]:
            assert keyword in begin.lower() and keyword in end.lower()
        assert end.endswith("In the end,")


def test_hand_checked_good_story() -> None:
    part1 = "Lily took her ball to the park. She threw the ball high and her dog ran after it."
    part2 = "Lily and the dog were tired. They sat under a tree in the park and ate a red apple."
    reward, info = story_reward(part1, part2, KW, min_words=10, max_words=40)
    parts = info["reward_parts"]
    assert info["keywords_found"] == [KW, ["lily", "park"]]
    assert parts["keywords1"] == pytest.approx(0.2)
    assert parts["keywords2"] == pytest.approx(0.2 * 2 / 3)
    assert parts["length1"] == parts["length2"] == pytest.approx(0.1)
    assert 0.1 <= info["jaccard"] <= 0.5 and parts["shared_vocabulary"] == pytest.approx(0.2)
    assert parts["no_repetition"] == pytest.approx(0.2)  # no repeated trigram
    assert reward == pytest.approx(1.0 - 0.2 / 3, abs=1e-6)


def test_repetition_and_copying_are_penalised() -> None:
    loop = "the ball the ball the ball the ball the ball the ball"
    good = "Lily took her ball to the park. She threw the ball high and her dog ran after it."
    r_loop, info_loop = story_reward(loop, loop, KW)
    r_good, _ = story_reward(good, "In the end Lily went home with the ball and slept.", KW)
    assert info_loop["distinct_trigrams"] < 0.3 and info_loop["jaccard"] == 1.0
    assert info_loop["reward_parts"]["shared_vocabulary"] == 0.0
    assert r_loop < r_good


def test_empty_parts_score_zero() -> None:
    assert story_reward("", "", KW)[0] == 0.0


@given(st.text(max_size=200), st.text(max_size=200))
def test_reward_in_unit_interval(a: str, b: str) -> None:
    assert 0.0 <= story_reward(a, b, KW)[0] <= 1.0


def test_task_reward_batch_and_errors() -> None:
    t = CoopStoryTask()
    ex = t.load("test")[0]
    batch = t.reward([["", "x"], ["", "y"]], [ex, ex])
    assert len(batch.rewards) == 2 and batch.rewards[0] == 0.0
    with pytest.raises(ValueError, match="one completion per joint action"):
        t.reward([["a"], ["b", "c"]], [ex])
    with pytest.raises(ValueError, match="min_words"):
        CoopStoryTask(min_words=50, max_words=10)
