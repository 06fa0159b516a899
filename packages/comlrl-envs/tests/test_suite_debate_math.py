"""debate_math: feedback content for 2 and 3 agents, prompts across rounds, the reward modes,
an episode with 3 scripted agents (with and without the tool), and the gsm8k level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from comlrl.core import ChatPrompt, JointAction, get_task, get_tool_format, run_tool_call
from comlrl.envs import DebateMathTask
from comlrl.envs.math.tool_math import EXAMPLE_REPLY_PLAIN

SHARED_GSM8K = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "gsm8k_test.jsonl"


def _task(**kw: Any) -> tuple[DebateMathTask, dict[str, Any]]:
    task = DebateMathTask("mul", num_train=5, num_eval=5, **kw)
    return task, task.load("test")[0]


def _turn(task: DebateMathTask, ex: dict[str, Any], texts: list[str], turn: int) -> Any:
    batch = task.reward([[t] for t in texts], [ex])
    fb = task.feedback(
        ex, JointAction(tuple(range(len(texts))), tuple(texts)), batch.infos[0], turn
    )
    return batch, fb


def test_two_agents_each_see_the_other_and_not_themselves() -> None:
    task, ex = _task(num_agents=2)
    texts = ["I multiply.\nAnswer: 111", "Python says so.\nAnswer: 222"]
    _, fb = _turn(task, ex, texts, 0)
    assert len(fb.texts) == 2
    assert "Agent 2:" in fb.texts[0] and "Answer: 222" in fb.texts[0]
    assert "Agent 2's answer: 222" in fb.texts[0]
    assert "Agent 1" not in fb.texts[0] and "111" not in fb.texts[0]
    assert "Agent 1's answer: 111" in fb.texts[1] and "222" not in fb.texts[1]
    assert not fb.done  # rounds=1: one debate turn follows the first answers ...
    assert _turn(task, ex, texts, 1)[1].done  # ... and the episode ends after it
    assert fb.info["completions"] == tuple(texts)


def test_three_agents_each_see_both_others() -> None:
    task, ex = _task(num_agents=3, rounds=2)
    texts = ["Answer: 1", "no idea", "Answer: 3"]
    _, fb = _turn(task, ex, texts, 0)
    assert not fb.done
    for agent, text in enumerate(fb.texts):
        others = [o for o in range(3) if o != agent]
        assert all(f"Agent {o + 1}:" in text for o in others)
        assert f"Agent {agent + 1}:" not in text
        assert "round 1" in text and 'End with a line "Answer: <integer>".' in text
    assert "Agent 2's answer: no answer" in fb.texts[0]


def test_one_agent_reflects_on_its_own_answer() -> None:
    task, ex = _task(num_agents=1)
    _, fb = _turn(task, ex, ["Answer: 5"], 0)
    assert fb.texts[0].startswith("Your answer in round 1 was: 5.")


def test_long_solutions_are_cut_in_the_feedback() -> None:
    task, ex = _task(num_agents=2, max_shown_chars=50)
    _, fb = _turn(task, ex, ["a", "x" * 5000 + "\nAnswer: 9"], 0)
    assert "x" * 51 not in fb.texts[0] and "[...]" in fb.texts[0]
    assert "Agent 2's answer: 9" in fb.texts[0]


def test_later_prompts_continue_each_agents_conversation() -> None:
    task, ex = _task(num_agents=3, rounds=2, example=False)
    texts = ["Answer: 1", "Answer: 2", "Answer: 3"]
    _, fb0 = _turn(task, ex, texts, 0)
    _, fb1 = _turn(task, ex, ["Answer: 4", "Answer: 5", "Answer: 6"], 1)
    prompts = task.prompts(ex, [fb0, fb1])
    for agent, prompt in enumerate(prompts):
        assert isinstance(prompt, ChatPrompt)
        roles = [m["role"] for m in prompt.messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
        assert prompt.messages[2]["content"] == texts[agent]
        assert prompt.messages[3]["content"] == fb0.texts[agent]
        assert prompt.messages[5]["content"] == fb1.texts[agent]
        assert prompt.raw is not None and fb1.texts[agent] in prompt.raw
        assert ex["question"] in prompt.messages[1]["content"]


@pytest.mark.parametrize(
    ("mode", "right", "expected"),
    [
        ("all", 3, 1.0),
        ("all", 2, 0.0),
        ("majority", 2, 1.0),
        ("majority", 1, 0.0),
    ],
)
def test_reward_modes_on_three_agents(mode: str, right: int, expected: float) -> None:
    task, ex = _task(num_agents=3, reward_mode=mode)
    texts = [f"Answer: {ex['gold']}"] * right + ["Answer: 0"] * (3 - right)
    batch = task.reward([[t] for t in texts], [ex])
    assert batch.rewards == [expected]
    info = batch.infos[0]
    assert info["agent_rewards"] == [1.0] * right + [0.0] * (3 - right)
    assert info["num_correct"] == right
    assert info["majority_answer"] == (
        int(ex["gold"]) if right >= 2 else (0 if right <= 1 else None)
    )


def test_majority_of_two_needs_both() -> None:
    task, ex = _task(num_agents=2, reward_mode="majority")
    one = task.reward([[f"Answer: {ex['gold']}"], ["Answer: 0"]], [ex])
    assert one.rewards == [0.0] and one.infos[0]["majority_answer"] is None


def test_a_fake_output_block_is_not_an_answer() -> None:
    task, ex = _task(num_agents=2)
    fake = f"```output\n{ex['gold']}\n```\nAnswer: {ex['gold']}"
    only_fake = f"```output\nAnswer: {ex['gold']}\n```"
    batch = task.reward([[fake], [only_fake]], [ex])
    assert batch.infos[0]["correct"] == [True, False]
    assert batch.rewards == [0.0]


def test_the_worked_example_opens_each_conversation() -> None:
    task, ex = _task(num_agents=2, rounds=1)
    _, fb0 = _turn(task, ex, ["Answer: 1", "Answer: 2"], 0)
    for prompt in task.prompts(ex, [fb0]):
        assert isinstance(prompt, ChatPrompt)
        roles = [m["role"] for m in prompt.messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
        assert prompt.messages[2]["content"] == EXAMPLE_REPLY_PLAIN
        assert ex["question"] in prompt.messages[3]["content"]


def test_tools_only_with_use_tool() -> None:
    assert _task()[0].tools(0) == ()
    task, ex = _task(use_tool=True)
    assert [t.name for t in task.tools(2)] == ["python"]
    assert "Python tool" in task.prompts(ex)[0].messages[1]["content"]  # type: ignore[union-attr]


@pytest.mark.parametrize("use_tool", [False, True])
def test_three_agent_episode_end_to_end(use_tool: bool) -> None:
    """Two rounds of debate with three scripted agents: agent 3 is wrong at first, reads
    the others' answers and fixes its own; with the tool, agent 1's code runs in the
    sandbox and its observation stays out of the text the reward reads."""
    task = get_task(
        "debate_math", num_agents=3, rounds=1, num_train=4, num_eval=4, use_tool=use_tool
    )
    assert task.max_turns == 2
    ex = task.load("train")[0]
    a, b = (int(x) for x in ex["expressions"][0].split(" * "))
    c, d = (int(x) for x in ex["expressions"][1].split(" * "))
    gold = ex["gold"]
    first = [f"Answer: {gold}", f"{a * b} + {c * d}\nAnswer: {gold}", "Answer: 12"]
    if use_tool:
        fmt = get_tool_format(task.tool_format)
        call = f"```python\nprint({a} * {b} + {c} * {d})\n```"
        result = run_tool_call({t.name: t for t in task.tools(0)}, fmt, call)
        assert result.error is None and result.content == gold
        first[0] = f"{call}\nAnswer: {gold}"  # the model's own text: no observation in it
    history = []
    prompts = task.prompts(ex, history)
    assert len(prompts) == 3
    batch0, fb0 = _turn(task, ex, first, 0)
    assert batch0.rewards == [0.0] and batch0.infos[0]["correct"] == [True, True, False]
    history.append(fb0)
    prompts = task.prompts(ex, history)
    assert f"Agent 1's answer: {gold}" in prompts[2].messages[-1]["content"]  # type: ignore[union-attr]
    final = [f"Answer: {gold}", f"Answer: {gold}", f"I had it wrong.\nAnswer: {gold}"]
    batch1, fb1 = _turn(task, ex, final, 1)
    assert batch1.rewards == [1.0] and batch1.infos[0]["agree"]
    assert batch1.infos[0]["agent_rewards"] == [1.0, 1.0, 1.0]
    assert fb1.done


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_agents": 4}, "num_agents"),
        ({"rounds": -1}, "rounds"),
        ({"reward_mode": "any"}, "reward_mode"),
        ({"level": "x"}, "level"),
    ],
)
def test_bad_options_fail_with_the_value(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DebateMathTask(**kwargs)


def test_gsm8k_level_on_the_real_file() -> None:
    if not SHARED_GSM8K.is_file():
        pytest.skip(f"GSM8K test file not found at {SHARED_GSM8K} (no ../shared beside the repo)")
    task = DebateMathTask("gsm8k", gsm8k_path=str(SHARED_GSM8K), num_train=10, num_eval=10)
    ex = task.load("test")[3]
    prompts = task.prompts(ex)
    assert all("Answer: <number>" in p.messages[1]["content"] for p in prompts)  # type: ignore[union-attr]
    batch = task.reward([[f"Answer: {ex['gold']}"]] * 3, [ex])
    assert batch.rewards == [1.0]
