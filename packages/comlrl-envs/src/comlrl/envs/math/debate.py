"""Multi-agent debate on math problems (``debate_math``).

After Du et al. 2023, "Improving Factuality and Reasoning in Language Models through
Multiagent Debate" (arXiv 2305.14325): ``A`` agents (1, 2 or 3) answer the same question
(turn 0); then, for each of ``rounds`` debate rounds (turns 1..R, so ``max_turns = R + 1``),
every agent reads the other agents' previous solutions and answers (:meth:`feedback`) and
gives an updated answer. With one agent the debate is self-reflection: the agent reads its
own previous answer. Each agent may run code with the sandboxed Python tool when
``use_tool=True`` (:func:`comlrl.envs.tools.python_tool`).

Problems are those of ``tool_math`` (:mod:`comlrl.envs.math.problem_sets`; levels
``mul``, ``expr``, ``word``, ``gsm8k``), asked whole: every agent solves the whole problem.

Each turn is scored on that turn's answers, so the last turn's reward is the joint reward
on the final answers: ``reward_mode="all"`` pays 1.0 when every agent's answer is exact,
``"majority"`` when more than half of them are (with two agents that is both). Agent
``a``'s own reward (``infos[k]["agent_rewards"][a]``) is 1.0 when its answer is exact.
Answers are read only from ``Answer:`` lines of each agent's own text
(:func:`comlrl.envs.math.answer.answer_line`).

What the agents see of each other is their own text (completion text: the model's
writing, tool results left out), cut to ``max_shown_chars``, and the answer read from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from comlrl.core import ChatPrompt, Feedback, JointAction, Prompt, RewardBatch
from comlrl.envs.math.answer import answer_line, normalize_number
from comlrl.envs.math.problem_sets import ALL_LEVELS, check_digits
from comlrl.envs.math.tool_math import MathProblemTask, answer_request, value_json
from comlrl.envs.math.worked_examples import example_level, worked_example_messages
from comlrl.envs.tools.python import python_tool

__all__ = ["DebateMathTask", "REWARD_MODES"]

#: How the final answers make the joint reward.
REWARD_MODES = ("all", "majority")


def _shown(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + " [...]"


class DebateMathTask(MathProblemTask):
    """``A`` agents answer a math problem, then debate it for ``rounds`` rounds (module
    docstring).

    ``infos[k]`` holds ``answers`` (each agent's ``Answer:`` text or ``None``), ``values``
    (exact values: int, ``"p/q"`` or ``None``), ``correct`` (per agent), ``num_correct``,
    ``gold``, ``agree`` (all agents gave the same value), ``majority_answer`` (the value
    more than half the agents gave, or ``None``), ``status`` and ``agent_rewards``.

    Args:
        level: ``"mul"``, ``"expr"``, ``"word"`` or ``"gsm8k"``.
        num_agents: 1, 2 or 3 (Du et al. debate with 3).
        rounds: debate rounds after the first answers (``max_turns = rounds + 1``).
        reward_mode: ``"all"`` or ``"majority"`` (see the module docstring).
        seed, num_train, num_eval, digits, ops, gsm8k_path: the problems, as in
            :class:`~comlrl.envs.math.tool_math.ToolMathTask`.
        use_tool: give each agent the sandboxed Python tool (default ``False``).
        tool_timeout_s: wall-clock seconds one tool call may run in the sandbox.
        max_tool_calls: tool calls one agent may make in one turn.
        max_shown_chars: characters of each other agent's text shown in the feedback.
        example: open each agent's conversation with a worked exchange (as ``tool_math``
            does): ``True`` the ``mul`` one, a level name (``"mul"``, ``"expr"``,
            ``"word"``) that level's (:mod:`comlrl.envs.math.worked_examples`), ``False``
            none.

    Raises:
        ValueError: an unknown level or reward mode, ``num_agents`` not in 1..3,
            ``rounds`` < 0, ``max_shown_chars`` < 1, or bad problem options.
    """

    name = "debate_math"
    #: the defaults (the instance's follow ``num_agents`` and ``rounds``).
    num_agents = 3
    max_turns = 2
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
        num_agents: int = 3,
        rounds: int = 1,
        reward_mode: str = "all",
        seed: int = 0,
        num_train: int = 1000,
        num_eval: int = 200,
        digits: int | Sequence[int] = (3, 2),
        ops: int = 3,
        gsm8k_path: str | Path | None = None,
        use_tool: bool = False,
        tool_timeout_s: float = 5.0,
        max_tool_calls: int = 4,
        max_shown_chars: int = 600,
        example: bool | str = True,
    ) -> None:
        if level not in ALL_LEVELS:
            raise ValueError(f"unknown level {level!r}; use one of {ALL_LEVELS}")
        if num_agents not in (1, 2, 3):
            raise ValueError(f"debate_math takes num_agents 1, 2 or 3, got {num_agents!r}")
        if not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"rounds must be an int >= 0, got {rounds!r}")
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
        if num_train < 0 or num_eval < 0:
            raise ValueError(f"num_train and num_eval must be >= 0, got {num_train}, {num_eval}")
        if not 1 <= ops <= 8:
            raise ValueError(f"ops must be in 1..8, got {ops!r}")
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls!r}")
        if max_shown_chars < 1:
            raise ValueError(f"max_shown_chars must be >= 1, got {max_shown_chars!r}")
        self.level = level
        self.num_agents = num_agents
        self.rounds = rounds
        self.max_turns = rounds + 1
        self.reward_mode = reward_mode
        self.seed = seed
        self.num_train = num_train
        self.num_eval = num_eval
        self.digits = check_digits(digits)
        self.ops = ops
        self.gsm8k_path = gsm8k_path
        self.use_tool = use_tool
        self.max_tool_calls = max_tool_calls
        self.max_shown_chars = max_shown_chars
        self.example_level = example_level(example)
        self.example = self.example_level is not None
        self._tool = python_tool(timeout_s=tool_timeout_s)

    # --------------------------------------------------------------- prompts
    def _number(self) -> str:
        return "number" if self.level == "gsm8k" else "integer"

    def _first(self, example: Mapping[str, Any], agent: int) -> tuple[str, str]:
        tool_note = " You can run Python code to compute exactly." if self.use_tool else ""
        if self.num_agents == 1:
            system = (
                "You answer a math problem. Afterwards you will see your answer again and "
                f"may correct it.{tool_note}"
            )
        else:
            system = (
                f"You are agent {agent + 1} of {self.num_agents} debating a math problem. "
                "Every agent answers it; then each reads the others' solutions and may "
                f"revise its own. The team is right when its final answers are.{tool_note}"
            )
        question = str(example["question"]).strip()
        user = f"{question}\n" + answer_request(self.use_tool, "the answer", self._number())
        return system, user

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Prompt]:
        """One :class:`~comlrl.core.ChatPrompt` per agent.

        Turn 0: a system line (the agent's place in the debate) and the question with the
        answer request ("end with a line "Answer: <integer>""). Later turns continue the
        conversation: per earlier turn, the agent's own completion text as the assistant
        message, then that turn's feedback (:meth:`feedback`: the other agents' solutions
        and a request to update) as the user message. ``raw`` (base models): the question,
        then per earlier turn the agent's own text and the feedback, as plain text.
        """
        out: list[Prompt] = []
        for agent in range(self.num_agents):
            system, user = self._first(example, agent)
            request = answer_request(self.use_tool, "it", self._number())
            shots = (
                worked_example_messages(self.example_level, self.use_tool, request)
                if self.example_level
                else []
            )
            messages = [{"role": "system", "content": system}, *shots]
            messages.append({"role": "user", "content": user})
            raw = "".join(f"{m['content']}\n\n" for m in shots) + user
            for fb in history:
                completions = fb.info.get("completions") if fb.info else None
                own = (
                    str(completions[agent])
                    if isinstance(completions, Sequence) and len(completions) > agent
                    else None
                )
                if own is not None:
                    messages.append({"role": "assistant", "content": own})
                    messages.append({"role": "user", "content": fb.texts[agent]})
                    raw += f"\n\n{own.strip()}\n\n{fb.texts[agent]}"
                else:
                    messages[-1] = {
                        "role": "user",
                        "content": f"{messages[-1]['content']}\n\n{fb.texts[agent]}",
                    }
                    raw += f"\n\n{fb.texts[agent]}"
            out.append(ChatPrompt(tuple(messages), raw=f"{raw}\n"))
        return out

    # --------------------------------------------------------------- feedback
    def feedback_text(self, agent: int, completions: Sequence[str], turn: int) -> str:
        """What agent ``agent`` reads after turn ``turn``: the other agents' solutions
        (each cut to ``max_shown_chars``) with the answer read from each, or, alone, its
        own answer; then the request to check and update its answer."""
        request = f'End with a line "Answer: <{self._number()}>".'
        if self.use_tool:
            request = f"You may use the Python tool again. {request}"
        if self.num_agents == 1:
            ans = answer_line(completions[0]) or "no answer"
            return (
                f"Your answer in round {turn + 1} was: {ans}. Check your solution step by "
                f"step and correct it if needed. {request}"
            )
        parts = [f"The other agents' solutions in round {turn + 1}:"]
        for other in range(self.num_agents):
            if other == agent:
                continue
            text = completions[other]
            ans = answer_line(text) or "no answer"
            parts.append(
                f"Agent {other + 1}:\n{_shown(text, self.max_shown_chars) or '(empty)'}\n"
                f"(Agent {other + 1}'s answer: {ans})"
            )
        parts.append(
            "Compare their reasoning with yours, check each step, and give your answer "
            f"again (change it only if you find a mistake). {request}"
        )
        return "\n\n".join(parts)

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        """The debate round after turn ``turn``: per agent, :meth:`feedback_text`.

        Returns:
            :class:`~comlrl.core.Feedback` with one text per agent, ``done`` after the last
            round (``turn + 1 >= max_turns``), and ``info`` with ``turn``, ``answers``,
            ``correct`` and ``completions`` (the agents' texts, which the next prompts show
            as each agent's own earlier answer).
        """
        completions = tuple(joint_action.completions)
        texts = tuple(self.feedback_text(a, completions, turn) for a in range(self.num_agents))
        return Feedback(
            texts,
            done=turn + 1 >= self.max_turns,
            info={
                "turn": turn,
                "answers": info.get("answers"),
                "correct": info.get("correct"),
                "completions": completions,
            },
        )

    # ---------------------------------------------------------------- reward
    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        """Score ``K`` joint actions of one turn (rules in the module docstring, infos in
        the class docstring).

        Raises:
            ValueError: when the shapes disagree.
        """
        self.check_joint_batch(completions, examples)
        rewards: list[float] = []
        infos: list[dict[str, Any]] = []
        for k, ex in enumerate(examples):
            answers = [answer_line(completions[a][k]) for a in range(self.num_agents)]
            values = [normalize_number(ans) for ans in answers]
            gold = normalize_number(str(ex["gold"]))
            correct = [v is not None and v == gold for v in values]
            counts = Counter(v for v in values if v is not None)
            top = counts.most_common(1)
            majority = top[0][0] if top and top[0][1] * 2 > self.num_agents else None
            num_correct = sum(correct)
            passed = (
                num_correct == self.num_agents
                if self.reward_mode == "all"
                else num_correct * 2 > self.num_agents
            )
            rewards.append(1.0 if passed else 0.0)
            infos.append(
                {
                    "level": self.level,
                    "answers": answers,
                    "values": [value_json(v) for v in values],
                    "correct": correct,
                    "num_correct": num_correct,
                    "gold": str(ex["gold"]),
                    "agree": None not in values and len(counts) == 1,
                    "majority_answer": value_json(majority),
                    "status": "passed" if passed else "failed",
                    "agent_rewards": [1.0 if c else 0.0 for c in correct],
                }
            )
        return RewardBatch(rewards, infos)
