"""Sandboxed execution of model-written Python (see ``executor`` for what is enforced)."""

from __future__ import annotations

from comlrl.envs.sandbox.executor import run_python
from comlrl.envs.sandbox.fork_executor import shutdown as shutdown_fork_servers
from comlrl.envs.sandbox.harness import TestPlan, Verdict, VerdictStatus, check_solution, split_test
from comlrl.envs.sandbox.limits import (
    ExecutionResult,
    ExecutionStatus,
    SandboxLimits,
    SandboxUnavailableError,
)
from comlrl.envs.sandbox.pool import CheckJob, SandboxPool, run_many
from comlrl.envs.sandbox.run_limits import Accounting, run_accounting

__all__ = [
    "ExecutionResult",
    "ExecutionStatus",
    "SandboxLimits",
    "SandboxUnavailableError",
    "run_python",
    "TestPlan",
    "Verdict",
    "VerdictStatus",
    "check_solution",
    "split_test",
    "CheckJob",
    "SandboxPool",
    "run_many",
    "shutdown_fork_servers",
    "Accounting",
    "run_accounting",
]
