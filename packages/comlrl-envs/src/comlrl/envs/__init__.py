"""comlrl.envs: task suites and sandboxed executors for CoMLRL.

- :mod:`comlrl.envs.sandbox`: run model-written Python in a limited child process, alone
  or in a pool, and score it against HumanEval-style tests with honest verdicts.
- :mod:`comlrl.envs.code`: code suites ``coop_humaneval``, ``coop_humaneval_che``,
  ``mbpp``, ``classeval`` (multi-turn, with sandbox feedback).
- :mod:`comlrl.envs.math`: ``gsm8k``, ``tool_math`` and ``debate_math`` (agents with a
  Python tool, debating agents) and exact-match answer parsing.
- :mod:`comlrl.envs.tools`: tools agents call inside a turn (the sandboxed Python tool).
- :mod:`comlrl.envs.writing`: ``tldr``, ``arxiv`` and ``coop_story``.

Nothing here imports torch.
"""

from __future__ import annotations

from comlrl.envs.code import (
    ClassEvalTask,
    CoopHumanEvalCheTask,
    CoopHumanEvalTask,
    MbppTask,
    default_humaneval_path,
    load_humaneval,
)
from comlrl.envs.code.extract import strip_code_fences
from comlrl.envs.math import DebateMathTask, Gsm8kTask, ToolMathTask
from comlrl.envs.sandbox import (
    CheckJob,
    ExecutionResult,
    SandboxLimits,
    SandboxPool,
    TestPlan,
    Verdict,
    check_solution,
    run_many,
    run_python,
    split_test,
)
from comlrl.envs.tools import python_tool
from comlrl.envs.writing import ArxivTask, CoopStoryTask, TldrTask

__all__ = [
    "ArxivTask",
    "ClassEvalTask",
    "CoopHumanEvalCheTask",
    "CoopHumanEvalTask",
    "CoopStoryTask",
    "DebateMathTask",
    "Gsm8kTask",
    "MbppTask",
    "TldrTask",
    "ToolMathTask",
    "default_humaneval_path",
    "load_humaneval",
    "strip_code_fences",
    "CheckJob",
    "ExecutionResult",
    "SandboxLimits",
    "SandboxPool",
    "TestPlan",
    "Verdict",
    "check_solution",
    "run_many",
    "run_python",
    "split_test",
    "python_tool",
]
