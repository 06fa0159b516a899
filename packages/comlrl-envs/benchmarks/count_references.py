"""Reference solutions of every code suite and split, scored through the sandbox; prints JSON.

Usage::

    python packages/comlrl-envs/benchmarks/count_references.py [--data DIR]
        [--suites coop_humaneval,coop_humaneval_che,mbpp,sanitized-mbpp,classeval]
        [--workers 2] [--out FILE]

For each suite and split: ``programs`` (reference jobs), ``passed`` (programs with every
unit passed), ``units_passed`` / ``units`` and the ids of the programs that did not pass.
Each job runs with ``SandboxLimits(timeout_s=60)`` and ``assert_timeout_s=20`` (as the
slow reference tests do), so a slow reference on a loaded machine is not counted as wrong.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from comlrl.envs.code.classeval import ClassEvalTask
from comlrl.envs.code.coop_humaneval_che import CoopHumanEvalCheTask
from comlrl.envs.code.humaneval import CoopHumanEvalTask
from comlrl.envs.code.mbpp import MbppTask
from comlrl.envs.sandbox import SandboxLimits, SandboxPool

SUITES = {
    "coop_humaneval": (CoopHumanEvalTask, "HumanEval.jsonl.gz"),
    "coop_humaneval_che": (CoopHumanEvalCheTask, "CoopHumanEval_che_raw.json"),
    "mbpp": (MbppTask, "mbpp.jsonl"),
    "sanitized-mbpp": (MbppTask, "sanitized-mbpp.json"),
    "classeval": (ClassEvalTask, "ClassEval_data.json"),
}


def count(name: str, data: Path, workers: int) -> dict[str, Any]:
    """Per split of suite ``name``: programs, passed, units passed / units, failed ids."""
    cls, file = SUITES[name]
    task = cls(path=data / file)
    out: dict[str, Any] = {}
    try:
        for split in getattr(task, "splits", None) or tuple(task.ranges):
            rows = task.load(split)
            try:
                jobs = task.reference_jobs(split)
            except ValueError as exc:  # a split whose rows carry no reference solution
                out[split] = {"programs": 0, "note": str(exc)[:160]}
                continue
            start = time.perf_counter()
            with SandboxPool(max_workers=workers) as pool:
                verdicts = pool.check_many(jobs, SandboxLimits(timeout_s=60), assert_timeout_s=20)
            out[split] = {
                "programs": len(jobs),
                "passed": sum(v.status == "passed" for v in verdicts),
                "units_passed": sum(v.passed for v in verdicts),
                "units": sum(v.total for v in verdicts),
                "not_passed": [
                    [str(r.get("task_id")), v.status, (v.error or "")[:120]]
                    for r, v in zip(rows, verdicts, strict=True)
                    if v.status != "passed"
                ],
                "seconds": round(time.perf_counter() - start, 1),
            }
            print(name, split, {k: v for k, v in out[split].items() if k != "not_passed"})
    finally:
        task.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report = {name: count(name, args.data, args.workers) for name in args.suites.split(",")}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
