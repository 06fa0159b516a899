"""Issue 36's GPU benchmark: decoding, the update, MAGRPO through CoMLRL 1.4.3's API, and
many LoRA agents on one base, with every target of the issue as a ratio and a verdict.

Models: random-initialised ``Qwen2ForCausalLM`` s with the layer shapes of Qwen2.5-0.5B
and Qwen2.5-1.5B (bfloat16 on the GPU; speed does not depend on the weights, so no
weights travel), with the Qwen2 tokenizer read from ``--tokenizer`` (the checkout travels
to the GPU machine, ``../shared`` does not: copy ``../shared/data/qwen2_tokenizer`` into
the ignored ``.gpu/`` folder first; ``benchmarks/GPU_RUNBOOK.md``).

Phases (``--phases``; the JSON is rewritten after each, and a phase that would start past
``--budget-s`` is recorded as not measured):

1. ``bounds``: the device's copy bandwidth (a 1 GiB device-to-device copy) and bfloat16
   matmul rate (8192^3), best of a few.
2. ``decode``: per shape, milliseconds per decode step for 16 rows (4 prompts x 4
   completions, 64-token prompts) x 128 new tokens: ours (``NativeSampler``: the step
   captured as a CUDA graph), ``generate`` with its dynamic cache, ``generate`` with
   ``cache_implementation="static"`` (compiled by transformers on CUDA; its warm-up time
   is recorded), and the weights-bandwidth bound (every weight byte read once per step).
   A step's time is ``(t(128 tokens) - t(1 token)) / 127``, best of three (the prefill and
   first token cancel). At the 1.5B shape also a LoRA agent (r = 16 on q, k, v, o) against
   its base without adapters.
3. ``update``: one ``update_policy`` (full weights, RAdam) on those 16 completions of the
   0.5B shape, milliseconds (best of three after a warm-up), against its bound:
   ``6 x linear parameters x tokens`` (the prompt once per group, every completion slot;
   attention's own FLOPs, ~2% here, left out) at the measured matmul rate, plus the
   optimizer's and clipping's bytes (20 per parameter in bfloat16) at the copy bandwidth.
4. ``compat``: seconds per prompt of one MAGRPO script written against CoMLRL 1.4.3's
   API (``_magrpo_143_api.py``: 2 agents, 4 completions, 128 new tokens, 2 prompts per
   step), run with our ``comlrl-compat`` and, with ``--comlrl143-site``, with CoMLRL
   1.4.3, per shape, each in its own process.
5. ``agents``: MAGRPO step time (mean of the measured steps after a warm-up) and CUDA peak
   memory of 1, 2, 4 and 8 agents as LoRA adapters (r = 16) of the 1.5B-shape base.
6. ``targets``: the issue's targets as ratios, each with ``pass`` (``None``: not measured;
   always ``None`` in a dry run).

``--dry-run`` runs every phase on the CPU with a tiny Qwen2 shape (same tokenizer, 8 new
tokens, agents 1 and 2, no compiled ``generate``) in about a minute; CI runs it
(``tests/test_gpu_bench_dry_run.py``).

Usage, on the GPU machine from the repository root (``benchmarks/GPU_RUNBOOK.md``)::

    python benchmarks/gpu_bench.py --tokenizer .gpu/qwen2_tokenizer \\
        --comlrl143-site .gpu/site143 --out benchmarks/results/gpu_bench.json
    python benchmarks/gpu_bench.py --dry-run --tokenizer ../shared/data/qwen2_tokenizer \\
        --out /tmp/gpu_bench_dry.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER = REPO / ".gpu" / "qwen2_tokenizer"

#: Layer shapes of the released models (their config.json), plus a tiny one for dry runs.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}
COMMON: dict[str, Any] = dict(
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
)

#: The issue's targets: (name, the ratio's key, comparison, bound).
TARGETS = [
    ("decode_vs_generate_static_0.5b", "<=", 0.5),
    ("decode_vs_generate_static_1.5b", "<=", 0.5),
    ("decode_vs_bandwidth_bound_1.5b", "<=", 4.0),
    ("update_vs_bound_0.5b", "<=", 3.0),
    ("e2e_comlrl143_over_ours_0.5b", ">=", 8.0),
    ("e2e_comlrl143_over_ours_1.5b", ">=", 6.0),
    ("agents8_step_over_agents1", "<=", 2.5),
    ("agents8_peak_memory_over_agents1", "<=", 1.5),
    ("lora_decode_over_base_decode_1.5b", "<=", 1.3),
]


# --------------------------------------------------------------------------- models


def load_tokenizer(path: str | Path) -> Any:
    """The Qwen2 tokenizer from a local folder (a pad token set to EOS where it has none).

    Raises:
        FileNotFoundError: the folder has no tokenizer files (say how to copy them).
    """
    from transformers import AutoTokenizer

    folder = Path(path)
    if not (folder / "tokenizer_config.json").is_file():
        raise FileNotFoundError(
            f"no tokenizer at {str(folder)!r}: copy ../shared/data/qwen2_tokenizer there "
            "(cp -r ../shared/data/qwen2_tokenizer .gpu/) or pass --tokenizer"
        )
    tok = AutoTokenizer.from_pretrained(str(folder))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def build_model(shape: str, tok: Any, device: torch.device, seed: int = 0) -> Any:
    """A random-initialised ``Qwen2ForCausalLM`` of ``shape`` on ``device`` (bfloat16 on
    CUDA, float32 elsewhere), in eval mode."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos = int(tok.eos_token_id)
    cfg = Qwen2Config(**SHAPES[shape], **COMMON, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    with torch.device(device):
        model: Any = Qwen2ForCausalLM(cfg)
    if device.type == "cuda":
        model = model.to(dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=tok.pad_token_id)
    return model.eval()


def prompt_ids(n: int, length: int, seed: int, device: torch.device) -> torch.Tensor:
    """``[n, length]`` random token ids of ordinary (non-special) tokens."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1000, 150000, (n, length), generator=g).to(device)


def prompt_texts(tok: Any, n: int, length: int, seed: int) -> list[str]:
    """``n`` prompts: random ordinary tokens decoded to text (about ``length`` tokens)."""
    return [tok.decode(row) for row in prompt_ids(n, length, seed, torch.device("cpu")).tolist()]


def side_reward(*completions: list[str]) -> list[float]:
    """A cheap joint reward (length residues), the same for every side and agent count."""
    return [
        float(sum(len(c) % (5 + i) for i, c in enumerate(row))) / 10 for row in zip(*completions)
    ]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: timed calls per measurement (best of them): 3, or 1 in a dry run (its numbers say nothing)
_REPEATS = {"n": 3}


def _best(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Best wall seconds of ``repeats`` calls of ``fn`` (synchronised)."""
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _param_bytes(model: Any) -> int:
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


# --------------------------------------------------------------------------- phases


def phase_bounds(ctx: dict[str, Any]) -> dict[str, Any]:
    """Copy bandwidth (bytes read + written per second) and bfloat16 matmul rate."""
    device = ctx["device"]
    size = 2**30 if device.type == "cuda" else 2**26
    x = torch.empty(size, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    copy_s = _best(lambda: y.copy_(x), device, 5)
    n = 8192 if device.type == "cuda" else 512
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    mm_s = _best(lambda: a @ b, device, 5)
    return {
        "copy_bandwidth_gb_s": 2 * size / copy_s / 1e9,
        "matmul_tflop_s": 2 * n**3 / mm_s / 1e12,
        "matmul_dtype": str(dtype),
    }


def _ours_step_ms(
    model: Any, ids: torch.Tensor, g: int, tokens: int, device: torch.device
) -> dict[str, Any]:
    from comlrl.algos.rollout.sampling.native import NativeSampler
    from comlrl.core import SamplingParams

    sampler = NativeSampler(model, pad_token_id=0, eos_token_ids=[], name="bench")
    mask = torch.ones_like(ids)
    gen = torch.Generator(device=device).manual_seed(0)
    full = SamplingParams(num_generations=g, max_new_tokens=tokens)
    one = SamplingParams(num_generations=g, max_new_tokens=1)
    with torch.no_grad():
        sampler.sample(ids, mask, full, gen)  # the fast step's check (eager)
        sampler.sample(ids, mask, full, gen)  # warm-up of the fixed-shape loop
        t_full = _best(lambda: sampler.sample(ids, mask, full, gen), device, _REPEATS["n"])
        t_one = _best(lambda: sampler.sample(ids, mask, one, gen), device, _REPEATS["n"])
    return {
        "ms_per_step": 1000 * (t_full - t_one) / (tokens - 1),
        "s_call": t_full,
        "decode_loop": sampler.decode_loop_status,
        "fast_decode": sampler.fast_decode_status,
    }


def _generate_step_ms(
    model: Any, ids: torch.Tensor, g: int, tokens: int, device: torch.device, **kw: Any
) -> dict[str, Any]:
    mask = torch.ones_like(ids)
    pad = int(model.generation_config.pad_token_id or 0)

    def run(n: int) -> Any:
        with torch.no_grad():
            return model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                max_new_tokens=n,
                min_new_tokens=n,
                num_return_sequences=g,
                pad_token_id=pad,
                **kw,
            )

    t0 = time.perf_counter()
    run(tokens)
    run(1)
    _sync(device)
    warm = time.perf_counter() - t0
    t_full = _best(lambda: run(tokens), device, _REPEATS["n"])
    t_one = _best(lambda: run(1), device, _REPEATS["n"])
    return {"ms_per_step": 1000 * (t_full - t_one) / (tokens - 1), "warmup_s": warm}


def phase_decode(ctx: dict[str, Any]) -> dict[str, Any]:
    device, tok = ctx["device"], ctx["tokenizer"]
    tokens, prompts, g = ctx["new_tokens"], 4, 4
    out: dict[str, Any] = {"rows": prompts * g, "new_tokens": tokens, "prompt_tokens": 64}
    bw = ctx["results"].get("bounds", {}).get("copy_bandwidth_gb_s")
    for shape in ctx["shapes"]:
        if ctx["time_left"]() < 30:
            out[shape] = "not measured: out of time"
            continue
        model = build_model(shape, tok, device)
        ids = prompt_ids(prompts, 64, 1, device)
        row: dict[str, Any] = {"param_bytes": _param_bytes(model)}
        row["ours"] = _ours_step_ms(model, ids, g, tokens, device)
        row["generate_dynamic"] = _generate_step_ms(model, ids, g, tokens, device)
        if ctx["dry_run"]:
            row["generate_static_compiled"] = (
                "skipped in the dry run (compilation takes minutes on CPU)"
            )
        else:
            row["generate_static_compiled"] = _generate_step_ms(
                model, ids, g, tokens, device, cache_implementation="static"
            )
        if bw:
            # copy_bandwidth counts bytes read + written; a step only reads the weights
            row["bandwidth_bound_ms"] = 1000 * row["param_bytes"] / (bw * 1e9 / 2)
        if shape == ctx["lora_shape"]:
            row["lora_r16"] = _lora_decode(model, tok, ids, g, tokens, device)
        out[shape] = row
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def _lora_decode(
    model: Any, tok: Any, ids: torch.Tensor, g: int, tokens: int, device: torch.device
) -> dict[str, Any]:
    """One LoRA agent (r = 16 on q, k, v, o) of ``model``: its decode step against the base's."""
    from comlrl.algos.models.lora import LoraSettings, attach_lora
    from comlrl.algos.rollout.agent import HFAgent

    agent = HFAgent(model, tok, name="lora")
    attach_lora([agent], LoraSettings(r=16, alpha=32), seed=0)
    got = _ours_step_ms(agent.model, ids, g, tokens, device)
    return got


def phase_update(ctx: dict[str, Any]) -> dict[str, Any]:
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.training.update.agents import build_optimizer
    from comlrl.algos.training.update.policy import update_policy
    from comlrl.algos.training.update.settings import UpdateSettings
    from comlrl.core import SamplingParams

    device, tok = ctx["device"], ctx["tokenizer"]
    shape = ctx["shapes"][0]
    model = build_model(shape, tok, device)
    never = [model.config.vocab_size - 1]  # an unused id: every row runs its 128 tokens
    agent = HFAgent(model, tok, eos_token_ids=never, name="update")
    agent.seed(0)
    params = SamplingParams(num_generations=4, max_new_tokens=ctx["new_tokens"])
    batch = agent.sample(prompt_texts(tok, 4, 64, seed=2), params).batch
    adv = torch.linspace(-1, 1, batch.completion_mask.shape[0], device=device)
    opt = build_optimizer(model.parameters(), "radam", lr=1e-6)
    settings = UpdateSettings()

    def update() -> Any:
        return update_policy(model, opt, [batch], [adv], settings)

    update()
    seconds = _best(update, device, _REPEATS["n"])
    layers = model.model.layers
    n_lin = sum(
        m.weight.numel()
        for layer in layers
        for m in layer.modules()
        if isinstance(m, torch.nn.Linear)
    )
    n_head = model.lm_head.weight.numel()
    prompt_tokens = int(batch.attention_mask[:: batch.group_size, : batch.prompt_length].sum())
    completion_slots = int(batch.completion_mask.numel())
    fwd = 2 * n_lin * (prompt_tokens + completion_slots) + 2 * n_head * completion_slots
    flops = 3 * fwd + 2 * n_head * completion_slots  # backward 2x, the fused head recomputed
    n_params = sum(p.numel() for p in model.parameters())
    optimizer_bytes = 20 * n_params if device.type == "cuda" else 40 * n_params
    bounds = ctx["results"].get("bounds", {})
    out: dict[str, Any] = {
        "shape": shape,
        "rows": int(batch.completion_mask.shape[0]),
        "prompt_tokens": prompt_tokens,
        "completion_slots": completion_slots,
        "update_ms": 1000 * seconds,
        "flops": flops,
        "optimizer_bytes": optimizer_bytes,
        "optimizer": type(opt).__name__,
    }
    if bounds:
        out["bound_ms"] = 1000 * (
            flops / (bounds["matmul_tflop_s"] * 1e12)
            + optimizer_bytes / (bounds["copy_bandwidth_gb_s"] * 1e9 / 2)
        )
    return out


def phase_compat(ctx: dict[str, Any]) -> dict[str, Any]:
    """Seconds per prompt of the 1.4.3-API MAGRPO script, ours and (with a site) 1.4.3."""
    out: dict[str, Any] = {}
    script = Path(__file__).resolve().parent / "_magrpo_143_api.py"
    sides: dict[str, str | None] = {"ours": None}
    if ctx["comlrl143_site"]:
        sides["comlrl_1_4_3"] = str(Path(ctx["comlrl143_site"]).resolve())
    for shape in ctx["shapes"]:
        row: dict[str, Any] = {}
        for side, site in sides.items():
            if ctx["time_left"]() < 40:
                row[side] = "not measured: out of time"
                continue
            spec = {
                "shape": shape,
                "tokenizer": str(ctx["tokenizer_path"]),
                "device": str(ctx["device"]),
                "batch": 2,
                "G": 4,
                "max_new_tokens": ctx["new_tokens"],
                "warmup_prompts": 2,
                "prompts": 2 if ctx["dry_run"] else 4,
            }
            row[side] = _run_side(script, spec, site, limit=ctx["time_left"]() - 10)
        if "comlrl_1_4_3" not in sides:
            row["comlrl_1_4_3"] = "not measured: no --comlrl143-site"
        out[shape] = row
    return out


def _run_side(script: Path, spec: dict[str, Any], site: str | None, limit: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        sp, op = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        sp.write_text(json.dumps(spec))
        env = {
            **os.environ,
            "TQDM_DISABLE": "1",
            "WANDB_MODE": "disabled",
            "TOKENIZERS_PARALLELISM": "false",
        }
        if site:
            env["PYTHONPATH"] = os.pathsep.join([site, str(script.parent)])
        try:
            proc = subprocess.run(
                [sys.executable, str(script), "--spec", str(sp), "--out", str(op)],
                env=env,
                capture_output=True,
                text=True,
                timeout=max(10.0, limit),
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {max(10.0, limit):.0f} s"}
        if proc.returncode != 0:
            return {"error": proc.stderr[-3000:]}
        return dict(json.loads(op.read_text()))


def phase_agents(ctx: dict[str, Any]) -> dict[str, Any]:
    """MAGRPO steps of 1, 2, 4, 8 LoRA agents of one base: step time and peak memory."""
    from comlrl.algos import HFAgent, MAGRPOTrainer, TrainConfig

    device, tok = ctx["device"], ctx["tokenizer"]
    shape = ctx["lora_shape"]
    out: dict[str, Any] = {"shape": shape, "lora_r": 16, "batch_size": 2, "G": 4}
    texts = prompt_texts(tok, 16, 48, seed=4)
    data = [{"id": i, "text": t} for i, t in enumerate(texts)]
    for n in ctx["agent_counts"]:
        if ctx["time_left"]() < 30:
            out[str(n)] = "not measured: out of time"
            continue
        model = build_model(shape, tok, device)
        agents = [HFAgent(model, tok, name=f"agent_{i}") for i in range(n)]
        cfg = TrainConfig(
            num_agents=n,
            num_steps=10**6,
            batch_size=2,
            num_generations=4,
            max_new_tokens=ctx["new_tokens"],
            learning_rate=1e-5,
            device=str(device),
            lora={"r": 16, "alpha": 32},
            output_dir=tempfile.mkdtemp(prefix="gpu_bench_agents_"),
            progress=False,
            log_samples=0,
            reward_curve=False,
        )
        trainer = MAGRPOTrainer(
            agents,
            cfg,
            dataset=data,
            reward_func=side_reward,
            formatters=[lambda ex: ex["text"]] * n,
        )
        trainer.train_step()  # warm-up: the fast step's check, the graph
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        rows = [trainer.train_step() for _ in range(ctx["agent_steps"])]
        _sync(device)
        out[str(n)] = {
            "step_s": (time.perf_counter() - t0) / len(rows),
            "generate_s": sum(r["time/generate_s"] for r in rows) / len(rows),
            "update_s": sum(r["time/update_s"] for r in rows) / len(rows),
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30
            if device.type == "cuda"
            else None,
        }
        trainer.close()
        del trainer, agents, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def targets(
    results: dict[str, Any], shapes: list[str], lora_shape: str, *, dry_run: bool = False
) -> dict[str, Any]:
    """Every target of the issue as ``{ratio, target, pass}`` (``pass`` None: not measured,
    or a dry run, whose ratios say nothing about a GPU)."""

    def get(*keys: Any) -> Any:
        node: Any = results
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return None
            node = node[k]
        return node if isinstance(node, (int, float)) else None

    small, large = shapes[0], shapes[-1]
    ratios: dict[str, float | None] = {}

    def ratio(a: Any, b: Any) -> float | None:
        return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None

    for label, shape in (("0.5b", small), ("1.5b", large)):
        ours = get("decode", shape, "ours", "ms_per_step")
        ratios[f"decode_vs_generate_static_{label}"] = ratio(
            ours, get("decode", shape, "generate_static_compiled", "ms_per_step")
        )
        ratios[f"e2e_comlrl143_over_ours_{label}"] = ratio(
            get("compat", shape, "comlrl_1_4_3", "s_per_prompt"),
            get("compat", shape, "ours", "s_per_prompt"),
        )
    ratios["decode_vs_bandwidth_bound_1.5b"] = ratio(
        get("decode", large, "ours", "ms_per_step"), get("decode", large, "bandwidth_bound_ms")
    )
    ratios["update_vs_bound_0.5b"] = ratio(get("update", "update_ms"), get("update", "bound_ms"))
    ratios["agents8_step_over_agents1"] = ratio(
        get("agents", "8", "step_s"), get("agents", "1", "step_s")
    )
    ratios["agents8_peak_memory_over_agents1"] = ratio(
        get("agents", "8", "peak_memory_gib"), get("agents", "1", "peak_memory_gib")
    )
    ratios["lora_decode_over_base_decode_1.5b"] = ratio(
        get("decode", lora_shape, "lora_r16", "ms_per_step"),
        get("decode", lora_shape, "ours", "ms_per_step"),
    )
    out = {}
    for name, op, bound in TARGETS:
        value = ratios.get(name)
        ok = (
            None if value is None or dry_run else (value <= bound if op == "<=" else value >= bound)
        )
        out[name] = {"ratio": value, "target": f"{op} {bound}", "pass": ok}
    return out


PHASES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "bounds": phase_bounds,
    "decode": phase_decode,
    "update": phase_update,
    "compat": phase_compat,
    "agents": phase_agents,
}


def build_parser() -> argparse.ArgumentParser:
    """The script's options."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="runs/gpu_bench/gpu_bench.json", help="the JSON written")
    p.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="the Qwen2 tokenizer folder")
    p.add_argument("--comlrl143-site", default=None, help="a folder holding comlrl==1.4.3")
    p.add_argument("--dry-run", action="store_true", help="CPU, a tiny shape, about a minute")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated phases to run")
    p.add_argument("--budget-s", type=float, default=330.0, help="start no phase part after this")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    t_start = time.perf_counter()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dry = bool(args.dry_run)
    device = torch.device("cpu" if dry or not torch.cuda.is_available() else "cuda")
    if not dry and device.type != "cuda":
        print("no CUDA device: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    if dry:
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
        _REPEATS["n"] = 1
    tok = load_tokenizer(args.tokenizer)
    shapes = ["tiny"] if dry else ["qwen2.5-0.5b", "qwen2.5-1.5b"]
    ctx: dict[str, Any] = {
        "device": device,
        "dry_run": dry,
        "tokenizer": tok,
        "tokenizer_path": Path(args.tokenizer),
        "shapes": shapes,
        "lora_shape": shapes[-1],
        "new_tokens": 8 if dry else 128,
        "agent_counts": [1, 2] if dry else [1, 2, 4, 8],
        "agent_steps": 1 if dry else 2,
        "comlrl143_site": args.comlrl143_site,
        "time_left": lambda: args.budget_s - (time.perf_counter() - t_start),
    }
    results: dict[str, Any] = {
        "benchmark": "gpu_bench",
        "dry_run": dry,
        "commit": _git_commit(),
        "command": " ".join([sys.executable, *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "transformers": _version("transformers"),
            "peft": _version("peft"),
        },
        "shapes": {s: SHAPES[s] | COMMON for s in shapes},
        "wall_s": {},
    }
    if dry:
        results["note"] = (
            "dry run: CPU and a tiny shape standing for both sizes; it checks that every phase "
            "runs, its numbers and verdicts say nothing about a GPU"
        )
    ctx["results"] = results
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in [x for x in args.phases.split(",") if x]:
        if name not in PHASES:
            print(f"unknown phase {name!r}; phases: {', '.join(PHASES)}", file=sys.stderr)
            return 2
        if ctx["time_left"]() < 10:
            results[name] = "not measured: out of time"
        else:
            t0 = time.perf_counter()
            try:
                results[name] = PHASES[name](ctx)
            except Exception as err:  # one phase failing leaves the others' numbers
                results[name] = {"error": f"{type(err).__name__}: {err}"}
            results["wall_s"][name] = time.perf_counter() - t0
            print(f"{name}: {json.dumps(results[name], default=str)[:1500]}", flush=True)
        results["targets"] = targets(results, shapes, ctx["lora_shape"], dry_run=dry)
        results["wall_s"]["total"] = time.perf_counter() - t_start
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    for name, t in results["targets"].items():
        verdict = {True: "pass", False: "FAIL", None: "dry run" if dry else "not measured"}[
            t["pass"]
        ]
        value = "-" if t["ratio"] is None else f"{t['ratio']:.3g}"
        print(f"  {name:40s} {value:>8s} (target {t['target']}): {verdict}")
    print(f"wrote {out}")
    errors = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
    return 1 if errors else 0


def _git_commit() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
