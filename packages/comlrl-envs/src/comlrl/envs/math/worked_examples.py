"""Worked examples of each problem level, for the prompts of ``tool_math`` and ``debate_math``.

A small chat model follows a format it has seen far better than one it is told about: with
one worked exchange (a question, a reply that calls the Python tool in the fenced-block
format, the tool's output and the ``Answer:`` line) ahead of the real question,
SmolLM2-135M-Instruct writes calls and answer lines; without it, it writes neither.

The exchange is most useful when it looks like the problem: the ``mul`` exchange ahead of a
``word`` problem makes this model multiply two numbers of the story and drop the rest
(``print(12 * 34)`` copied outright in 14 of 64 greedy answers on the first 32 test
problems), and the ``mul`` exchange ahead of an ``expr`` problem makes it drop the
parenthesis that opens the part (``print(22 - 34 + 25) * 4``) or the answer's minus sign:
greedy, 20 of 64 parts right with the ``mul`` exchange and 38 of 64 with the ``expr`` one
(team 0.062 -> 0.312). :data:`WORKED_EXAMPLES`
holds one exchange per generated level, each with numbers that no generated problem
combines the same way; :func:`worked_example_messages` renders one as chat messages.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "WorkedExample",
    "WORKED_EXAMPLES",
    "EXAMPLE_CHOICES",
    "example_level",
    "worked_example_messages",
]


@dataclass(frozen=True)
class WorkedExample:
    """One worked exchange.

    Attributes:
        question: the user's question (the answer request is appended when rendered).
        expression: the Python expression that computes it (printed in the tool call).
        answer: its exact value.
    """

    question: str
    expression: str
    answer: int

    def reply(self, use_tool: bool) -> str:
        """The assistant's reply: the fenced ``python`` call, its ``output`` block and the
        answer line; without the tool, the expression worked by hand and the answer line."""
        if use_tool:
            return (
                f"```python\nprint({self.expression})\n```\n```output\n{self.answer}\n```\n"
                f"Answer: {self.answer}"
            )
        return f"{self.expression} = {self.answer}\nAnswer: {self.answer}"


#: One worked exchange per generated level (``mul`` is the exchange every prompt opened with
#: before levels had their own; ``expr`` shows parentheses inside ``print(...)`` and a
#: negative result; ``word`` shows a count with items bought on top).
WORKED_EXAMPLES: dict[str, WorkedExample] = {
    "mul": WorkedExample("Compute 12 * 34.", "12 * 34", 408),
    "expr": WorkedExample("Compute (12 - 45) * 3.", "(12 - 45) * 3", -99),
    "word": WorkedExample(
        "Sam has 4 jars with 12 buttons in each and buys 7 more buttons. How many buttons "
        "does Sam have now?",
        "4 * 12 + 7",
        55,
    ),
}

#: Values of the tasks' ``example`` option besides ``True``/``False``: a level's exchange.
EXAMPLE_CHOICES = tuple(WORKED_EXAMPLES)


def example_level(example: bool | str) -> str | None:
    """The level whose worked exchange a task's ``example`` option asks for: ``True`` is
    ``"mul"`` (the exchange every prompt opened with before levels had their own),
    ``False`` none, a level name that level's.

    Raises:
        ValueError: for anything else, naming the choices.
    """
    if isinstance(example, bool):
        return "mul" if example else None
    if isinstance(example, str) and example in WORKED_EXAMPLES:
        return example
    raise ValueError(
        f"example must be true, false or a level with a worked example {EXAMPLE_CHOICES}, "
        f"got {example!r}"
    )


def worked_example_messages(level: str, use_tool: bool, request: str) -> list[dict[str, str]]:
    """The worked exchange of ``level`` as a user and an assistant message.

    Args:
        level: a key of :data:`WORKED_EXAMPLES`.
        use_tool: whether the reply calls the Python tool (else it works the sum by hand).
        request: the answer request appended to the question (the task's own, e.g. "Use
            the Python tool to compute it, then end with a line "Answer: <integer>".").

    Raises:
        ValueError: for a level without a worked example.
    """
    if level not in WORKED_EXAMPLES:
        raise ValueError(
            f"no worked example for level {level!r}; use one of {EXAMPLE_CHOICES} "
            "(or example=true / false)"
        )
    ex = WORKED_EXAMPLES[level]
    return [
        {"role": "user", "content": f"{ex.question}\n{request}"},
        {"role": "assistant", "content": ex.reply(use_tool)},
    ]
