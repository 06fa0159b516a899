"""A real instruct LLM end to end: SmolLM2-135M-Instruct from its GGUF file, chat prompts, one
training step (``../shared/models/smollm2-135m-instruct``; skipped when absent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2_gguf(shared_dir: Path) -> Path:
    path = shared_dir / "models" / "smollm2-135m-instruct" / GGUF_NAME
    if not path.is_file():
        pytest.skip(f"SmolLM2-135M-Instruct GGUF not found at {path}")
    pytest.importorskip("gguf", reason="loading a GGUF file needs `pip install gguf`")
    return path


def test_a_gguf_chat_model_trains_one_step_on_chat_prompts(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    from comlrl.algos.cli.main import main

    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--model",
            str(smollm2_gguf),
            "task.name=coop_humaneval",
            "num_steps=1",
            "batch_size=1",
            "num_generations=2",
            "max_new_tokens=16",
            "learning_rate=1e-6",
            "progress=false",
            f"output_dir={out}",
        ]
    )
    assert code == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["step"] == 1
    sample = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    # the tokenizer's ChatML template was applied to the task's chat messages
    for prompt in sample["prompts"]:
        assert prompt.startswith("<|im_start|>system\n")
        assert prompt.endswith("<|im_start|>assistant\n")
    # checkpoints are plain save_pretrained folders (the GGUF quantization is gone)
    config = json.loads((out / "final" / "agent_0" / "config.json").read_text())
    assert "quantization_config" not in config
    assert (out / "final" / "agent_0" / "model.safetensors").is_file()
