from __future__ import annotations

import dataclasses
import json

import pytest
from comlrl.core import ChatPrompt, chat_messages, prompt_key, prompt_text
from hypothesis import given
from hypothesis import strategies as st

_text = st.text(max_size=40)
_message = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["system", "user", "assistant"]),
    _text,
)
_messages = st.lists(_message, min_size=0, max_size=5).map(
    lambda ms: [*ms, {"role": "user", "content": "go"}]
)
_prompts = st.one_of(
    _text, st.builds(ChatPrompt, _messages.map(tuple), st.one_of(st.none(), _text))
)


def test_system_and_user_prompt_helpers() -> None:
    p = ChatPrompt(
        ({"role": "system", "content": "You write aux."}, {"role": "user", "content": "Task"}),
        raw="def aux(",
    )
    assert prompt_text(p) == "def aux("
    assert chat_messages(p) == [
        {"role": "system", "content": "You write aux."},
        {"role": "user", "content": "Task"},
    ]
    assert json.loads(prompt_key(p)) == {"messages": chat_messages(p), "raw": "def aux("}
    plain = ChatPrompt(({"role": "system", "content": "A"}, {"role": "user", "content": "B"}))
    assert plain.text() == "A\n\nB"


def test_a_string_is_a_prompt_too() -> None:
    assert prompt_text("Once upon a time") == "Once upon a time"
    assert chat_messages("hi") == [{"role": "user", "content": "hi"}]
    assert prompt_key("hi") == "hi"


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ((), "at least one message"),
        ("hello", "sequence of"),
        (({"role": "robot", "content": "x"},), "unknown role 'robot'"),
        (({"role": "user", "content": 3},), "content must be a str, got int"),
        (({"role": "user"},), "exactly the keys"),
        (({"role": "user", "content": "x", "name": "n"},), "exactly the keys"),
        (("user: x",), "message 0 must be a mapping"),
        (
            ({"role": "user", "content": "q"}, {"role": "assistant", "content": "ans"}),
            "last message is the assistant's \\('ans'\\)",
        ),
    ],
)
def test_invalid_messages_are_refused_naming_the_value(messages: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ChatPrompt(messages)  # type: ignore[arg-type]


def test_raw_must_be_text() -> None:
    with pytest.raises(ValueError, match="raw must be a str or None, got int"):
        ChatPrompt(({"role": "user", "content": "x"},), raw=5)  # type: ignore[arg-type]


def test_helpers_refuse_other_types() -> None:
    for helper in (prompt_text, chat_messages, prompt_key):
        with pytest.raises(TypeError, match="got list"):
            helper(["a"])  # type: ignore[arg-type]


def test_messages_are_copied_and_frozen() -> None:
    given_messages = [{"role": "user", "content": "x"}]
    p = ChatPrompt(tuple(given_messages))
    given_messages[0]["content"] = "changed"
    assert p.messages[0]["content"] == "x"
    chat_messages(p)[0]["content"] = "changed too"
    assert p.messages[0]["content"] == "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.raw = "y"  # type: ignore[misc]


def test_continued_appends_the_answer_and_the_next_user_turn() -> None:
    p = ChatPrompt(({"role": "system", "content": "S"}, {"role": "user", "content": "U"}), "r")
    q = p.continued("my code", "feedback")
    assert [m["role"] for m in q.messages] == ["system", "user", "assistant", "user"]
    assert q.messages[2]["content"] == "my code" and q.raw is None
    with pytest.raises(ValueError, match="content must be a str"):
        p.continued(None, "x")  # type: ignore[arg-type]


@given(_prompts)
def test_chat_messages_always_end_with_a_non_assistant_turn(prompt: str | ChatPrompt) -> None:
    messages = chat_messages(prompt)
    assert messages and messages[-1]["role"] != "assistant"
    assert all(set(m) == {"role", "content"} for m in messages)
    assert isinstance(prompt_text(prompt), str)


@given(_prompts, _prompts)
def test_prompt_key_is_equal_exactly_when_the_prompts_are(
    a: str | ChatPrompt, b: str | ChatPrompt
) -> None:
    if type(a) is type(b):
        assert (prompt_key(a) == prompt_key(b)) == (a == b)
    if a == b:
        assert hash(a) == hash(b)


@given(_messages, st.one_of(st.none(), _text))
def test_chat_prompt_round_trips_through_its_key(messages: list, raw: str | None) -> None:
    p = ChatPrompt(tuple(messages), raw)
    payload = json.loads(prompt_key(p))
    assert ChatPrompt(tuple(payload["messages"]), payload.get("raw")) == p
    assert prompt_text(p) == (
        raw if raw is not None else "\n\n".join(m["content"] for m in messages)
    )


def test_chat_prompt_pickles_and_copies() -> None:
    import copy
    import pickle

    p = ChatPrompt(({"role": "user", "content": "x"},), raw="r")
    assert pickle.loads(pickle.dumps(p)) == p
    assert copy.deepcopy(p) == p and {p: 1}[copy.copy(p)] == 1
