"""Step time of the default ``comlrl train`` (built-in stories260k, ``coop_story``, 2 agents).

Runs ``comlrl train batch_size=B num_steps=N`` (everything else at its default) in a
subprocess for each batch size and reads its ``metrics.jsonl``: the median over the steps
after the first two of ``time/step_s``, ``time/generate_s`` and ``time/update_s``, and the
whole command's wall time (imports, model loading, writing, the plot). With
``--compare-src DIR`` every run is repeated, alternating, with ``comlrl.algos`` taken from
``DIR`` (an older tree: ``git archive REV packages/comlrl-algos/src | tar -x -C /tmp/old``),
and the metrics rows of the two are compared (timings left out), so a speed change that
alters results shows: ``metrics_rows_identical`` (bit for bit), ``metrics_diff`` (the
largest absolute and relative difference of any metric and its key, for changes that only
round differently)
and ``samples_identical`` (``samples.jsonl`` byte for byte: the sampled text and rewards).

Usage::

    python benchmarks/bench_default_step.py --batch-sizes 1 --steps 20 --rounds 2 \\
        --compare-src /tmp/old/packages/comlrl-algos/src --output benchmarks/results/default_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TIMES = ("time/step_s", "time/generate_s", "time/update_s")


def _rows_without_times(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    skip = ("tokens_per_s", "prompts_per_s")
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and k not in skip} for r in rows
    ]


def run_once(src: str | None, batch: int, steps: int, work: Path) -> dict[str, Any]:
    out = work / f"run_{'cmp' if src else 'this'}_b{batch}"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, TQDM_DISABLE="1")
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "comlrl.algos.cli.main", "train", f"batch_size={batch}"]
    cmd += [f"num_steps={steps}", f"output_dir={out}", "progress=false"]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    later = rows[2:] or rows
    return {
        "command_wall_s": wall,
        **{f"median_{k[5:]}": statistics.median(r[k] for r in later) for k in TIMES},
        "rows": _rows_without_times(rows),
        "samples": (out / "samples.jsonl").read_bytes(),
    }


def _metric_diff(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest ``|x - y|`` and ``|x - y| / max(|y|, 1e-12)`` over the metrics of two
    runs' rows, with the key of the largest relative one (inf when rows or keys differ)."""
    worst: dict[str, Any] = {"max_abs": 0.0, "max_rel": 0.0, "key": None}
    if len(a) != len(b) or any(r.keys() != q.keys() for r, q in zip(a, b, strict=True)):
        return {"max_abs": float("inf"), "max_rel": float("inf"), "key": "rows or keys differ"}
    for r, q in zip(a, b, strict=True):
        for k, x in r.items():
            y = q[k]
            if not (isinstance(x, (int, float)) and isinstance(y, (int, float))):
                if x != y:
                    return {"max_abs": float("inf"), "max_rel": float("inf"), "key": k}
                continue
            d = abs(x - y)
            worst["max_abs"] = max(worst["max_abs"], d)
            if d / max(abs(y), 1e-12) > worst["max_rel"]:
                worst["max_rel"], worst["key"] = d / max(abs(y), 1e-12), k
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--compare-src", default=None)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_default_step_"))
    sides = {"this_tree": None} | ({"compare": args.compare_src} if args.compare_src else {})
    result: dict[str, Any] = {
        "benchmark": "default_step",
        "command": " ".join([sys.executable, *sys.argv]),
        "setup": vars(args),
        "loadavg_start": os.getloadavg(),
        "batches": {},
    }
    for b in args.batch_sizes:
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
        for _ in range(args.rounds):
            for name, src in sides.items():
                r = run_once(src, b, args.steps, work)
                runs[name].append(r)
                print(
                    f"b={b} {name:9s} step {r['median_step_s'] * 1000:.0f} ms (generate "
                    f"{r['median_generate_s'] * 1000:.0f}, update {r['median_update_s'] * 1000:.0f}),"
                    f" command {r['command_wall_s']:.1f} s",
                    flush=True,
                )
        entry: dict[str, Any] = {
            name: {
                "best_median_step_s": min(r["median_step_s"] for r in rs),
                "trials": [
                    {k: v for k, v in r.items() if k not in ("rows", "samples")} for r in rs
                ],
            }
            for name, rs in runs.items()
        }
        if args.compare_src:
            entry["metrics_rows_identical"] = all(
                r["rows"] == runs["this_tree"][0]["rows"] for rs in runs.values() for r in rs
            )
            ref = runs["this_tree"][0]
            diffs = [_metric_diff(r["rows"], ref["rows"]) for rs in runs.values() for r in rs]
            entry["metrics_diff"] = max(diffs, key=lambda d: d["max_rel"])
            entry["samples_identical"] = all(
                r["samples"] == ref["samples"] for rs in runs.values() for r in rs
            )
            entry["speedup_step"] = (
                entry["compare"]["best_median_step_s"] / entry["this_tree"]["best_median_step_s"]
            )
            entry["speedup_update"] = min(
                t["median_update_s"] for t in entry["compare"]["trials"]
            ) / min(t["median_update_s"] for t in entry["this_tree"]["trials"])
            print(
                f"b={b}: speed-up step {entry['speedup_step']:.2f}x, update "
                f"{entry['speedup_update']:.2f}x; metrics rows identical: "
                f"{entry['metrics_rows_identical']} (max rel diff "
                f"{entry['metrics_diff']['max_rel']:.2g} in {entry['metrics_diff']['key']}), "
                "samples identical: "
                f"{entry['samples_identical']}"
            )
        result["batches"][str(b)] = entry
    result["loadavg_end"] = os.getloadavg()
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
