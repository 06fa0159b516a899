"""Loading agents' models and the built-in offline default (a tiny random Qwen2).

The default experiment must run on a fresh, air-gapped CPU machine, so nothing here
downloads: the default tokenizer is a byte-level BPE trained on the spot on source files of
the running Python's standard library, and the default model is a Qwen2-architecture causal
LM built from a config with seeded random weights.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DEFAULT_MODEL",
    "build_default_tokenizer",
    "build_default_model",
    "load_model_and_tokenizer",
]

#: Name that selects the built-in tiny model in configs and on the command line.
DEFAULT_MODEL = "builtin:tiny-qwen2"

_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Standard-library modules used as the tokenizer's training text: plain Python source
# that exists in every CPython install (3.10+), giving code-shaped merges.
_CORPUS_MODULES = [
    "textwrap.py", "string.py", "heapq.py", "bisect.py", "fractions.py", "statistics.py",
    "functools.py", "collections/__init__.py", "json/decoder.py", "json/encoder.py",
    "argparse.py", "calendar.py", "difflib.py", "random.py", "shlex.py", "pprint.py",
]


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for rel in _CORPUS_MODULES:
        path = stdlib / rel
        if path.is_file():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    # A few lines in the style of the default task's prompts, so common words merge too.
    texts.append(
        "Write a Python helper function named aux. Implement the function below; you may "
        "call aux. Return only code.\n def solve(numbers: List[int]) -> int:\n    \"\"\" >>> "
        "solve([1, 2, 3])\n    6\n    \"\"\"\n    return sum(numbers)\n"
    )
    return texts


def build_default_tokenizer(vocab_size: int = 2048) -> Any:
    """Train the built-in byte-level BPE tokenizer (no download; ~1 s on one core).

    Byte-level BPE can encode any text. Special tokens: ``<|endoftext|>`` (EOS and pad),
    ``<|im_start|>``, ``<|im_end|>``.

    Args:
        vocab_size: target vocabulary size including the 256 byte symbols and specials.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ``padding_side="left"``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        padding_side="left",
    )
    return fast


def build_default_model(vocab_size: int, seed: int = 0) -> Any:
    """Build the built-in tiny Qwen2 causal LM with seeded random weights.

    Architecture: 2 decoder layers, hidden size 64, 4 attention heads (2 KV heads),
    MLP size 256, tied embeddings, context 2048; about 0.4M parameters at vocab 2048.

    Args:
        vocab_size: vocabulary size of the tokenizer it is paired with.
        seed: seed for the weight initialisation.
    """
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=0,
        pad_token_id=0,
        bos_token_id=None,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(eos_token_id=0, pad_token_id=0)
    return model


def load_model_and_tokenizer(
    name_or_path: str, *, seed: int = 0, dtype: str = "float32", trust_remote_code: bool = False
) -> tuple[Any, Any]:
    """Load one agent's causal LM and tokenizer.

    Args:
        name_or_path: :data:`DEFAULT_MODEL`, a Hugging Face model id, or a local directory.
        seed: weight seed for the built-in model (ignored otherwise).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        trust_remote_code: passed to ``from_pretrained``.

    Returns:
        ``(model, tokenizer)``; the tokenizer pads on the left and has a pad token.

    Raises:
        OSError: when the model cannot be found locally and the Hub is unreachable; the
            message says to pass a local path or set ``HF_HUB_OFFLINE=1`` with a cached copy.
    """
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        dtype
    ]
    if name_or_path == DEFAULT_MODEL:
        tokenizer = build_default_tokenizer()
        model = build_default_model(len(tokenizer), seed=seed).to(torch_dtype)
        return model, tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
    except OSError as exc:
        local = os.path.isdir(name_or_path)
        raise OSError(
            f"could not load model {name_or_path!r}: {exc}\n"
            + (
                "The directory exists but lacks model or tokenizer files."
                if local
                else "Pass a local directory with the model (save_pretrained format), or a Hub "
                "id that is in the local cache (set HF_HUB_OFFLINE=1 on air-gapped machines)."
            )
        ) from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
