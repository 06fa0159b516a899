"""How much of the sandboxed tool time a tool-calling rollout hides behind decoding.

16 rows, one agent, the built-in tiny model (``build_default_model``). Each row writes
filler tokens, a fenced Python call (``PythonBlockFormat``), more filler, a second call,
then an answer and EOS; the filler lengths differ per row, so rows close their calls at
different decode steps. The tokens are *forced* (a script chooses them) but every step
runs the real model forward with its KV cache and returns the forced tokens' real
log-probs, so decoding costs what decoding this model costs; the backend calls the tool
loop's ``stop`` hook every step as the native sampler does, so a call starts in the
sandbox pool the moment a row closes it while the other rows keep decoding.

Measured (median of ``--repeats`` alternating runs):
- ``wall_tools_s``: :func:`sample_with_tools` with the real sandboxed ``python`` tool
  (:func:`comlrl.envs.tools.python.python_tool`);
- ``wall_instant_s``: the same rollout with a tool that returns the precomputed output
  at once;
- ``tool_seconds``: the sum of every call's own run time (``ToolResult.seconds``);
- ``hidden_fraction = 1 - (wall_tools_s - wall_instant_s) / tool_seconds``: the share
  of tool time overlapped with decoding (or with other calls); target >= 0.8;
- ``rollout_calls_per_s`` (32 calls / ``wall_tools_s``) against
  ``sandbox_calls_per_s``: the same 32 programs through ``run_python`` on a pool of
  16 threads with nothing else running.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_tool_overlap.py --output benchmarks/results/tool_overlap.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _bench_common import git_commit, machine_info

HERE = Path(__file__).resolve().parent
ROWS = 16


def program(row: int, call: int) -> str:
    """The Python a row runs in its ``call``-th call (a few tens of ms of CPU)."""
    return f"print(sum(i * i for i in range({150_000 + 10_000 * row + 5_000 * call})))"


def fillers(row: int) -> tuple[int, int, int]:
    """Filler tokens before call 0, before call 1 and before the answer (varied per row)."""
    return 4 + (7 * row) % 40, 3 + (11 * row) % 30, 2 + (5 * row) % 12


class ForcedBackend:
    """Decodes the real model step by step (KV cache) but emits scripted tokens."""

    name = "native"
    recompute_logprobs = False
    supports_stop = True

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tok = model, tokenizer
        self.filler = tokenizer(" a", add_special_tokens=False)["input_ids"]

    def _script(self, context: str) -> list[int]:
        row = int(context.split("Row ", 1)[1].split(":", 1)[0])
        stage = context.count("```output\n") - 1  # the declaration shows one result
        fill = fillers(row)[stage] * self.filler
        if stage < 2:
            call = f"\n```python\n{program(row, stage)}\n```\n"
            return fill + self.tok(call, add_special_tokens=False)["input_ids"]
        ids = self.tok(" Answer: done", add_special_tokens=False)["input_ids"]
        return fill + ids + [self.tok.eos_token_id]

    @torch.no_grad()
    def sample(self, input_ids, attention_mask, params, generator=None, stop=None):  # type: ignore[no-untyped-def]
        n = input_ids.shape[0]
        scripts = [
            self._script(self.tok.decode(input_ids[i][attention_mask[i].bool()].tolist()))
            for i in range(n)
        ]
        pad = int(self.tok.pad_token_id)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        mask = attention_mask
        done = torch.zeros(n, dtype=torch.bool)
        ids, logps = [], []
        for k in range(params.max_new_tokens):
            col = torch.tensor([s[k] if k < len(s) else pad for s in scripts])
            col = col.masked_fill(done, pad)
            if stop is not None:
                hit = stop(col)
                done_now = hit
            else:
                done_now = torch.zeros(n, dtype=torch.bool)
            lp = torch.log_softmax(logits.float(), -1).gather(1, col[:, None])[:, 0]
            ids.append(col)
            logps.append(lp.masked_fill(done, 0.0))
            done |= (
                done_now
                | (col == self.tok.eos_token_id)
                | torch.tensor([k + 1 >= len(s) for s in scripts])
            )
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype)], 1)
            out = self.model(
                input_ids=col[:, None], attention_mask=mask, past_key_values=cache, use_cache=True
            )
            cache, logits = out.past_key_values, out.logits[:, -1]
        return torch.stack(ids, 1), torch.stack(logps, 1)

    def after_update(self) -> None:
        """Nothing to do."""


def run_once(agent: Any, tool: Any) -> tuple[float, float, int, list[str]]:
    """One rollout: (wall s, summed tool s, calls, errors)."""
    from comlrl.algos.rollout.tool_calls import sample_with_tools
    from comlrl.algos.rollout.toolbox import ToolBox
    from comlrl.core import SamplingParams

    box = ToolBox((tool,), fallback_format="python", max_tool_calls=2, max_workers=ROWS)
    prompts = [f"Row {r}: compute two sums." for r in range(ROWS)]
    t0 = time.perf_counter()
    samples = sample_with_tools(agent, prompts, SamplingParams(1, 160), box)
    wall = time.perf_counter() - t0
    box.close()
    results = [r for g in samples.completions for c in g for r in c.tool_results]
    return wall, sum(r.seconds for r in results), len(results), [str(r.error) for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=str(HERE / "results" / "tool_overlap.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from comlrl.algos.models.loading import build_default_model, build_default_tokenizer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.core import Tool
    from comlrl.envs.sandbox.executor import run_python
    from comlrl.envs.sandbox.limits import SandboxLimits
    from comlrl.envs.tools.python import format_result, python_tool

    tok = build_default_tokenizer()
    model = build_default_model(len(tok), seed=0).eval()
    agent = HFAgent(model, tok, prompt_format="raw", backend=ForcedBackend(model, tok))
    programs = [program(r, c) for r in range(ROWS) for c in range(2)]
    limits = SandboxLimits(timeout_s=5.0)
    # the sandbox's plain throughput on the same 32 programs (and the precomputed outputs)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(ROWS) as pool:
        outputs = list(pool.map(lambda code: run_python(code, limits), programs))
    plain_s = time.perf_counter() - t0
    answers = {code: format_result(res) for code, res in zip(programs, outputs)}
    real = python_tool(timeout_s=5.0)
    instant = Tool(real.name, real.description, real.parameters, run=lambda code: answers[code])
    rows: dict[str, list[float]] = {"tools": [], "instant": [], "tool_seconds": []}
    run_once(agent, instant)  # warm-up
    errors: list[str] = []
    calls = 0
    for _ in range(args.repeats):
        wall, tool_s, calls, errs = run_once(agent, real)
        rows["tools"].append(wall)
        rows["tool_seconds"].append(tool_s)
        errors += [e for e in errs if e != "None"]
        rows["instant"].append(run_once(agent, instant)[0])
    w_tools = statistics.median(rows["tools"])
    w_inst = statistics.median(rows["instant"])
    tool_s = statistics.median(rows["tool_seconds"])
    result = {
        "benchmark": "tool_overlap",
        "rows": ROWS,
        "calls_per_rollout": calls,
        "tool_errors": errors,
        "wall_tools_s": round(w_tools, 4),
        "wall_instant_s": round(w_inst, 4),
        "tool_seconds": round(tool_s, 4),
        "hidden_fraction": round(1 - (w_tools - w_inst) / tool_s, 4),
        "target_hidden_fraction": 0.8,
        "rollout_calls_per_s": round(calls / w_tools, 2),
        "sandbox_calls_per_s": round(len(programs) / plain_s, 2),
        "runs": {k: [round(x, 4) for x in v] for k, v in rows.items()},
        "machine": machine_info(torch.get_num_threads()),
        "commit": git_commit(HERE.parent),
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "runs")}, indent=1))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
