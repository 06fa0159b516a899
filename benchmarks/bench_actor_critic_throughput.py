"""Actor-critic training throughput and learning: our IAC/MAAC recipes vs CoMLRL 1.4.3, in one run.

Both sides train two stories260k agents (the same local folder; separate critics loaded
from it too) on the cooperative story task of ``benchmarks/_story_reward.py`` (the same file
on both sides: prompts, joint reward and CoMLRL's ``external_transition``) with
``num_turns=2``, ``G=1`` (one trajectory per prompt, as CoMLRL's multi-turn actor-critic
requires), ``critic_type="v"``, temperature 1.0, ``max_new_tokens``, actor and critic lr,
value-loss coefficient 0.6, discount 1, per-agent advantage whitening, no early
termination, the examples in the same order, after the same warm-up steps. The advantage is
the one-step TD error ``r_t + V(s_{t+1}) - V(s_t)`` on both sides (ours: GAE with
``lambda = 0``), and the critic regresses on the same one-step target. One step =
``batch_size`` prompts with both turns and every agent's (and critic's) update. CoMLRL 1.4.3
runs in its own venv through ``benchmarks/_comlrl143_actor_critic_side.py``.

Differences that remain (by design of each library): per step, CoMLRL 1.4.3 takes one actor
and one critic optimizer step per agent *per turn* (its buffers are trained turn by turn;
MAAC's shared critic steps once per agent per turn), we take one per agent over both turns
(and MAAC's critic one); CoMLRL 1.4.3 samples one prompt at a time, we batch every prompt of
a turn into one ``generate`` per agent.

Metrics: prompts per second (timed after the warm-up) and learning: the mean joint reward
of turn 2 over the first and the last quarter of the measured steps, per side.

Usage (from the repo root)::

    /work/venv/bin/python benchmarks/bench_actor_critic_throughput.py \
        --comlrl143-python /work/venv-comlrl143/bin/python

Writes ``benchmarks/results/actor_critic_throughput.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("TQDM_DISABLE", "1")
from _bench_common import git_commit, machine_info, run_side  # noqa: E402

TARGET_SPEEDUP = 5.0


def _quarters(values: list[float]) -> dict[str, float]:
    q = max(1, len(values) // 4)
    first, last = sum(values[:q]) / q, sum(values[-q:]) / q
    return {"first_quarter": first, "last_quarter": last, "rise": last - first}


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(torch.device(device))}, torch {torch.__version__}"
    return platform.processor() or platform.machine()


def run_ours(
    args: argparse.Namespace, method: str, examples: list[dict[str, Any]]
) -> dict[str, Any]:
    import torch
    from _story_reward import agent_prompt, story_reward, transition
    from comlrl.algos import HFAgent, load_model_and_tokenizer
    from comlrl.algos.recipes.actor_critic.recipe import ActorCriticConfig, IACTrainer, MAACTrainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    b = args.batch_size
    cfg = ActorCriticConfig(
        models=[args.model],
        num_agents=2,
        num_turns=2,
        num_generations=1,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        learning_rate=args.learning_rate,
        critic_learning_rate=args.learning_rate,
        value_loss_coef=0.6,
        gamma=1.0,
        gae_lambda=0.0,
        critic_type="v",
        advantage_normalization=True,
        batch_size=b,
        seed=args.seed,
        device=args.device,
        shuffle=False,
        log_samples=0,
        progress=False,
        reward_curve=False,
        output_dir=tempfile.mkdtemp(prefix="comlrl-ac-"),
    )
    agents = [HFAgent(*load_model_and_tokenizer(args.model), name=f"agent_{i}") for i in range(2)]
    cls = IACTrainer if method == "iac" else MAACTrainer
    trainer = cls(
        agents,
        cfg,
        dataset=examples,
        formatters=[lambda ex: agent_prompt(ex, 0), lambda ex: agent_prompt(ex, 1)],
        reward_func=lambda c1, c2, example: story_reward(c1, c2, example),
        transition=transition,
    )
    for _ in range(args.warmup):
        trainer.step()
    history = []
    c0 = os.times()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        history.append(trainer.step().row)
    wall = time.perf_counter() - t0
    c1 = os.times()
    trainer.close()
    keys = {
        "generate": "time/generate_s",
        "reward": "time/reward_s",
        "transition": "time/transition_s",
        "critic_values": "time/critic_values_s",
        "update": "time/update_s",
    }
    stage = {
        name: sum(h.get(k, 0.0) for h in history) / args.steps
        for name, k in keys.items()
        if k in history[0]
    }
    curve = {f"turn_{t}": [h[f"turn_{t}/reward_mean"] for h in history] for t in (0, 1)}
    return {
        "side": "ours",
        "method": method,
        "prompts": args.steps * b,
        "wall_s": wall,
        "prompts_per_s": args.steps * b / wall,
        "step_s": wall / args.steps,
        "stage_s_per_step": stage,
        "reward_curve_by_turn": curve,
        "cpu_s": (c1.user - c0.user) + (c1.system - c0.system),
    }


def run_theirs(
    args: argparse.Namespace, method: str, examples_path: Path, work: Path
) -> dict[str, Any]:
    spec = {
        "method": method,
        "model_dir": args.model,
        "examples_path": str(examples_path),
        "batch_size": args.batch_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "num_turns": 2,
        "max_new_tokens": args.max_new_tokens,
        "temperature": 1.0,
        "learning_rate": args.learning_rate,
        "critic_learning_rate": args.learning_rate,
        "value_loss_coef": 0.6,
        "critic_type": "v",
        "seed": args.seed,
        "threads": args.threads,
        "device": args.device,
    }
    script = REPO / "benchmarks" / "_comlrl143_actor_critic_side.py"
    return run_side(args.comlrl143_python, script, spec, work, method, quiet=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--comlrl143-python", help="python of a venv with comlrl==1.4.3 (omit: ours only)"
    )
    parser.add_argument("--model", default=str(REPO.parent / "shared" / "models" / "stories260k"))
    parser.add_argument("--methods", default="iac,maac")
    parser.add_argument(
        "--batch-sizes",
        default="4,16",
        help="prompts per step, comma-separated (4: CoMLRL 1.4.3's default buffer of 8 samples)",
    )
    parser.add_argument("--steps", type=int, default=24, help="measured steps per side")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    parser.add_argument(
        "--device",
        default="cpu",
        help="where both sides put agents and critics (cpu, cuda): ours `device=`, CoMLRL "
        "1.4.3's agent_devices/critic_devices",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output", default=str(REPO / "benchmarks" / "results" / "actor_critic_throughput.json")
    )
    args = parser.parse_args(argv)
    sys.path[:0] = [
        str(REPO / "packages" / p / "src")
        for p in ("comlrl-core", "comlrl-algos", "comlrl-envs", "comlrl-kernels")
    ]
    from _story_reward import story_examples

    rows: list[dict[str, Any]] = []

    def write_result() -> None:
        result = {
            "benchmark": "actor-critic (IAC, MAAC; V critic, separate critics) throughput and "
            f"learning, T=2, G=1, stories260k x2, story task, {args.device}",
            "command": " ".join([Path(sys.executable).as_posix(), *sys.argv]),
            "target_speedup": TARGET_SPEEDUP,
            "setup": {
                k: v for k, v in vars(args).items() if k not in ("comlrl143_python", "batch_size")
            },
            "rows": rows,
            "machine": machine_info(args.threads, device=_device_name(args.device)),
            "git_commit": git_commit(REPO),
        }
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2))

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for b, method in (
            (int(b), m) for b in args.batch_sizes.split(",") for m in args.methods.split(",")
        ):
            args.batch_size = b
            examples = story_examples((args.warmup + args.steps) * b, args.seed)
            examples_path = work / "examples.json"
            examples_path.write_text(json.dumps(examples))
            ours = {**run_ours(args, method, examples), "loadavg": os.getloadavg()}
            ours["learning_turn_2"] = _quarters(ours["reward_curve_by_turn"]["turn_1"])
            row: dict[str, Any] = {
                "method": method,
                "batch_size": b,
                "ours": ours,
                "comlrl143": None,
            }
            if args.comlrl143_python:
                theirs = {
                    **run_theirs(args, method, examples_path, work),
                    "loadavg": os.getloadavg(),
                }
                theirs["learning_turn_2"] = _quarters(theirs["reward_curve_by_turn"]["turn_1"])
                row["comlrl143"] = theirs
                row["speedup_prompts_per_s"] = ours["prompts_per_s"] / theirs["prompts_per_s"]
                row["speedup_cpu_s"] = theirs["cpu_s"] / ours["cpu_s"]
            rows.append(row)
            print(
                json.dumps(
                    {
                        "method": method,
                        "batch_size": b,
                        "ours_prompts_per_s": ours["prompts_per_s"],
                        "theirs_prompts_per_s": (row["comlrl143"] or {}).get("prompts_per_s"),
                        "speedup": row.get("speedup_prompts_per_s"),
                    }
                ),
                flush=True,
            )
            write_result()  # after every row: a run stopped part-way keeps its rows
    print(
        f"{'method':>6} {'batch':>5} {'ours p/s':>9} {'1.4.3 p/s':>9} {'x':>6} "
        f"{'ours turn-2 reward':>20} {'1.4.3 turn-2 reward':>20}"
    )
    for r in rows:
        o, t = r["ours"], r["comlrl143"] or {}
        lo = o["learning_turn_2"]
        lt = t.get("learning_turn_2", {"first_quarter": float("nan"), "last_quarter": float("nan")})
        print(
            f"{r['method']:>6} {r['batch_size']:>5} {o['prompts_per_s']:>9.3f} {t.get('prompts_per_s', float('nan')):>9.3f} "
            f"{r.get('speedup_prompts_per_s', float('nan')):>6.2f} "
            f"{lo['first_quarter']:>9.3f}->{lo['last_quarter']:<9.3f} "
            f"{lt['first_quarter']:>9.3f}->{lt['last_quarter']:<9.3f}"
        )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
