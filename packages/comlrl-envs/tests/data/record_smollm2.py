"""Record SmolLM2-135M-Instruct's greedy completions on the code suites' prompts (a fixture).

How ``smollm2_completions.json`` beside this file was made (2-core CPU, one thread)::

    /work/venv/bin/python packages/comlrl-envs/tests/data/record_smollm2.py \\
        --shared ../shared --out packages/comlrl-envs/tests/data/smollm2_completions.json

Needs torch, transformers and gguf (not dependencies of comlrl-envs) and the model file
``<shared>/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf`` (its ``SOURCE.md``
says where it comes from). For each code suite it takes the first problems of the ``test``
split, builds both agents' turn-0 prompts, and decodes greedily (``do_sample=False``, at most
``--max-new-tokens`` new tokens, stopping at the model's end-of-turn token), once through the
tokenizer's chat template (``chat``: ``apply_chat_template(chat_messages(p),
add_generation_prompt=True)``) and once on the completion-style text (``raw``:
``prompt_text(p)``). The prompts of one agent are decoded as one left-padded batch. Each
joint action is then scored by the task's own reward; the file keeps the completions, the
rewards and their means, so the tests can check extraction on real model output without
the model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

MODEL_DIR = Path("models") / "smollm2-135m-instruct"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# suite name -> (task kwargs given the shared data dir, number of test problems)
SUITES: dict[str, tuple[dict[str, str], int]] = {
    "coop_humaneval": ({"path": "data/HumanEval.jsonl.gz"}, 8),
    "coop_humaneval_che": ({"path": "data/CoopHumanEval_che_raw.json"}, 3),
    "mbpp": ({"path": "data/mbpp.jsonl"}, 3),
    "classeval": ({"path": "data/ClassEval_data.json"}, 3),
}


def _generate(model: Any, tok: Any, texts: list[str], max_new_tokens: int) -> list[str]:
    import torch

    tok.padding_side = "left"
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tok.pad_token_id,
        )
    new = out[:, batch["input_ids"].shape[1] :]
    return [tok.decode(row, skip_special_tokens=True) for row in new]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", type=Path, default=Path("../shared"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--suites", nargs="*", default=list(SUITES))
    parser.add_argument("--formats", nargs="*", default=["chat", "raw"])
    args = parser.parse_args(argv)

    import torch
    from comlrl.core import chat_messages, get_task, prompt_text
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model_dir = args.shared / MODEL_DIR
    sha = hashlib.sha256((model_dir / MODEL_FILE).read_bytes()).hexdigest()
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=MODEL_FILE)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=MODEL_FILE, dtype=torch.float32
    )
    model.eval()
    record: dict[str, Any] = {
        "model": f"SmolLM2-135M-Instruct ({MODEL_FILE}, sha256 {sha})",
        "decoding": {"greedy": True, "max_new_tokens": args.max_new_tokens, "split": "test"},
        "recorded_with": "packages/comlrl-envs/tests/data/record_smollm2.py",
        "suites": {},
    }
    if args.out.is_file():  # keep suites recorded earlier
        record["suites"] = json.loads(args.out.read_text())["suites"]
    for name in args.suites:
        kwargs, n = SUITES[name]
        task = get_task(name, **{k: str(args.shared / v) for k, v in kwargs.items()}, max_workers=2)
        rows = task.load("test")[:n]
        prompts = [task.prompts(row) for row in rows]
        entry: dict[str, Any] = {"task_ids": [row["task_id"] for row in rows]}
        for fmt in args.formats:
            start = time.perf_counter()
            texts_per_agent = []
            for a in range(task.num_agents):
                if fmt == "chat":
                    inputs = [
                        tok.apply_chat_template(
                            chat_messages(p[a]), add_generation_prompt=True, tokenize=False
                        )
                        for p in prompts
                    ]
                else:
                    inputs = [prompt_text(p[a]) for p in prompts]
                texts_per_agent.append(_generate(model, tok, inputs, args.max_new_tokens))
            batch = task.reward(texts_per_agent, rows)
            entry[fmt] = {
                "completions": texts_per_agent,
                "rewards": batch.rewards,
                "reward_mean": round(statistics.fmean(batch.rewards), 4),
                "statuses": [info.get("status") for info in batch.infos],
            }
            print(
                f"{name} {fmt}: reward_mean {entry[fmt]['reward_mean']} "
                f"rewards {batch.rewards} ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
        task.close()
        record["suites"][name] = entry
        args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
