"""Math word-problem task suites (``gsm8k``) and exact-match answer parsing."""

from __future__ import annotations

from comlrl.envs.math.answer import answers_match, extract_answer, gold_answer, normalize_number
from comlrl.envs.math.gsm8k import Gsm8kTask

__all__ = ["Gsm8kTask", "answers_match", "extract_answer", "gold_answer", "normalize_number"]
