"""The tldr and arxiv suites: level rewards (hand-checked), range, local files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comlrl.core import ChatPrompt, chat_messages, get_task, prompt_text
from comlrl.envs import ArxivTask, TldrTask
from comlrl.envs.writing import (
    ARXIV_SPEC,
    TLDR_SPEC,
    band_score,
    content_jaccard,
    transition_categories,
    writing_reward,
)
from hypothesis import given
from hypothesis import strategies as st


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_band_score() -> None:
    assert band_score(2.0, (1.6, 3.2), (1.1, 5.0)) == 1.0
    assert band_score(1.35, (1.6, 3.2), (1.1, 5.0)) == pytest.approx(0.5)
    assert band_score(4.1, (1.6, 3.2), (1.1, 5.0)) == pytest.approx(0.5)
    assert band_score(6.0, (1.6, 3.2), (1.1, 5.0)) == 0.0
    assert band_score(10.0, (2.0, float("inf")), (1.3, float("inf"))) == 1.0


def test_transitions_match_whole_words_only() -> None:
    assert transition_categories("It also rained. However, we went out.") == {
        "addition",
        "contrast",
    }
    assert transition_categories("Also") == {"addition"}
    assert transition_categories("thesis soap") == set()  # no "so"/"as" inside words


def test_content_jaccard_ignores_stopwords() -> None:
    assert content_jaccard("the cat and the dog", "a cat with a bird") == pytest.approx(1 / 3)
    assert content_jaccard("", "") == 0.0


def test_tldr_level_one_fails_on_short_parts() -> None:
    reward, info = writing_reward("too short", words(20), TLDR_SPEC)
    assert reward == 0.0 and info["level_reached"] == 0


def test_tldr_stops_after_level_one_when_the_ratio_is_off() -> None:
    reward, info = writing_reward(words(10), words(10), TLDR_SPEC)  # ratio 1.0 < 1.1
    assert info["level_reached"] == 1 and reward == pytest.approx(0.5 / 3, abs=1e-6)


def test_tldr_hand_checked_full_score() -> None:
    part1 = "cat dog sun moon tree lake hill road"  # 8 words
    part2 = (
        "cat runs fast however dog sleeps and therefore sun shines while moon rises over "
        "the old tree near a lake"
    )
    reward, info = writing_reward(part1, part2, TLDR_SPEC)
    # level 2: length ratio inside 1.6-3.2; level 3: unique ratio >= 2
    assert 1.6 <= info["length_ratio"] <= 3.2 and info["unique_ratio"] >= 2.0
    assert info["transition_categories"] == ["cause", "contrast"]
    transitions = 0.4 + 0.05  # two categories
    overlap = min(info["jaccard"], 0.03) / 0.03
    assert overlap == 1.0
    assert reward == pytest.approx(
        (0.5 + 1.0 + 0.5 + 0.4 * transitions + 0.6 * overlap) / 3, abs=1e-6
    )


def test_arxiv_hand_checked_partial() -> None:
    part1 = words(130)
    part2 = words(130, "v") + " furthermore"  # ratio ~ 1.02: in the ramp 0.8-1.3
    reward, info = writing_reward(part1, part2, ARXIV_SPEC)
    ratio = len(part2) / len(part1)
    level2 = (ratio - 0.8) / 0.5
    assert info["level_reached"] == 4
    assert info["jaccard"] == 0.0 and info["transition_categories"] == ["addition"]
    assert reward == pytest.approx((0.5 + level2 + 0.5 + 0.4 * 0.4) / 3, abs=1e-6)


@given(st.text(max_size=300), st.text(max_size=600))
def test_rewards_are_in_unit_interval(a: str, b: str) -> None:
    for spec in (TLDR_SPEC, ARXIV_SPEC):
        assert 0.0 <= writing_reward(a, b, spec)[0] <= 1.0


def test_local_directory_and_file(tmp_path: Path) -> None:
    rows = [
        {"prompt": f"SUBREDDIT: r/x\nPOST: post {i}\nTL;DR:", "completion": "c"} for i in range(5)
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:4]))
    (tmp_path / "validation.jsonl").write_text(json.dumps(rows[4]))
    t = TldrTask(path=tmp_path)
    assert len(t.load("train")) == 4 and len(t.load("test")) == 1
    p1, p2 = map(prompt_text, t.prompts(t.load("test")[0]))
    assert "post 4" in p1 and "post 4" in p2 and p1 != p2
    batch = t.reward([["a b c d e f g h"], [words(30)]], t.load("test"))
    assert 0 < batch.rewards[0] <= 1 and batch.infos[0]["level_reached"] >= 1
    single = tmp_path / "arxiv.json"
    single.write_text(json.dumps([{"abstract_text": f"abstract {i}"} for i in range(10)]))
    a = get_task("arxiv", path=single)
    assert isinstance(a, ArxivTask)
    assert [r["abstract_text"] for r in a.load("test")] == ["abstract 8", "abstract 9"]
    assert not {r["abstract_text"] for r in a.load("train")} & {"abstract 8", "abstract 9"}


@pytest.mark.parametrize(
    ("cls", "raw_ends", "parts"),
    [
        (TldrTask, ("Summary:", "Detailed summary:"), ("a concise summary", "a detailed summary")),
        (
            ArxivTask,
            ("Introduction:", "Introduction (continued):"),
            ("the background and the motivation;", "the method and its implications;"),
        ),
    ],
)
def test_prompts_chat_and_raw(cls: type, raw_ends: tuple[str, str], parts: tuple[str, str]) -> None:
    task = cls()
    prompts = task.prompts({task.field: "  The cat sat on the mat.  "})
    for prompt, end, part in zip(prompts, raw_ends, parts, strict=True):
        assert isinstance(prompt, ChatPrompt)
        system, user = chat_messages(prompt)
        assert system["role"] == "system" and f"You write {part}" in system["content"]
        assert "\nThe cat sat on the mat.\n" in user["content"]
        assert prompt_text(prompt).endswith(end) and "The cat sat on the mat." in prompt_text(
            prompt
        )


def test_rows_with_split_field_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "all.jsonl"
    rows = [{"abstract_text": "x", "split": "train"}, {"abstract_text": "y", "split": "val"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert [r["abstract_text"] for r in ArxivTask(path=path).load("test")] == ["y"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "no abstract field"}))
    with pytest.raises(ValueError, match="abstract_text"):
        ArxivTask(path=bad).load("train")
    with pytest.raises(FileNotFoundError, match="path="):
        TldrTask(path=tmp_path / "nope").load("train")
