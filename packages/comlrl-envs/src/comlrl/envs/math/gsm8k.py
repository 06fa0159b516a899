"""Cooperative GSM8K (``gsm8k``): two solvers that must agree on the right answer.

GSM8K (Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems", MIT) holds
grade-school word problems whose ``answer`` field ends with ``#### <number>``.

Why two solvers and not solver + checker: the agents act at the same time and do not see
each other's completion within a turn (decentralized execution), so a checker could not
check anything in a single-turn task. Instead the two agents solve the problem in two
different styles, and the reward pays for each correct answer and, most, for the two
reaching the right answer together: the team's answer is trusted when they agree.

- agent 1 (``reasoner``): step-by-step reasoning in words, final answer after ``####``;
- agent 2 (``calculator``): the computation as short arithmetic, final answer after
  ``####``.

Answers are parsed with :func:`comlrl.envs.math.answer.extract_answer` (``\\boxed{}``,
``#### N``, "the answer is N", else the last number; commas, ``$``, units handled) and
compared exactly (:func:`comlrl.envs.math.answer.answers_match`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.core import ChatPrompt, Feedback, Prompt, RewardBatch, Task
from comlrl.envs.math.answer import answers_match, extract_answer, gold_answer
from comlrl.envs.writing._files import hub_rows, rows_for_split

__all__ = ["Gsm8kTask"]

_REASONER = """\
Solve the math word problem. Reason step by step, then write the final answer as a number
on its own line after "####".
A teammate solves the same problem separately; your team is right when you both are.

Question: {question}
Answer:"""

_CALCULATOR = """\
Solve the math word problem by writing the calculation as short arithmetic (one step per
line), then write the final answer as a number on its own line after "####".
A teammate solves the same problem separately; your team is right when you both are.

Question: {question}
Calculation:"""

_CHAT_ROLES = (
    (
        "You are agent 1 in a team of two solving a math word problem. You explain your "
        "reasoning step by step in words; a teammate solves the same problem separately.",
        "Reason step by step",
    ),
    (
        "You are agent 2 in a team of two solving a math word problem. You write the "
        "calculation as short arithmetic, one step per line; a teammate solves the same "
        "problem separately.",
        "Write the calculation as short arithmetic, one step per line",
    ),
)
_CHAT_USER = (
    "{question}\n\n{how}. Then write the final answer as a number on the last line, after "
    '"####" (for example: #### 42).'
)


class Gsm8kTask(Task):
    """Two-agent GSM8K: a step-by-step reasoner and a terse calculator that must agree.

    Reward of one joint action, in ``[0, 1]``:

    =====  =============================================================================
    0.05   agent 1's completion holds a parseable answer
    0.05   agent 2's completion holds a parseable answer
    0.30   agent 1's answer equals the reference (exact value)
    0.30   agent 2's answer equals the reference
    0.30   both answers equal the reference (the team agrees on the right answer)
    =====  =============================================================================

    So: no answers 0; two wrong answers (agreeing or not) 0.1; one right 0.4; both right
    1.0. Infos carry ``answers`` (the two parsed answer texts), ``correct`` (two bools),
    ``agree``, ``gold`` and ``reward_parts``.

    Data: ``path=`` a local file in GSM8K's schema (``question``, ``answer`` ending with
    ``#### N``; e.g. ``gsm8k_test.jsonl``) or a directory with ``train.jsonl`` and
    ``test.jsonl``. Splits (disjoint): a directory gives GSM8K's own train (7473) and test
    (1319) files; a single file is split by index (the last fifth ``test``, the rest
    ``train``) unless its rows carry a ``split`` field. Without ``path`` the Hugging Face
    dataset ``openai/gsm8k`` (config ``main``) is loaded when ``datasets`` is installed.

    Args:
        path: local file or directory (see above).
        limit: keep at most this many rows per split.

    Raises:
        ValueError: for a negative ``limit``.
    """

    name = "gsm8k"
    num_agents = 2
    max_turns = 1
    #: Where the examples come from (``comlrl tasks`` prints it).
    data_source = (
        "no copy ships: task.kwargs.path=<GSM8K .jsonl/.json or folder>, else the Hub's "
        "openai/gsm8k (needs `datasets` and the network)"
    )

    def __init__(self, path: str | Path | None = None, *, limit: int | None = None) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        self.path = path
        self.limit = limit

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        """Rows of ``split`` (``"train"`` or ``"test"``), each with an added ``gold`` answer.

        Raises:
            ValueError: for an unknown split, or a row without ``question``/``answer``.
            FileNotFoundError: when the data cannot be found (the message names ``path=``).
        """
        names = {"train": ("train", "gsm8k_train"), "test": ("test", "gsm8k_test")}
        if split not in names:
            raise ValueError(f"unknown split {split!r}; gsm8k has 'train' and 'test'")
        if self.path is not None:
            rows = rows_for_split(self.path, split, names, what="gsm8k")
        else:
            rows = hub_rows("openai/gsm8k", split, "main")
        out = []
        for i, row in enumerate(rows):
            if "question" not in row or "answer" not in row:
                raise ValueError(
                    f"gsm8k row {i} of split {split!r} lacks 'question' or 'answer'; "
                    "need GSM8K's schema"
                )
            out.append({**row, "gold": gold_answer(str(row["answer"]))})
        return out[: self.limit] if self.limit is not None else out

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """``[reasoner_prompt, calculator_prompt]`` (single-turn: ``history`` unused).

        Chat form: a system message with the agent's style (step-by-step reasoning / short
        arithmetic) and a user message with the question and the answer format (the final
        number after ``####`` on the last line). ``raw``: the completion-style text ending
        in ``Answer:`` / ``Calculation:`` for base models.
        """
        question = str(example["question"]).strip()
        raws = (_REASONER.format(question=question), _CALCULATOR.format(question=question))
        return [
            ChatPrompt(
                (
                    {"role": "system", "content": system},
                    {"role": "user", "content": _CHAT_USER.format(question=question, how=how)},
                ),
                raw=raw,
            )
            for (system, how), raw in zip(_CHAT_ROLES, raws, strict=True)
        ]

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions (levels in the class docstring).

        Raises:
            ValueError: when the shapes disagree.
        """
        self.check_joint_batch(completions, examples)
        rewards, infos = [], []
        for i, ex in enumerate(examples):
            gold = ex.get("gold") or gold_answer(str(ex["answer"]))
            answers = [extract_answer(completions[a][i]) for a in range(2)]
            correct = [answers_match(ans, gold) for ans in answers]
            parts = {
                "agent1_answered": 0.05 if answers[0] is not None else 0.0,
                "agent2_answered": 0.05 if answers[1] is not None else 0.0,
                "agent1_correct": 0.3 if correct[0] else 0.0,
                "agent2_correct": 0.3 if correct[1] else 0.0,
                "agree_correct": 0.3 if all(correct) else 0.0,
            }
            rewards.append(round(sum(parts.values()), 6))
            infos.append(
                {
                    "answers": answers,
                    "correct": correct,
                    "agree": answers_match(answers[0], answers[1]),
                    "gold": gold,
                    "status": "passed" if all(correct) else "failed",
                    "reward_parts": parts,
                }
            )
        return RewardBatch(rewards, infos)
