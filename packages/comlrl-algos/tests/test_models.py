"""Built-in models and load errors people meet: stories260k ships in the package; a missing
directory, an unknown built-in name and an unreachable Hub give plain messages."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import pytest
import torch
from comlrl.algos.models.loading import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    STORIES260K,
    builtin_model_path,
    load_model_and_tokenizer,
)

STORIES_SHA256 = "407a7c581bdd66972383ce9ad24857713fb98786d06ea564a2fe9b34ebe77dfd"


def test_stories260k_ships_with_its_license_and_loads_offline() -> None:
    path = builtin_model_path()
    assert DEFAULT_MODEL == STORIES260K and STORIES260K in BUILTIN_MODELS
    assert "MIT License" in (path / "LICENSE").read_text()
    assert "karpathy" in json.loads((path / "SOURCE.json").read_text())["source"]
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == STORIES_SHA256
    model, tok = load_model_and_tokenizer(STORIES260K)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.max_position_embeddings == 512 and len(tok) == 512
    assert tok.padding_side == "left" and tok.pad_token is not None
    assert list(model.generation_config.eos_token_id) == [1, 2]


def test_stories260k_writes_english() -> None:
    model, tok = load_model_and_tokenizer(STORIES260K)
    ids = tok("Once upon a time, a little girl named Lily", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    words = [w for w in text.split() if w.isalpha()]
    assert len(words) >= 4, text  # a pretrained model, not random weights


def test_unknown_builtin_names_the_choices() -> None:
    with pytest.raises(
        ValueError, match="unknown built-in model 'builtin:gpt5'.*builtin:stories260k"
    ):
        load_model_and_tokenizer("builtin:gpt5")
    with pytest.raises(ValueError, match="has no files"):
        builtin_model_path("builtin:tiny-qwen2")


@pytest.mark.parametrize(
    "name", ["/no/such/model/dir", "./models/missing", "../x", "runs/a/final/agent_0"]
)
def test_a_missing_local_path_says_no_such_directory(name: str) -> None:
    with pytest.raises(OSError, match="no such directory") as info:
        load_model_and_tokenizer(name)
    assert "Repo id must be" not in str(info.value)
    assert repr(name) in str(info.value)


def test_a_directory_without_a_model_says_so(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="lacks model or tokenizer files"):
        load_model_and_tokenizer(str(tmp_path))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends


def test_an_unreachable_hub_fails_with_a_message_instead_of_retrying(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(
        OSError, match="not in the local Hugging Face cache and the Hub cannot be reached"
    ):
        load_model_and_tokenizer("nobody-comlrl/not-a-model")


def test_hf_hub_offline_fails_at_once_for_an_uncached_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://192.0.2.1:9")  # never contacted with HF_HUB_OFFLINE
    with pytest.raises(
        OSError, match="HF_HUB_OFFLINE is set and the model is not in the local cache"
    ):
        load_model_and_tokenizer("nobody-comlrl/not-a-model")
