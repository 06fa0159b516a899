"""Baselines of a real instruct LLM before any training: ``tool_math`` with and without the
Python tool, and ``debate_math`` with 1, 2 and 3 agents, with and without it.

Each configuration is one ``comlrl eval`` of the untrained model (every agent a copy of
``--model``) on the task's test split, greedy by default, printed before it runs. Writes
``--out`` (JSON: machine, commit, each command and its evaluation row: the mean joint reward,
``pass@1`` (the exact-answer rate of the team), per-turn rewards and the tool metrics) and
prints a Markdown table.

    python benchmarks/bench_tool_baselines.py --out benchmarks/results/tool_baselines.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import git_commit, machine_info  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO.parent / "shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


def configurations(rounds: int) -> list[dict[str, Any]]:
    """``(name, task, num_agents, num_turns, task kwargs)`` of every baseline."""
    out: list[dict[str, Any]] = []
    for use_tool in (True, False):
        out.append(
            {
                "name": f"tool_math, 2 agents, {'with' if use_tool else 'without'} the tool",
                "task": "tool_math",
                "agents": 2,
                "turns": 1,
                "kwargs": {"use_tool": use_tool},
            }
        )
    for agents in (1, 2, 3):
        for use_tool in (False, True):
            out.append(
                {
                    "name": f"debate_math, {agents} agent(s), {rounds} round(s), "
                    f"{'with' if use_tool else 'without'} the tool",
                    "task": "debate_math",
                    "agents": agents,
                    "turns": rounds + 1,
                    "kwargs": {"num_agents": agents, "rounds": rounds, "use_tool": use_tool},
                }
            )
    return out


def comlrl_exe() -> str:
    """The ``comlrl`` console script beside this Python (else the one on PATH)."""
    beside = Path(sys.executable).with_name("comlrl")
    return str(beside) if beside.exists() else "comlrl"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="a .gguf file, folder or Hub id")
    ap.add_argument("--level", default="mul", help="task.kwargs.level of both tasks")
    ap.add_argument("--limit", type=int, default=24, help="test problems per configuration")
    ap.add_argument("--rounds", type=int, default=1, help="debate rounds after the first answer")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each eval")
    ap.add_argument("--only", default=None, help="run only configurations whose name holds this")
    ap.add_argument("--out", default="benchmarks/results/tool_baselines.json")
    args = ap.parse_args()

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    result: dict[str, Any] = {
        "what": "untrained real instruct LLM on tool_math and debate_math, greedy, held-out "
        "test split: with and without the sandboxed Python tool, 1-3 debating agents",
        "machine": machine_info(args.threads, load_average_1m_at_start=os.getloadavg()[0]),
        "commit": git_commit(REPO),
        "settings": vars(args),
        "rows": [],
    }
    work = Path(tempfile.mkdtemp(prefix="tool-baselines-"))
    for cfg in configurations(args.rounds):
        if args.only and args.only not in cfg["name"]:
            continue
        out_dir = work / f"{len(result['rows'])}"
        kwargs = [f"task.kwargs.{k}={str(v).lower()}" for k, v in cfg["kwargs"].items()]
        kwargs.append(f"task.kwargs.level={args.level}")
        cmd = [comlrl_exe(), "eval"]
        cmd += [a for _ in range(cfg["agents"]) for a in ("--model", args.model)]
        cmd += [
            f"task.name={cfg['task']}",
            *kwargs,
            f"num_agents={cfg['agents']}",
            f"num_turns={cfg['turns']}",
            f"max_new_tokens={args.max_new_tokens}",
            f"eval_limit={args.limit}",
            "eval_greedy=true",
            "--output-dir",
            str(out_dir),
        ]
        print(f"$ OMP_NUM_THREADS={args.threads} " + shlex.join(cmd), flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-3000:])
            raise SystemExit(f"comlrl eval failed ({done.returncode}) for {cfg['name']}")
        row = json.loads((out_dir / "eval.jsonl").read_text().splitlines()[-1])
        last = cfg["turns"] - 1
        entry = {
            **cfg,
            "command": shlex.join(cmd),
            "wall_s": round(time.perf_counter() - t0, 1),
            "reward_mean_first_turn": row.get("reward_mean"),
            "reward_mean_last_turn": row.get(f"turn_{last}/reward_mean", row.get("reward_mean")),
            "pass@1": row.get("pass@1"),
            "tool_calls_mean": [
                v for k, v in sorted(row.items()) if k.startswith("tool_calls_mean/")
            ],
            "tool_error_fraction": row.get("tool_error_fraction"),
            "eval_row": row,
        }
        result["rows"].append(entry)
        print(
            f"  {cfg['name']}: first-turn reward {entry['reward_mean_first_turn']:.3f}, "
            f"last-turn {entry['reward_mean_last_turn']:.3f} ({entry['wall_s']} s)",
            flush=True,
        )
    result["machine"]["load_average_1m_at_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        "\n| configuration | reward, first answers | reward, final answers | tool calls per completion |"
    )
    print("| --- | --- | --- | --- |")
    for e in result["rows"]:
        calls = ", ".join(f"{c:.2f}" for c in e["tool_calls_mean"]) or "-"
        print(
            f"| {e['name']} | {e['reward_mean_first_turn']:.3f} | "
            f"{e['reward_mean_last_turn']:.3f} | {calls} |"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
