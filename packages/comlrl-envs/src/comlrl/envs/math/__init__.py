"""Math task suites (``gsm8k``, ``tool_math``, ``debate_math``) and exact-match answer parsing."""

from __future__ import annotations

from comlrl.envs.math.answer import (
    answer_line,
    answers_match,
    extract_answer,
    gold_answer,
    normalize_number,
)
from comlrl.envs.math.debate import DebateMathTask
from comlrl.envs.math.gsm8k import Gsm8kTask
from comlrl.envs.math.tool_math import ToolMathTask

__all__ = [
    "DebateMathTask",
    "Gsm8kTask",
    "ToolMathTask",
    "answer_line",
    "answers_match",
    "extract_answer",
    "gold_answer",
    "normalize_number",
]
