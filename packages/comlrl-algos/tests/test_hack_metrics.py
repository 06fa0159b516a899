"""metrics.jsonl counts the joint actions whose programs show reward-hacking signals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.environment import TaskEnvironment
from comlrl.algos.rollout.metrics import (
    merge_summaries,
    rollout_metrics,
    rollout_summary,
    summary_metrics,
)
from comlrl.algos.rollout.tree import rollout
from comlrl.core import Feedback, RewardBatch, SamplingParams, Task

EXAMPLES = [{"id": i} for i in range(3)]


class _FlaggingTask(Task):
    """Joint action ``k`` of a call is flagged ``eq_dunder`` when ``k % 2 == 0``, and also
    ``builtins`` when ``k % 3 == 0``; ``report`` False leaves the key out of the infos."""

    name = "flagging"

    def __init__(self, report: bool = True) -> None:
        self.report = report

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        return list(EXAMPLES)

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[str]:
        return [f"def f{example['id']}(x):", f"def g{example['id']}(x):"]

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        infos: list[dict[str, Any]] = []
        for k in range(len(examples)):
            signals = [s for s, hit in (("eq_dunder", k % 2 == 0), ("builtins", k % 3 == 0)) if hit]
            infos.append({"hack_signals": signals} if self.report else {})
        return RewardBatch([0.0] * len(examples), infos)


@pytest.fixture
def agents(tiny_tokenizer):  # type: ignore[no-untyped-def]
    out = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer, name=f"a{i}")
        for i in range(2)
    ]
    for i, a in enumerate(out):
        a.seed(i)
    return out


def test_flagged_joint_actions_are_counted_per_signal(agents) -> None:  # type: ignore[no-untyped-def]
    ro = rollout(
        agents, EXAMPLES, TaskEnvironment(_FlaggingTask()), SamplingParams(2, max_new_tokens=3)
    )
    row = rollout_metrics(ro)
    # 6 joint actions scored in one call, k = 0..5: eq_dunder at 0, 2, 4; builtins at 0, 3
    assert row["num_joint_actions"] == 6.0
    assert row["hack_signals/count"] == 4.0  # k = 0, 2, 3, 4
    assert row["hack_signals/fraction"] == pytest.approx(4 / 6)
    assert row["hack_signals/eq_dunder"] == 3.0 and row["hack_signals/builtins"] == 2.0
    # ranks' summaries add up
    merged = summary_metrics(merge_summaries([rollout_summary(ro), rollout_summary(ro)]))
    assert merged["hack_signals/count"] == 8.0 and merged["hack_signals/builtins"] == 4.0


def test_tasks_without_the_signals_log_no_hack_keys(agents) -> None:  # type: ignore[no-untyped-def]
    ro = rollout(
        agents,
        EXAMPLES,
        TaskEnvironment(_FlaggingTask(report=False)),
        SamplingParams(2, max_new_tokens=3),
    )
    assert not [k for k in rollout_metrics(ro) if k.startswith("hack_signals")]
