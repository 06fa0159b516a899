"""1.4.3's callbacks as the comlrl.algos environment: every reward-function form,
``reward_processor``, formatters, and ``external_transition`` whose prompts go through the
formatters (comlrl.trainers.environment)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from comlrl.core import JointAction, RewardFunctionError
from comlrl.trainers.environment import CompatEnvironment, CompatReward, build_formatters

EXAMPLE = {"prompt": "Once", "id": 7}


def _score(func: Any, num_agents: int = 2, processor: Any = None, per_agent: bool = False) -> Any:
    reward = CompatReward(
        func, num_agents, lambda ex: "P:" + ex["prompt"], processor, per_agent=per_agent
    )
    completions = [["a", "bbb"], ["cc", "d"]][:num_agents]
    return reward(completions, [EXAMPLE, EXAMPLE])


def _ratio(c1: list[str], c2: list[str]) -> list[float]:
    return [len(b) / len(a) for a, b in zip(c1, c2)]


class _Callable:
    def __call__(self, c1: list[str], c2: list[str]) -> list[float]:
        return _ratio(c1, c2)


REWARD_FORMS: dict[str, Any] = {
    "per-agent lists": _ratio,
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
    "returns a tensor": lambda c1, c2: torch.tensor(_ratio(c1, c2), dtype=torch.float64),
    "returns a scalar": lambda c1, c2: len(c2[0]) / len(c1[0]),
    "callable object": _Callable(),
    "no readable signature": type("_NoSignature", (_Callable,), {"__signature__": "unreadable"})(),
}


@pytest.mark.parametrize("form", list(REWARD_FORMS))
def test_every_1_4_3_reward_form_scores_each_joint_action(form: str) -> None:
    # exact: ratios of small integers computed in float64 by the same expression
    assert _score(REWARD_FORMS[form]).rewards == [2.0, 1 / 3]


def test_reward_processor_is_applied_to_each_reward() -> None:
    assert _score(_ratio, processor=lambda r: 100.0 * r).rewards == [200.0, 100.0 * (1 / 3)]


def test_per_agent_rewards_keep_each_agents_value_and_score_their_mean() -> None:
    batch = _score(lambda c1, c2: [1.0, 3.0], per_agent=True, processor=lambda r: 2 * r)
    assert batch.rewards == [4.0, 4.0]
    assert [info["agent_rewards"] for info in batch.infos] == [[2.0, 6.0], [2.0, 6.0]]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_reward_raises_instead_of_being_replaced(bad: float) -> None:
    with pytest.raises(RewardFunctionError, match="not finite"):
        _score(lambda c1, c2: [bad])


def test_a_reward_function_error_names_the_joint_action() -> None:
    def broken(c1: list[str], c2: list[str]) -> list[float]:
        raise KeyError("label")

    with pytest.raises(RewardFunctionError, match="raised KeyError") as info:
        _score(broken)
    assert info.value.completions == ("a", "cc")


def test_formatters_none_one_or_one_per_agent() -> None:
    assert [f(EXAMPLE) for f in build_formatters(None, 2)] == ["Once", "Once"]
    assert [f(EXAMPLE) for f in build_formatters(lambda ex: ex["prompt"] + "!", 2)] == ["Once!"] * 2
    two = build_formatters(
        [lambda ex: "A", lambda ex, external_prompts=None: external_prompts or "B"], 2
    )
    assert [f(EXAMPLE) for f in two] == ["A", "B"]
    assert [f(EXAMPLE, external_prompts="X") for f in two] == ["A", "X"]
    with pytest.raises(ValueError, match="got 3 formatters for num_agents=2"):
        build_formatters([str, str, str], 2)


@pytest.mark.parametrize("passthrough", [False, True])
def test_transition_gets_1_4_3s_arguments_and_its_prompts_go_through_the_formatters(
    passthrough: bool,
) -> None:
    seen: dict[str, Any] = {}

    def transition(**kwargs: Any) -> list[str]:
        seen.update(kwargs)
        return [f"next-{i}" for i in range(kwargs["num_agents"])]

    formatters = build_formatters(
        [lambda ex: "T0:" + ex["prompt"], lambda ex: f"[{ex['prompt']}|{ex['id']}]"], 2
    )
    env = CompatEnvironment(
        formatters, CompatReward(_ratio, 2, formatters[0]), transition, passthrough
    )
    root = env.root(EXAMPLE)
    assert root.prompts == ("T0:Once", "[Once|7]")
    child, _ = env.step(EXAMPLE, root, JointAction((0, 0), ("x", "y")), {}, 0)
    assert seen == {
        "prompt": "Once",
        "agent_completions": ["x", "y"],
        "num_agents": 2,
        "prompt_history_per_agent": [["T0:Once"], ["[Once|7]"]],
        "response_history_per_agent": [["x"], ["y"]],
    }
    # without passthrough the formatter sees the example with the external prompt as "prompt"
    assert child.prompts == (("next-0", "next-1") if passthrough else ("T0:next-0", "[next-1|7]"))
