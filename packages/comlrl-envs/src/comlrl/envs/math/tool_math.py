"""Arithmetic with a Python tool, split between two agents (``tool_math``).

Each problem (:mod:`comlrl.envs.math.problem_sets`) is a sum of two sub-problems:
``a * b + c * d`` (``mul``), ``(E1) + (E2)`` (``expr``), two people's counts of items
(``word``). With two agents:

- agent 0 computes the first part, agent 1 the second; both see the whole problem, their
  own part and that the team's answer is the sum of their two answers;
- each may run code with the sandboxed Python tool (:func:`comlrl.envs.tools.python_tool`)
  inside its turn, then ends with a line ``Answer: <integer>``;
- the team's answer is the sum of the two ``Answer:`` values, and the team is right when
  each agent's answer is its own part (so the sum is right too).

Why this split: the parts are independent, so the two agents can work at the same time
without seeing each other (decentralized execution), yet the joint reward depends on both:
the team is scored on both parts, so it is right only when both agents are. (Scored on the
sum alone, an agent 0 that answers the whole problem and an agent 1 that answers 0 would
earn the team's reward with neither part right: a free rider.) Each
agent's own part also gives it a reward of its own for the actor-critic recipes
(``infos[k]["agent_rewards"]``).

GSM8K problems do not split into parts, so at the ``gsm8k`` level both agents solve the
whole problem and the joint reward is the mean of their two exact answers (1.0 only when
both are right): each agent's mistake costs the team.

With one agent (``num_agents=1``, the baseline), the agent solves the whole problem.

The reward reads only the ``Answer:`` lines of each agent's own text
(:func:`comlrl.envs.math.answer.answer_line`; fenced blocks ignored): a tool's result is
never in that text, and an ``output`` block the model writes itself is not an answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from comlrl.core import ChatPrompt, Feedback, Prompt, RewardBatch, Task, Tool
from comlrl.envs.math.answer import answer_line, normalize_number
from comlrl.envs.math.problem_sets import ALL_LEVELS, check_digits, load_problems
from comlrl.envs.math.worked_examples import example_level, worked_example_messages
from comlrl.envs.tools.python import python_tool

__all__ = ["MathProblemTask", "ToolMathTask", "answer_request", "value_json"]


def answer_request(use_tool: bool, what: str = "it", number: str = "integer") -> str:
    """The instruction that ends every ``tool_math`` / ``debate_math`` prompt."""
    how = f"Use the Python tool to compute {what}" if use_tool else f"Compute {what}"
    return f'{how}, then end with a line "Answer: <{number}>".'


#: The worked exchange that opens every prompt with ``example=True``: one call of the
#: Python tool in the fenced-block format (:class:`comlrl.core.PythonBlockFormat`), its
#: output, and the answer line; without the tool, the same sum worked by hand.
EXAMPLE_QUESTION = "Compute 12 * 34."
EXAMPLE_REPLY_TOOL = "```python\nprint(12 * 34)\n```\n```output\n408\n```\nAnswer: 408"
EXAMPLE_REPLY_PLAIN = "12 * 34 = 408\nAnswer: 408"


def example_messages(use_tool: bool, number: str = "integer") -> list[dict[str, str]]:
    """The worked example as a user and an assistant message (see :data:`EXAMPLE_QUESTION`)."""
    return [
        {
            "role": "user",
            "content": f"{EXAMPLE_QUESTION}\n{answer_request(use_tool, 'it', number)}",
        },
        {"role": "assistant", "content": EXAMPLE_REPLY_TOOL if use_tool else EXAMPLE_REPLY_PLAIN},
    ]


def value_json(value: Fraction | None) -> int | str | None:
    """A parsed answer for infos: an ``int`` when whole, else ``"p/q"``, ``None`` if none."""
    if value is None:
        return None
    return int(value) if value.denominator == 1 else str(value)


class MathProblemTask(Task):
    """What ``tool_math`` and ``debate_math`` share: their problems
    (:func:`~comlrl.envs.math.problem_sets.load_problems` of ``level``) and the sandboxed
    Python tool every agent gets when ``use_tool`` is set. Subclasses set the attributes
    below in ``__init__``."""

    level: str
    seed: int
    num_train: int
    num_eval: int
    digits: tuple[int, int]
    ops: int
    gsm8k_path: str | Path | None
    use_tool: bool
    _tool: Tool

    def tools(self, agent: int) -> Sequence[Tool]:
        """``(python_tool,)`` for every agent, ``()`` when ``use_tool=False``."""
        return (self._tool,) if self.use_tool else ()

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        """The examples of ``split`` (``"train"``, ``"test"``/``"eval"``); see
        :func:`~comlrl.envs.math.problem_sets.load_problems`.

        Raises:
            ValueError: an unknown split, or too few distinct problems.
            FileNotFoundError: ``gsm8k_path`` does not exist.
        """
        return load_problems(
            self.level,
            split,
            seed=self.seed,
            num_train=self.num_train,
            num_eval=self.num_eval,
            digits=self.digits,
            ops=self.ops,
            gsm8k_path=self.gsm8k_path,
        )


class ToolMathTask(MathProblemTask):
    """Arithmetic problems split between agents that may run Python (module docstring).

    Reward of one joint action, in ``[0, 1]``:

    - split levels (``mul``, ``expr``, ``word``) with two agents: 1.0 when each agent's
      ``Answer:`` is its own part exactly (then the team's answer, their sum, is exact
      too), else ``partial_credit`` times the fraction of agents whose own part is right
      (0 by default): a right sum of wrong parts earns nothing;
    - ``gsm8k`` with two agents: the mean of the two agents' exact answers;
    - one agent: 1.0 when its answer is exact.

    ``infos[k]`` holds ``level``, ``answers`` (each agent's ``Answer:`` text or ``None``),
    ``values`` (their exact values: int, ``"p/q"`` or ``None``), ``targets`` (what each
    agent had to find), ``correct`` (per agent), ``gold``, ``team_answer`` (the sum at split
    levels), ``team_correct`` (every agent right), ``status`` (``"passed"`` /
    ``"failed"``) and ``agent_rewards``
    (per agent: 1.0 when its own part, or its answer, is right).

    Args:
        level: ``"mul"``, ``"expr"``, ``"word"`` or ``"gsm8k"``.
        num_agents: 1 (one solver of the whole problem) or 2 (the split).
        seed: seeds the problem generators; train and test are disjoint.
        num_train, num_eval: problems in the ``train`` / ``test`` split.
        digits: digits per factor at ``mul`` (an int or a ``(d1, d2)`` pair).
        ops: operators per part at ``expr``.
        gsm8k_path: GSM8K file or folder at ``gsm8k`` (e.g. ``gsm8k_test.jsonl``).
        use_tool: give each agent the Python tool (``False``: the no-tool baseline,
            :meth:`tools` returns ``()`` and the prompts do not mention Python).
        tool_timeout_s: wall-clock seconds one tool call may run in the sandbox.
        max_tool_calls: tool calls one agent may make in one turn.
        partial_credit: the joint reward's weight on parts right when the team's answer is
            wrong (split levels only), in ``[0, 1)``.
        example: open each prompt with one worked exchange (a question, then a reply that
            calls the tool in the fenced ``python`` format, reads the output and writes the
            answer line): ``True`` the ``mul`` exchange (:func:`example_messages`), a level
            name (``"mul"``, ``"expr"``, ``"word"``) that level's
            (:mod:`comlrl.envs.math.worked_examples`), ``False`` none. Small chat models
            follow the format from it (SmolLM2-135M-Instruct, 8 test problems x 4 samples at
            temperature 0.7, agent 1: 0 -> 23 of 32 parts right); turn it off for a model
            whose chat template renders tools (it calls them in JSON, not fenced blocks).

    Raises:
        ValueError: for an unknown level, ``num_agents`` not 1 or 2, a negative size,
            bad ``digits``/``ops``, a non-positive ``tool_timeout_s``, a negative
            ``max_tool_calls``, ``partial_credit`` outside ``[0, 1)`` or an unknown
            ``example``.
    """

    name = "tool_math"
    max_turns = 1
    tool_format = "python"
    #: new-token budget of a completion (a call, its answer line and some room; the
    #: pretrained-model default of ``max_new_tokens``, docs/real-models.md#defaults-by-model)
    max_new_tokens = 96
    #: Where the examples come from (``comlrl tasks`` prints it).
    data_source = (
        "generated from task.kwargs.seed (levels mul, expr, word); level=gsm8k reads "
        "task.kwargs.gsm8k_path"
    )

    def __init__(
        self,
        level: str = "mul",
        *,
        num_agents: int = 2,
        seed: int = 0,
        num_train: int = 1000,
        num_eval: int = 200,
        digits: int | Sequence[int] = (3, 2),
        ops: int = 3,
        gsm8k_path: str | Path | None = None,
        use_tool: bool = True,
        tool_timeout_s: float = 5.0,
        max_tool_calls: int = 4,
        partial_credit: float = 0.0,
        example: bool | str = True,
    ) -> None:
        if level not in ALL_LEVELS:
            raise ValueError(f"unknown level {level!r}; use one of {ALL_LEVELS}")
        if num_agents not in (1, 2):
            raise ValueError(f"tool_math takes num_agents 1 or 2, got {num_agents!r}")
        if num_train < 0 or num_eval < 0:
            raise ValueError(f"num_train and num_eval must be >= 0, got {num_train}, {num_eval}")
        if not 1 <= ops <= 8:
            raise ValueError(f"ops must be in 1..8, got {ops!r}")
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls!r}")
        if not 0.0 <= partial_credit < 1.0:
            raise ValueError(f"partial_credit must be in [0, 1), got {partial_credit!r}")
        self.level = level
        self.num_agents = num_agents
        self.seed = seed
        self.num_train = num_train
        self.num_eval = num_eval
        self.digits = check_digits(digits)
        self.ops = ops
        self.gsm8k_path = gsm8k_path
        self.use_tool = use_tool
        self.max_tool_calls = max_tool_calls
        self.partial_credit = float(partial_credit)
        self.example_level = example_level(example)
        self.example = self.example_level is not None
        self._tool = python_tool(timeout_s=tool_timeout_s)

    @property
    def split_work(self) -> bool:
        """Whether each agent solves a part (two agents, a generated level)."""
        return self.num_agents == 2 and self.level != "gsm8k"

    def targets(self, example: Mapping[str, Any]) -> list[str]:
        """What each agent must find: its part's answer when the work is split, else the
        whole problem's answer."""
        if self.split_work:
            return [str(g) for g in example["part_golds"]]
        return [str(example["gold"])] * self.num_agents

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """One :class:`~comlrl.core.ChatPrompt` per agent (single-turn: ``history`` unused).

        Split levels, agent ``i`` of 2: the system line says it is agent ``i + 1`` of a
        team whose answer is the sum of both agents' answers; the user message gives the
        team's problem, the agent's own part, and the answer request ("Use the Python tool
        to compute your part, then end with a line "Answer: <integer>"."). ``gsm8k``: both
        agents get the whole question and learn that the team is right when both are.
        One agent: the whole problem. ``raw`` (base models): the user message's text. The
        call syntax is not described here: the rollout declares the tools.
        """
        question = str(example["question"]).strip()
        number = "number" if self.level == "gsm8k" else "integer"
        tool_note = " You can run Python code to compute exactly." if self.use_tool else ""
        out: list[Prompt] = []
        for agent in range(self.num_agents):
            if self.split_work:
                # the agent's own part alone in the user message: with the whole problem
                # there, small models compute the whole problem instead of their part
                system = (
                    f"You are agent {agent + 1} of 2 in a team. Team problem: {question} Each "
                    "agent computes one part; the team's answer is the sum of the two agents' "
                    f"answers.{tool_note}"
                )
                user = f"{example['parts'][agent]}\n" + answer_request(self.use_tool, "it", number)
            elif self.num_agents == 2:
                system = (
                    f"You are agent {agent + 1} of 2 in a team solving a math problem. A "
                    "teammate solves the same problem separately; the team is right when "
                    f"you both are.{tool_note}"
                )
                user = f"{question}\n" + answer_request(self.use_tool, "the answer", number)
            else:
                system = f"You solve a math problem.{tool_note}"
                user = f"{question}\n" + answer_request(self.use_tool, "the answer", number)
            shots = (
                worked_example_messages(
                    self.example_level, self.use_tool, answer_request(self.use_tool, "it", number)
                )
                if self.example_level
                else []
            )
            messages = (
                {"role": "system", "content": system},
                *shots,
                {"role": "user", "content": user},
            )
            raw = "".join(f"{m['content']}\n\n" for m in shots) + f"{user}\n"
            out.append(ChatPrompt(messages, raw=raw))
        return out

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions (rules and infos in the class docstring).

        Raises:
            ValueError: when the shapes disagree.
        """
        self.check_joint_batch(completions, examples)
        rewards: list[float] = []
        infos: list[dict[str, Any]] = []
        for k, ex in enumerate(examples):
            answers = [answer_line(completions[a][k]) for a in range(self.num_agents)]
            values = [normalize_number(ans) for ans in answers]
            targets = self.targets(ex)
            correct = [
                v is not None and v == normalize_number(t)
                for v, t in zip(values, targets, strict=True)
            ]
            if self.split_work:
                parsed = [v for v in values if v is not None]
                team = sum(parsed, Fraction(0)) if len(parsed) == 2 else None
                # scored on both parts: a right sum of wrong parts is no team answer
                team_correct = all(correct)
                reward = 1.0 if team_correct else self.partial_credit * sum(correct) / 2
            else:
                team = values[0] if len(set(values)) == 1 else None
                team_correct = all(correct)
                reward = sum(correct) / self.num_agents
            rewards.append(float(reward))
            infos.append(
                {
                    "level": self.level,
                    "answers": answers,
                    "values": [value_json(v) for v in values],
                    "targets": targets,
                    "correct": correct,
                    "gold": str(ex["gold"]),
                    "team_answer": value_json(team),
                    "team_correct": team_correct,
                    "status": "passed" if team_correct else "failed",
                    "agent_rewards": [1.0 if c else 0.0 for c in correct],
                }
            )
        return RewardBatch(rewards, infos)
