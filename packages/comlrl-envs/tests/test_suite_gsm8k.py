"""The gsm8k suite: answer parsing (hand cases and properties), reward levels, loading."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from comlrl.core import ChatPrompt, chat_messages, get_task, prompt_text
from comlrl.envs import Gsm8kTask
from comlrl.envs.math import answers_match, extract_answer, gold_answer, normalize_number
from hypothesis import given
from hypothesis import strategies as st

SHARED_GSM8K = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "gsm8k_test.jsonl"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("She pays 2 + 3 = 5 dollars.\n#### 5", 5),
        ("#### 1,234", 1234),
        ("The answer is $1,234.50.", Fraction(2469, 2)),
        ("so the total is \\boxed{18} apples", 18),
        ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
        ("\\boxed{1{,}000}", 1000),
        ("It is -$5", -5),
        ("x = 3/4 of it", Fraction(3, 4)),
        ("Final answer: 42 km/h", 42),
        ("12 + 30 = 42\nThen we get 7 cookies left", 7),
        ("\\boxed{x} but #### 9", 9),
        ("#### 0.5", Fraction(1, 2)),
    ],
)
def test_answer_parsing_hand_cases(text: str, value: Fraction) -> None:
    assert normalize_number(extract_answer(text)) == value


def test_no_number_means_no_answer() -> None:
    assert extract_answer("I do not know.") is None and extract_answer("") is None
    assert normalize_number("none") is None
    assert not answers_match(None, "5") and not answers_match("five", "5")


def test_boxed_beats_hashes_beats_last_number() -> None:
    assert normalize_number(extract_answer("#### 3 and \\boxed{4} then 5")) == 4
    assert normalize_number(extract_answer("#### 3 then 5")) == 3
    assert normalize_number(extract_answer("the answer is 3, not 5")) == 3


def test_gold_answer() -> None:
    assert gold_answer("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18") == "18"
    with pytest.raises(ValueError, match="####"):
        gold_answer("no final line")


@given(st.integers(min_value=-(10**9), max_value=10**9))
def test_formats_of_one_integer_all_match(n: int) -> None:
    grouped = f"{n:,}"
    for text in (
        f"#### {grouped}",
        f"\\boxed{{{n}}}",
        f"The answer is {grouped} apples.",
        f"{n}.00",
    ):
        assert answers_match(extract_answer(text), str(n)), text
    assert not answers_match(extract_answer(f"#### {n + 1}"), str(n))


@given(st.text(max_size=60))
def test_parser_never_raises(text: str) -> None:
    value = normalize_number(extract_answer(text))
    assert value is None or isinstance(value, Fraction)


EX = {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"}


@pytest.mark.parametrize(
    ("a1", "a2", "reward"),
    [
        ("2 + 3 = 5\n#### 5", "2+3\n#### 5", 1.0),
        ("#### 5", "#### 6", 0.4),
        ("#### 4", "#### 4", 0.1),
        ("#### 4", "no idea", 0.05),
        ("", "", 0.0),
        ("\\boxed{5}", "The answer is 5.", 1.0),
    ],
)
def test_reward_levels(a1: str, a2: str, reward: float) -> None:
    batch = Gsm8kTask(path="unused").reward([[a1], [a2]], [dict(EX, gold="5")])
    assert batch.rewards[0] == pytest.approx(reward)
    assert batch.infos[0]["gold"] == "5"


@given(st.text(max_size=40), st.text(max_size=40))
def test_reward_in_unit_interval(a1: str, a2: str) -> None:
    r = Gsm8kTask(path="unused").reward([[a1], [a2]], [EX]).rewards[0]
    assert 0.0 <= r <= 1.0


def test_local_file_splits_and_errors(tmp_path: Path) -> None:
    rows = [dict(EX, answer=f"#### {i}") for i in range(10)]
    path = tmp_path / "g.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    t = Gsm8kTask(path=path)
    train, test = t.load("train"), t.load("test")
    assert [r["gold"] for r in train] == [str(i) for i in range(8)]
    assert [r["gold"] for r in test] == ["8", "9"]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.jsonl").write_text(json.dumps(rows[0]))
    assert len(Gsm8kTask(path=tmp_path / "d").load("train")) == 1
    with pytest.raises(FileNotFoundError, match="test"):
        Gsm8kTask(path=tmp_path / "d").load("test")
    with pytest.raises(FileNotFoundError, match="path="):
        Gsm8kTask(path=tmp_path / "missing.jsonl").load("train")
    with pytest.raises(ValueError, match="unknown split"):
        t.load("dev")


def test_real_gsm8k_file_parses() -> None:
    if not SHARED_GSM8K.is_file():
        pytest.skip(f"offline data file {SHARED_GSM8K} not found")
    t = get_task("gsm8k", path=SHARED_GSM8K)
    train, test = t.load("train"), t.load("test")
    assert (len(train), len(test)) == (1056, 263)
    batch = t.reward([[r["answer"] for r in test], [f"#### {r['gold']}" for r in test]], test)
    assert batch.rewards == [1.0] * len(test)


def test_prompts_chat_and_raw() -> None:
    row = {"question": "  Tom has 3 apples and buys 4. How many now? ", "answer": "#### 7"}
    reasoner, calculator = Gsm8kTask().prompts(row)
    for prompt, style in ((reasoner, "step by step"), (calculator, "short arithmetic")):
        assert isinstance(prompt, ChatPrompt)
        system, user = chat_messages(prompt)
        assert system["role"] == "system" and style in system["content"]
        assert user["content"].startswith("Tom has 3 apples and buys 4. How many now?\n")
        assert '"####"' in user["content"]
    # base models see the completion-style texts
    assert prompt_text(reasoner).endswith(
        "Question: Tom has 3 apples and buys 4. How many now?\nAnswer:"
    )
    assert prompt_text(calculator).endswith("How many now?\nCalculation:")
