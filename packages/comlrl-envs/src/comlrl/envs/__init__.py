"""comlrl.envs: task suites and sandboxed executors for CoMLRL.

- :mod:`comlrl.envs.sandbox`: run model-written Python in a limited child process, alone
  or in a pool, and score it against HumanEval-style tests with honest verdicts.
- :mod:`comlrl.envs.code`: the cooperative HumanEval task (``coop_humaneval``).

Nothing here imports torch.
"""

from __future__ import annotations

from comlrl.envs.code import CoopHumanEvalTask, default_humaneval_path, load_humaneval
from comlrl.envs.code.extract import strip_code_fences
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

__all__ = [
    "CoopHumanEvalTask",
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
]
