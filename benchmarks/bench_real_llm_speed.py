"""Speed on a real chat LLM (SmolLM2-135M-Instruct from its GGUF file), on CPU.

Two measurements, each printed and saved under ``results`` in one JSON file:

``step``: training step time of our MAGRPO trainer vs the published CoMLRL 1.4.3 on the
same model and config, side by side in one run (the two sides alternate per batch size,
so both see the machine's load alike): 2 agents (two copies of the model), cooperative
HumanEval, the same problems in the same order, ``G``, ``max_new_tokens``, temperature,
learning rate and joint reward, at ``--batch-sizes`` prompts per step. Both send the chat
prompts our agents render (the model's ChatML template applied); 1.4.3's formatters return
those texts. CoMLRL 1.4.3 needs a ``save_pretrained`` folder: the GGUF file is converted
once (our loader, i.e. transformers' GGUF reader, dequantized to float32, then
``save_pretrained`` into ``--work-dir``), and both sides load that folder.

``decode``: greedy generation of ``--decode-new-tokens`` tokens for ``--decode-rows``
prompts, our sampler (one prefill, then :class:`FastDecoder` steps) with its linears on
the C++ few-row GEMV (``comlrl.kernels.FewRowsLinear``, "ours_kernel") and on torch's
``F.linear`` (``use_backend("torch")``, "ours_torch_gemv"), vs Hugging Face
``model.generate`` (greedy, ``min_new_tokens`` = ``max_new_tokens`` so all make every
token), alternating, best of ``--decode-repeats``; a decode step's time is each side's
best time for ``--decode-new-tokens`` tokens minus its own best time for one token (its
prefill and first token), over the steps between. (Subtracting one ``model(...)`` prefill
from every side, as this script first did, let the prefill's noise decide the 4-row
result: there the prefill is ~3.4 s of a ~4.7 s call.) And what the hardware allows: a decode
step must read every weight once (bytes over the streaming bandwidth: the best
``x.sum()`` over 512 MiB, measured before and after the decode runs) and do
``2 * params * rows`` FLOPs (over the best float32 1024^3 matmul rate, likewise measured
before and after: one measurement under a passing load made the limit lax); the larger of the two
is the limit. The 1-minute load average is recorded with every row.

Usage (from the repo root)::

    python benchmarks/bench_real_llm_speed.py --comlrl143-python /work/venv-comlrl143/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_train_throughput as btt  # noqa: E402  (shares our side and 1.4.3's runner)
from _bench_common import git_commit, machine_info  # noqa: E402

GGUF = Path(__file__).resolve().parents[2] / "shared/models/smollm2-135m-instruct"
DEFAULT_GGUF = str(GGUF / "SmolLM2-135M-Instruct.Q4_1.gguf")


def convert_gguf(gguf: str, work: Path) -> str:
    """The GGUF model as a float32 ``save_pretrained`` folder (made once per ``work``)."""
    out = work / "smollm2-135m-instruct-hf"
    if (out / "config.json").exists():
        return str(out)
    from comlrl.algos.models.loading import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(gguf, seed=0, dtype="float32")
    # The GGUF file makes <|im_end|> both EOS and padding. CoMLRL 1.4.3 cuts a prompt at
    # its first padding token and a completion at its first padding token, and every
    # ChatML prompt holds <|im_end|>, so its completions would come out as slices of the
    # prompt. Both sides therefore pad with <|endoftext|> (id 0), which neither prompts
    # nor completions contain; EOS stays <|im_end|> (the generation config's).
    if tok.pad_token_id == tok.eos_token_id and "<|endoftext|>" in tok.get_vocab():
        tok.pad_token = "<|endoftext|>"
        model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def rendered_examples(task: Any, model_dir: str, n: int, split: str) -> list[dict[str, Any]]:
    """The first ``n`` examples, each with ``_prompts``: our agents' rendered prompt texts."""
    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.algos.rollout.agent import HFAgent

    model, tok = load_model_and_tokenizer(model_dir, seed=0, dtype="float32")
    agent = HFAgent(model, tok)
    rows = []
    for ex in list(task.load(split))[:n]:
        row = btt._jsonable_example(ex)
        row["_prompts"] = agent.render(list(task.prompts(ex)))
        rows.append(row)
    return rows


def run_step(args: argparse.Namespace, model_dir: str, work: Path) -> dict[str, Any]:
    task = btt._load_task_class()()
    rows: list[dict[str, Any]] = []
    for b in args.batch_sizes:
        need = (args.warmup + args.steps) * b
        examples = rendered_examples(task, model_dir, need, "train")
        path = work / f"examples_b{b}.json"
        path.write_text(json.dumps(examples))
        ns = argparse.Namespace(**{**vars(args), "batch_size": b, "task_kwargs": "{}"})
        dirs = [model_dir] * args.num_agents
        load = [os.getloadavg()[0]]
        print(f"[step b={b}] CoMLRL 1.4.3 ...", flush=True)
        theirs, their_cmd = btt.run_comlrl143(ns, dirs, path, work)
        load.append(os.getloadavg()[0])
        print(f"[step b={b}]   {theirs['step_s']:.2f} s/step; ours ...", flush=True)
        ours = btt.run_ours(ns, dirs, examples, task, work)
        load.append(os.getloadavg()[0])
        print(f"[step b={b}]   {ours['step_s']:.2f} s/step", flush=True)
        keep = ("step_s", "wall_s", "stage_s_per_step", "cpu_s_per_prompt")
        keep += ("completion_len_mean", "tokens_per_s", "generated_tokens")
        rows.append(
            {
                "batch_size": b,
                "ours": {k: ours[k] for k in keep} | {"per_step": ours["per_step"]},
                "comlrl_1_4_3": {k: theirs[k] for k in keep},
                "speedup_step_time": theirs["step_s"] / ours["step_s"],
                "speedup_per_token": (theirs["wall_s"] / max(1, theirs["generated_tokens"]))
                / (ours["wall_s"] / max(1, ours["generated_tokens"])),
                "loadavg_1m": load,
                "comlrl_1_4_3_command": " ".join(their_cmd),
            }
        )
    task.close() if hasattr(task, "close") else None
    return {"rows": rows}


def _bandwidth_gb_s(threads: int, mib: int = 512, repeats: int = 5) -> float:
    """Best-of ``repeats`` read bandwidth: ``x.sum()`` over a float32 tensor of ``mib`` MiB."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(mib * (1 << 20) // 4)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def _matmul_gflops(threads: int, n: int = 1024, repeats: int = 5) -> float:
    """Best-of float32 ``[n, n] x [n, n]`` rate, GFLOP/s."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def _gemv_ms_per_step(model: Any, rows: int, backend: str, repeats: int = 5) -> float:
    """Best-of-``repeats`` time of one decode step's linears alone (q|k|v, o, gate|up and
    down per layer, then the LM head; fused as FastDecoder fuses them) on ``rows`` rows,
    on backend ``backend`` ("auto": the C++ kernel, "torch": F.linear), in ms."""
    import torch
    from comlrl.algos.rollout.sampling.fast_decode.linears import apply_linear, as_linear, fused
    from comlrl.kernels import use_backend

    with use_backend(backend), torch.no_grad():
        lins = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            lins.append(fused([attn.q_proj, attn.k_proj, attn.v_proj]))
            lins.append((attn.o_proj.weight, attn.o_proj.bias))
            lins.append(fused([mlp.gate_proj, mlp.up_proj]))
            lins.append((mlp.down_proj.weight, mlp.down_proj.bias))
        lins.append((model.lm_head.weight, None))
        ops = [as_linear(w, b, rows) for w, b in lins]
        xs = [torch.randn(rows, w.shape[1]) for w, _ in lins]
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for op, x in zip(ops, xs):
                apply_linear(x, op)
            best = min(best, time.perf_counter() - t0)
    return best * 1000


def run_decode(args: argparse.Namespace, model_dir: str) -> dict[str, Any]:
    import torch
    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.algos.rollout.agent import HFAgent

    torch.set_num_threads(args.decode_threads)
    model, tok = load_model_and_tokenizer(model_dir, seed=0, dtype="float32")
    agent = HFAgent(model, tok)
    task = btt._load_task_class()()
    n_new = args.decode_new_tokens
    out: dict[str, Any] = {"new_tokens": n_new, "threads": args.decode_threads, "rows": []}
    params = sum(p.numel() for p in model.parameters())  # tied embedding counted once
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bw_runs = [_bandwidth_gb_s(args.decode_threads, repeats=args.bandwidth_repeats)]
    gflops_runs = [_matmul_gflops(args.decode_threads)]
    out["hardware"] = {
        "params": params,
        "weight_bytes": weight_bytes,
        "read_bandwidth_gb_s_runs": bw_runs,
        "matmul_gflop_s_runs": gflops_runs,
        "method": "a decode step reads every weight once (the tied embedding as the LM "
        "head) and does 2*params*rows FLOPs; limit per step = max(weight_bytes / "
        "bandwidth, 2*params*rows / matmul rate); bandwidth = best x.sum() over 512 MiB "
        "float32 (best of the runs before and after the decode rows), matmul rate = best "
        "1024^3 float32 matmul (likewise before and after), all on the same threads",
    }
    print(
        f"[decode] x.sum bandwidth {bw_runs[0]:.1f} GB/s, matmul {gflops_runs[0]:.1f} GFLOP/s",
        flush=True,
    )
    examples = list(task.load("test"))
    for rows in args.decode_rows:
        texts = agent.render([task.prompts(ex)[0] for ex in examples[:rows]])
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        r = _decode_row(model, tok, enc["input_ids"], enc["attention_mask"], args)
        r["linears_only_ms_per_step"] = {
            "ours_kernel": _gemv_ms_per_step(model, rows, "auto"),
            "ours_torch_gemv": _gemv_ms_per_step(model, rows, "torch"),
        }
        out["rows"].append(r)
    bw_runs.append(_bandwidth_gb_s(args.decode_threads, repeats=args.bandwidth_repeats))
    gflops_runs.append(_matmul_gflops(args.decode_threads))
    bw, gflops = max(bw_runs), max(gflops_runs)
    out["hardware"]["read_bandwidth_gb_s"] = bw
    out["hardware"]["matmul_gflop_s"] = gflops
    for r in out["rows"]:
        rows = r["rows"]
        limit_s = max(weight_bytes / (bw * 1e9), 2 * params * rows / (gflops * 1e9))
        per_step = {k: v / 1000 for k, v in r["decode_ms_per_step"].items()}
        r |= {
            "limit_ms_per_step": limit_s * 1000,
            "limit_tokens_per_s": rows / limit_s,
            "over_limit": {k: v / limit_s for k, v in per_step.items()},
            "kernel_speedup_vs_torch_gemv": per_step["ours_torch_gemv"] / per_step["ours_kernel"],
            "hf_over_ours_kernel": per_step["hf_generate"] / per_step["ours_kernel"],
        }
        tps = r["decode_tokens_per_s"]
        print(
            f"[decode rows={rows}] tok/s: kernel {tps['ours_kernel']:.1f}, torch GEMV "
            f"{tps['ours_torch_gemv']:.1f}, generate {tps['hf_generate']:.1f}, limit "
            f"{r['limit_tokens_per_s']:.1f} (bandwidth {bw:.1f} GB/s, matmul {gflops:.1f} GFLOP/s); time over the limit's: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in r["over_limit"].items())
            + f"; linears alone ms/step: {r['linears_only_ms_per_step']}"
            + f"; same tokens as generate: {r['same_tokens']}; load {r['loadavg_1m']}",
            flush=True,
        )
    return out


def _decode_row(
    model: Any, tok: Any, ids: Any, mask: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """Best-of-``--decode-repeats`` times of our sampler, ``generate`` and the prefill
    alone (alternating), for the left-padded prompts ``ids [rows, S]``."""
    import torch
    from comlrl.algos.rollout.sampling.native import NativeSampler
    from comlrl.core import SamplingParams
    from comlrl.kernels import use_backend

    n_new, rows = args.decode_new_tokens, int(ids.shape[0])
    sampler = NativeSampler(model, pad_token_id=tok.pad_token_id, eos_token_ids=[])

    def ours(n: int) -> Any:
        sp = SamplingParams(num_generations=1, max_new_tokens=n, top_k=1)
        return sampler.sample(ids, mask, sp)[0]

    def ours_torch(n: int) -> Any:
        with use_backend("torch"):  # FastDecoder's linears on F.linear
            return ours(n)

    def hf(n: int) -> Any:
        with torch.no_grad():
            seq = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=tok.pad_token_id,
            )
        return seq[:, ids.shape[1] :]

    def prefill(n: int) -> None:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)

    fns = {"ours_kernel": ours, "ours_torch_gemv": ours_torch, "hf_generate": hf}
    times: dict[str, list[float]] = {k: [] for k in [*fns, "prefill"]}
    first: dict[str, list[float]] = {k: [] for k in fns}  # one token: prefill + first token
    tokens: dict[str, Any] = {}
    load = [os.getloadavg()[0]]
    for _ in range(args.decode_repeats):  # alternate, best of repeats
        for name, fn in (*fns.items(), ("prefill", prefill)):
            t0 = time.perf_counter()
            tokens[name] = fn(n_new)
            times[name].append(time.perf_counter() - t0)
            if name in first:
                t0 = time.perf_counter()
                fn(1)
                first[name].append(time.perf_counter() - t0)
    load.append(os.getloadavg()[0])
    best = {k: min(v) for k, v in times.items()}
    best_first = {k: min(v) for k, v in first.items()}
    decode_steps = n_new - 1  # the first token comes from the prefill's logits
    per_step = {k: (best[k] - best_first[k]) / decode_steps for k in fns}
    return {
        "rows": rows,
        "prompt_len": int(ids.shape[1]),
        "seconds_best": best,
        "seconds_all": times,
        "seconds_first_token_best": best_first,
        "seconds_first_token_all": first,
        "decode_ms_per_step": {k: v * 1000 for k, v in per_step.items()},
        "tokens_per_s_total": {k: rows * n_new / best[k] for k in fns},
        "decode_tokens_per_s": {k: rows / v for k, v in per_step.items()},
        "same_tokens": {
            k: bool(torch.equal(tokens[k], tokens["hf_generate"]))
            for k in ("ours_kernel", "ours_torch_gemv")
        },
        "fast_decode_status": sampler.fast_decode_status,
        "loadavg_1m": load,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", default=DEFAULT_GGUF)
    p.add_argument("--comlrl143-python", default="/work/venv-comlrl143/bin/python")
    p.add_argument("--parts", default="step,decode", help="comma list of step, decode")
    p.add_argument("--batch-sizes", default="1,2,4", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--num-generations", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument("--num-agents", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--decode-rows", default="1,4", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--decode-new-tokens", type=int, default=64)
    p.add_argument("--decode-threads", type=int, default=1)
    p.add_argument("--decode-repeats", type=int, default=3)
    p.add_argument("--bandwidth-repeats", type=int, default=10)
    p.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "bench_real_llm"))
    p.add_argument("--output", default=str(HERE / "results" / "real_llm_speed.json"))
    args = p.parse_args(argv)
    if not Path(args.gguf).is_file():
        raise SystemExit(f"no GGUF file at {args.gguf}; pass --gguf PATH")
    btt._import_ours()
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir = convert_gguf(args.gguf, work)
    print(f"model folder: {model_dir} ({time.perf_counter() - t0:.1f} s)", flush=True)
    parts = args.parts.split(",")
    out_path = Path(args.output)
    result: dict[str, Any] = (
        json.loads(out_path.read_text()) if out_path.exists() else {"results": {}}
    )
    result.update(
        benchmark="real_llm_speed",
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        model=f"{args.gguf} (dequantized to float32, save_pretrained to {model_dir})",
        commit=git_commit(HERE.parent),
        command=" ".join([sys.executable, *sys.argv]),
        machine=machine_info(args.threads),
    )
    if "step" in parts:
        setup = {
            k: getattr(args, k)
            for k in ("batch_sizes", "num_generations", "max_new_tokens", "temperature")
        }
        setup |= {"learning_rate": args.learning_rate, "warmup": args.warmup}
        setup |= {"steps": args.steps, "threads": args.threads, "task": btt.TASK_CLASS}
        result["results"]["step"] = {"setup": setup, **run_step(args, model_dir, work)}
    if "decode" in parts:
        decode = run_decode(args, model_dir)
        # the parts may come from different runs: each keeps its own command and commit
        decode |= {k: result[k] for k in ("command", "commit", "timestamp")}
        result["results"]["decode"] = decode
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    for row in result["results"].get("step", {}).get("rows", []):
        print(
            f"b={row['batch_size']}: ours {row['ours']['step_s']:.2f} s/step "
            f"({row['ours']['completion_len_mean']:.0f} tok), 1.4.3 "
            f"{row['comlrl_1_4_3']['step_s']:.2f} ({row['comlrl_1_4_3']['completion_len_mean']:.0f}"
            f" tok): {row['speedup_step_time']:.2f}x step time, "
            f"{row['speedup_per_token']:.2f}x per generated token"
        )
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
