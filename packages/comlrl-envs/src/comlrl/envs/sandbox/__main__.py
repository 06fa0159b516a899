"""``python -m comlrl.envs.sandbox``: what isolates a sandboxed program on this machine.

Prints, as JSON: the seccomp binding that compiles the syscall filter (or why there is
none), the accounting unit each run gets (a cgroup per run or the single-process
fallback, and why), and the isolation a trivial program actually got here
(``ExecutionResult.isolation``). Exits 1 when the default limits cannot run a program.
"""

from __future__ import annotations

import json
import sys

from comlrl.envs.sandbox.executor import run_python
from comlrl.envs.sandbox.limits import SandboxLimits, SandboxUnavailableError
from comlrl.envs.sandbox.run_limits import run_accounting
from comlrl.envs.sandbox.syscall_filter import binding_name


def main() -> int:
    report: dict[str, object] = {}
    try:
        report["seccomp_binding"] = binding_name()
    except SandboxUnavailableError as exc:
        report["seccomp_binding"] = f"none: {exc}"
    acc = run_accounting()
    report["accounting"] = {"kind": acc.kind, "parents": acc.parents, "message": acc.describe()}
    code = 0
    try:
        report["probe_isolation"] = run_python("pass", SandboxLimits(timeout_s=30)).isolation
    except SandboxUnavailableError as exc:
        report["probe_isolation"] = f"refused: {exc}"
        code = 1
    print(json.dumps(report, indent=2, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
