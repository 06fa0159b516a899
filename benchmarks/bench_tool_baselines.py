"""Baselines of a real instruct LLM: ``tool_math`` with and without the Python tool, and
``debate_math`` with 1, 2 and 3 agents, with and without it.

Each configuration is one ``comlrl eval`` on the task's test split, printed before it runs:
of the untrained model by default (every agent a copy of ``--model``), or of trained agents
(``--agent-model`` once per agent of a run's ``final/``, reused in turn for more agents),
greedy or sampled (``--sampled K``: K joint actions per problem at ``--temperature``), with
the task's own worked example or another (``--example``, repeatable: one row per value).
Writes ``--out`` (JSON: machine, commit, each command and its evaluation row) and prints a
Markdown table: the team's exact-answer rate on the first and the final answers, each
agent's, and for debates how often the first answers disagree and how the debate changed
them (answers turned right, answers turned wrong).

    python benchmarks/bench_tool_baselines.py --out benchmarks/results/tool_baselines.json
"""

from __future__ import annotations

import argparse
import itertools
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


def eval_rows(folder: Path) -> list[dict[str, Any]]:
    """The joint actions an evaluation wrote (``eval_samples.jsonl``), in file order."""
    text = (folder / "eval_samples.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def team_right(row: dict[str, Any]) -> bool:
    """Whether a joint action is right as a team (``tool_math``: ``team_correct``;
    ``debate_math``: its ``status``, every agent right under ``reward_mode=all``)."""
    info = row["info"]
    return bool(info.get("team_correct", info.get("status") == "passed"))


def answer_stats(rows: list[dict[str, Any]], turns: int) -> dict[str, Any]:
    """Team and per-agent exact-answer rates of the first and the last turn's joint actions,
    and for debates (``turns > 1``) what the rounds changed.

    A last-turn joint action is compared with the first-turn joint action it continues
    (through ``parent``: a node's index into the joint actions of the turn before, in the
    same rollout batch; a batch starts where the turn goes back to 0). ``first_disagree``: the fraction of
    first-turn joint actions whose agents gave different values (or not all gave one);
    ``changed``, ``turned_right``, ``turned_wrong``: per final answer of an agent, the
    fraction whose value differs from its first answer / went from wrong to right / from
    right to wrong.
    """
    batches: list[list[dict[str, Any]]] = []
    for row in rows:
        if row["turn"] == 0 and (not batches or batches[-1][-1]["turn"] != 0):
            batches.append([])
        batches[-1].append(row)
    first = [r for r in rows if r["turn"] == 0]
    last = [r for r in rows if r["turn"] == turns - 1]
    agents = len(first[0]["info"]["correct"])

    def rates(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "team": sum(team_right(r) for r in rs) / len(rs),
            "agents": [
                sum(bool(r["info"]["correct"][a]) for r in rs) / len(rs) for a in range(agents)
            ],
            "joint_actions": len(rs),
        }

    out: dict[str, Any] = {"first": rates(first), "final": rates(last)}
    if turns > 1:
        pairs = []
        for batch in batches:
            by_turn = [[r for r in batch if r["turn"] == t] for t in range(turns)]
            for r in by_turn[-1]:
                anc = r
                while anc["turn"] > 0:  # parent: the joint action's index in the turn before
                    anc = by_turn[anc["turn"] - 1][int(anc["parent"])]
                pairs.append((anc, r))
        finals = [(a, f0, f1) for f0, f1 in pairs for a in range(agents)]
        n = max(1, len(finals))
        out["first_disagree"] = sum(
            None in f["info"]["values"] or len(set(map(str, f["info"]["values"]))) > 1
            for f in first
        ) / len(first)
        out["changed"] = (
            sum(f0["info"]["values"][a] != f1["info"]["values"][a] for a, f0, f1 in finals) / n
        )
        out["turned_right"] = (
            sum(not f0["info"]["correct"][a] and f1["info"]["correct"][a] for a, f0, f1 in finals)
            / n
        )
        out["turned_wrong"] = (
            sum(f0["info"]["correct"][a] and not f1["info"]["correct"][a] for a, f0, f1 in finals)
            / n
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="a .gguf file, folder or Hub id")
    ap.add_argument(
        "--agent-model",
        action="append",
        default=[],
        help="agent i's model (repeat per agent, e.g. a run's final/agent_0 and final/agent_1; "
        "agent i of a larger team takes the (i mod n)-th); default: --model for every agent",
    )
    ap.add_argument("--level", default="mul", help="task.kwargs.level of both tasks")
    ap.add_argument(
        "--task-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another task.kwargs.KEY=VALUE of both tasks (repeatable), e.g. ops=2",
    )
    ap.add_argument(
        "--example",
        action="append",
        default=[],
        help="task.kwargs.example: true, false or a level (repeatable: each configuration once "
        "per value); default: the tasks' own",
    )
    ap.add_argument("--limit", type=int, default=24, help="test problems per configuration")
    ap.add_argument("--rounds", type=int, default=1, help="debate rounds after the first answer")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--sampled",
        type=int,
        default=0,
        metavar="K",
        help="K sampled joint actions per problem (0: greedy, the default)",
    )
    ap.add_argument(
        "--temperature", type=float, default=0.7, help="sampling temperature (--sampled)"
    )
    ap.add_argument("--batch-size", type=int, default=4, help="problems per rollout call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each eval")
    ap.add_argument("--only", default=None, help="run only configurations whose name holds this")
    ap.add_argument("--out", default="benchmarks/results/tool_baselines.json")
    args = ap.parse_args()

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    mode = f"sampled (k={args.sampled}, T={args.temperature:g})" if args.sampled else "greedy"
    result: dict[str, Any] = {
        "what": f"{'trained agents' if args.agent_model else 'untrained real instruct LLM'} on "
        f"tool_math and debate_math, {mode}, held-out test split: with and without the "
        "sandboxed Python tool, 1-3 debating agents",
        "machine": machine_info(args.threads, load_average_1m_at_start=os.getloadavg()[0]),
        "commit": git_commit(REPO),
        "settings": vars(args),
        "rows": [],
    }
    work = Path(tempfile.mkdtemp(prefix="tool-baselines-"))
    examples: list[str | None] = list(args.example) or [None]
    for cfg, example in itertools.product(configurations(args.rounds), examples):
        name = cfg["name"] if example is None else f"{cfg['name']}, example={example}"
        if args.only and args.only not in name:
            continue
        out_dir = work / f"{len(result['rows'])}"
        kwargs = [f"task.kwargs.{k}={str(v).lower()}" for k, v in cfg["kwargs"].items()]
        kwargs.append(f"task.kwargs.level={args.level}")
        kwargs += [f"task.kwargs.{kv}" for kv in args.task_kwarg]
        if example is not None:
            kwargs.append(f"task.kwargs.example={example}")
        models = args.agent_model or [args.model]
        cmd = [comlrl_exe(), "eval"]
        cmd += [a for i in range(cfg["agents"]) for a in ("--model", models[i % len(models)])]
        cmd += [
            f"task.name={cfg['task']}",
            *kwargs,
            f"num_agents={cfg['agents']}",
            f"num_turns={cfg['turns']}",
            f"max_new_tokens={args.max_new_tokens}",
            f"eval_limit={args.limit}",
        ]
        if args.sampled:
            cmd += [
                "eval_greedy=false",
                f"eval_num_samples={args.sampled}",
                f"temperature={args.temperature:g}",
                f"batch_size={args.batch_size}",
                f"seed={args.seed}",
            ]
        else:
            cmd.append("eval_greedy=true")
        cmd += ["--output-dir", str(out_dir)]
        print(f"$ OMP_NUM_THREADS={args.threads} " + shlex.join(cmd), flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-3000:])
            raise SystemExit(f"comlrl eval failed ({done.returncode}) for {name}")
        row = json.loads((out_dir / "eval.jsonl").read_text().splitlines()[-1])
        last = cfg["turns"] - 1
        entry = {
            **cfg,
            "name": name,
            "example": example,
            "command": shlex.join(cmd),
            "wall_s": round(time.perf_counter() - t0, 1),
            "reward_mean_first_turn": row.get("reward_mean"),
            "reward_mean_last_turn": row.get(f"turn_{last}/reward_mean", row.get("reward_mean")),
            "pass@1": row.get("pass@1"),
            "answers": answer_stats(eval_rows(out_dir), cfg["turns"]),
            "tool_calls_mean": [
                v for k, v in sorted(row.items()) if k.startswith("tool_calls_mean/")
            ],
            "tool_error_fraction": row.get("tool_error_fraction"),
            "eval_row": row,
        }
        result["rows"].append(entry)
        ans = entry["answers"]
        print(
            f"  {name}: team right, first answers {ans['first']['team']:.3f}, final "
            f"{ans['final']['team']:.3f} ({entry['wall_s']} s)",
            flush=True,
        )
    result["machine"]["load_average_1m_at_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        "\n| configuration | team right, first answers | team right, final answers | "
        "each agent right, first -> final | first answers disagree | changed / turned right / "
        "turned wrong | tool calls per completion |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for e in result["rows"]:
        ans = e["answers"]
        calls = ", ".join(f"{c:.2f}" for c in e["tool_calls_mean"]) or "-"
        agents = ", ".join(
            f"{a:.2f} -> {b:.2f}"
            for a, b in zip(ans["first"]["agents"], ans["final"]["agents"], strict=True)
        )
        debate = "-"
        moves = "-"
        if "first_disagree" in ans:
            debate = f"{ans['first_disagree']:.2f}"
            moves = f"{ans['changed']:.2f} / {ans['turned_right']:.2f} / {ans['turned_wrong']:.2f}"
        print(
            f"| {e['name']} | {ans['first']['team']:.3f} | {ans['final']['team']:.3f} | "
            f"{agents} | {debate} | {moves} | {calls} |"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
