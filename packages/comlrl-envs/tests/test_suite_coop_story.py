"""The coop_story suite: built-in seeds, short prompts, reward parts."""

from __future__ import annotations

import pytest
from comlrl.core import ChatPrompt, chat_messages, get_task, prompt_text
from comlrl.envs import CoopStoryTask
from comlrl.envs.writing import story_reward, story_seeds
from comlrl.envs.writing.story import DEFAULT_WEIGHTS, check_weights
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
        begin, end = map(prompt_text, t.prompts(ex))
        assert len(begin) < 120 and len(end) < 120
        for keyword in ex["keywords"]:
            assert keyword in begin.lower() and keyword in end.lower()
        assert end.endswith("In the end,")


def test_raw_prompts_are_unchanged_for_base_models() -> None:
    # the exact texts the stories260k default run saw before chat prompts existed
    t = CoopStoryTask()
    assert [prompt_text(p) for p in t.prompts(t.load("train")[0])] == [
        "Once upon a time, a little boy named Joe went to the hill. He had a toy car.",
        "Joe played with the toy car at the hill. In the end,",
    ]
    assert [prompt_text(p) for p in t.prompts(t.load("test")[0])] == [
        "Once upon a time, a little girl named Mia went to the garden. She had a flower.",
        "Mia played with the flower at the garden. In the end,",
    ]


def test_chat_prompts_give_each_agent_its_part_and_the_keywords() -> None:
    t = CoopStoryTask(min_words=12, max_words=30)
    ex = t.load("test")[0]
    for part, prompt in zip(("beginning", "ending"), t.prompts(ex), strict=True):
        assert isinstance(prompt, ChatPrompt)
        system, user = chat_messages(prompt)
        assert system["role"] == "system" and f"You write the {part}" in system["content"]
        assert user["role"] == "user" and "12 to 30 words" in user["content"]
        assert all(k in user["content"].lower() for k in ex["keywords"])
        assert prompt.raw is not None and f'Start with: "{prompt.raw}"' in user["content"]


def test_hand_checked_good_story() -> None:
    part1 = "Lily took her ball to the park. She threw the ball high and her dog ran after it."
    part2 = "Lily and the dog were tired. They sat under a tree in the park and ate a red apple."
    reward, info = story_reward(part1, part2, KW, min_words=10, max_words=40)
    parts, scores = info["reward_parts"], info["scores"]
    assert info["keywords_found"] == [KW, ["lily", "park"]]
    assert scores["keywords1"] == pytest.approx(1.0) and parts["keywords1"] == pytest.approx(0.3)
    assert scores["keywords2"] == pytest.approx(2 / 3) and parts["keywords2"] == pytest.approx(0.2)
    assert parts["length1"] == parts["length2"] == pytest.approx(0.05)
    assert 0.1 <= info["jaccard"] <= 0.5 and parts["shared_vocabulary"] == pytest.approx(0.2)
    assert parts["no_repetition"] == pytest.approx(0.1)  # no repeated trigram
    assert reward == pytest.approx(1.0 - 0.3 / 3, abs=1e-6)


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


def test_default_weights_add_up_to_one_and_favour_the_keywords() -> None:
    assert sum(DEFAULT_WEIGHTS.values()) == pytest.approx(1.0)
    # The parts the pretrained model already satisfies (length, no loops) weigh least.
    assert DEFAULT_WEIGHTS["keywords1"] + DEFAULT_WEIGHTS["keywords2"] >= 0.5
    assert DEFAULT_WEIGHTS["length1"] + DEFAULT_WEIGHTS["length2"] <= 0.1


def test_one_more_keyword_is_worth_its_weight_over_three() -> None:
    base = "Once there was a girl. She went to a big place and looked at everything there."
    with_name = base.replace("a girl", "Lily")
    r0, _ = story_reward(base, "She was happy and went home to sleep in her bed.", KW)
    r1, _ = story_reward(with_name, "She was happy and went home to sleep in her bed.", KW)
    assert r1 - r0 == pytest.approx(DEFAULT_WEIGHTS["keywords1"] / 3, abs=1e-6)


def test_custom_weights_change_the_reward_and_are_checked() -> None:
    part1 = "Lily took her ball to the park. She threw the ball high and her dog ran after it."
    part2 = "Lily and the dog were tired. They sat under a tree in the park and ate a red apple."
    only_keywords = {
        "keywords1": 0.5,
        "keywords2": 0.5,
        "length1": 0,
        "length2": 0,
        "shared_vocabulary": 0,
        "no_repetition": 0,
    }
    reward, _ = story_reward(part1, part2, KW, weights=only_keywords)
    assert reward == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3, abs=1e-6)
    t = CoopStoryTask(weights=only_keywords)
    ex = {"keywords": KW}
    assert t.reward([[part1], [part2]], [ex]).rewards[0] == pytest.approx(reward)
    with pytest.raises(ValueError, match="unknown coop_story reward part 'keyword1'"):
        check_weights({"keyword1": 0.3})
    with pytest.raises(ValueError, match="add up to 1"):
        CoopStoryTask(weights={"keywords1": 0.9})
    with pytest.raises(ValueError, match="must be a number >= 0"):
        check_weights({"keywords1": -0.1, "keywords2": 0.7})
    with pytest.raises(ValueError, match="must be a number >= 0"):
        check_weights({"keywords1": "0.3"})  # type: ignore[dict-item]
