"""Code-generation task suites: ``coop_humaneval``, ``coop_humaneval_che``, ``mbpp``,
``classeval`` (all multi-turn, with sandbox feedback)."""

from __future__ import annotations

from comlrl.envs.code._suite import default_split_ranges
from comlrl.envs.code.classeval import ClassEvalTask, load_classeval
from comlrl.envs.code.classeval_tests import classeval_check_source
from comlrl.envs.code.coop_humaneval_che import CoopHumanEvalCheTask
from comlrl.envs.code.hacks import HACK_SIGNALS, hack_signals
from comlrl.envs.code.humaneval import CoopHumanEvalTask
from comlrl.envs.code.humaneval_data import default_humaneval_path, load_humaneval, split_prompt
from comlrl.envs.code.mbpp import MbppTask, load_mbpp, mbpp_to_humaneval

__all__ = [
    "HACK_SIGNALS",
    "ClassEvalTask",
    "CoopHumanEvalCheTask",
    "CoopHumanEvalTask",
    "MbppTask",
    "classeval_check_source",
    "default_humaneval_path",
    "default_split_ranges",
    "hack_signals",
    "load_classeval",
    "load_humaneval",
    "load_mbpp",
    "mbpp_to_humaneval",
    "split_prompt",
]
