"""Loading agents' models, and the built-in offline models.

The default experiment must run on a fresh, air-gapped CPU machine, so the built-in models
download nothing:

- ``builtin:stories260k`` (:data:`DEFAULT_MODEL`): llama2.c's pretrained 260K-parameter
  TinyStories Llama (MIT), shipped as package data in ``comlrl/algos/_models/stories260k``
  (about 1 MB; ``LICENSE`` and ``README.md`` there say where it comes from). It writes
  simple English stories, so a cooperative story reward visibly rises within minutes.
- ``builtin:tiny-qwen2``: a Qwen2-architecture causal LM with seeded random weights and a
  byte-level BPE tokenizer trained on the spot on source files of the running Python's
  standard library: a stand-in for code tasks' plumbing (it learns nothing useful).

Other names are Hugging Face Hub ids, local directories (``save_pretrained`` format) or
local GGUF files (``model.gguf``, as llama.cpp and many model hubs ship them; needs the
``gguf`` package, extra ``comlrl-algos[gguf]``): transformers reads the file's tokenizer,
chat template and config and dequantizes its weights to the run's ``dtype`` (Q4/Q8 blocks
become float weights: the model trains as an ordinary float model, and checkpoints are
written in ``save_pretrained`` format). A file is converted once and kept in the GGUF
cache (:mod:`comlrl.algos.models.gguf`; ``COMLRL_GGUF_CACHE=off`` keeps no copy). A name that looks like a path but is neither a
directory nor a file fails with "no such directory or file"; a Hub id that is not in the
local cache fails in seconds, not after the Hub client's retries, when the Hub cannot be
reached (or at once with ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import json
import os
import socket
import sysconfig
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch

__all__ = [
    "DEFAULT_MODEL",
    "TINY_QWEN2",
    "STORIES260K",
    "BUILTIN_MODELS",
    "builtin_model_path",
    "looks_like_path",
    "is_gguf_file",
    "build_default_tokenizer",
    "build_default_model",
    "tiny_qwen2_config",
    "load_model_and_tokenizer",
    "is_adapter_folder",
    "load_adapter_folder",
]

#: The pretrained 260K-parameter TinyStories Llama shipped with the package.
STORIES260K = "builtin:stories260k"
#: A tiny Qwen2 with random weights and an on-the-spot tokenizer (code-task plumbing).
TINY_QWEN2 = "builtin:tiny-qwen2"
#: Names of the built-in models, with a one-line description each.
BUILTIN_MODELS = {
    STORIES260K: "pretrained 260K-parameter TinyStories Llama (MIT), context 512 tokens",
    TINY_QWEN2: "random-weight 0.4M-parameter Qwen2 with a code tokenizer, context 2048",
}
#: The model of the default config: :data:`STORIES260K`.
DEFAULT_MODEL = STORIES260K

_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Standard-library modules used as the tokenizer's training text: plain Python source
# that exists in every CPython install (3.10+), giving code-shaped merges.
_CORPUS_MODULES = [
    "textwrap.py",
    "string.py",
    "heapq.py",
    "bisect.py",
    "fractions.py",
    "statistics.py",
    "functools.py",
    "collections/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "argparse.py",
    "calendar.py",
    "difflib.py",
    "random.py",
    "shlex.py",
    "pprint.py",
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
        'call aux. Return only code.\n def solve(numbers: List[int]) -> int:\n    """ >>> '
        'solve([1, 2, 3])\n    6\n    """\n    return sum(numbers)\n'
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


def tiny_qwen2_config(vocab_size: int = 2048) -> Any:
    """The ``transformers.Qwen2Config`` of ``builtin:tiny-qwen2`` (:func:`build_default_model`):
    2 decoder layers, hidden size 64, 4 attention heads (2 KV heads), MLP size 256, tied
    embeddings, context 2048; ``vocab_size`` 2048 is that of :func:`build_default_tokenizer`."""
    from transformers import Qwen2Config

    return Qwen2Config(
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


def build_default_model(vocab_size: int, seed: int = 0) -> Any:
    """Build the built-in tiny Qwen2 causal LM with seeded random weights.

    Architecture: :func:`tiny_qwen2_config`; about 0.4M parameters at vocab 2048.

    Args:
        vocab_size: vocabulary size of the tokenizer it is paired with.
        seed: seed for the weight initialisation.
    """
    from transformers import GenerationConfig, Qwen2ForCausalLM

    config = tiny_qwen2_config(vocab_size)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(eos_token_id=0, pad_token_id=0)
    return model


def builtin_model_path(name: str = STORIES260K) -> Path:
    """Folder of a built-in pretrained model shipped as package data (Hugging Face format).

    Raises:
        ValueError: ``name`` is not a built-in model with files (only
            :data:`STORIES260K`; :data:`TINY_QWEN2` is built on the spot).
        FileNotFoundError: the package data is missing (a broken install).
    """
    if name != STORIES260K:
        raise ValueError(f"{name!r} has no files; the built-in model with files is {STORIES260K!r}")
    path = Path(str(resources.files("comlrl.algos") / "_models" / "stories260k"))
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"the built-in model files are missing from {path}; reinstall comlrl-algos."
        )
    return path


def _load_stories260k(torch_dtype: torch.dtype) -> tuple[Any, Any]:
    # Loaded with the concrete classes, so it works whichever transformers version wrote
    # tokenizer_config.json.
    from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = builtin_model_path(STORIES260K)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<unk>",
        padding_side="left",
    )
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch_dtype)
    model.generation_config = GenerationConfig.from_pretrained(path)
    return model, tokenizer


def looks_like_path(name: str) -> bool:
    """True for names a Hub id can never be: absolute, ``./``, ``../``, ``~``, or deeper than
    ``namespace/name``."""
    return (
        name.startswith(("/", "./", "../", "~", ".\\"))
        or os.path.isabs(name)
        or name.count("/") > 1
        or name in (".", "..")
    )


def is_gguf_file(name: str) -> bool:
    """True for the path of an existing file whose name ends in ``.gguf``."""
    path = os.path.expanduser(name)
    return path.lower().endswith(".gguf") and os.path.isfile(path)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub endpoint (``HF_ENDPOINT``) opens within ``timeout``."""
    url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def load_model_and_tokenizer(
    name_or_path: str, *, seed: int = 0, dtype: str = "float32", trust_remote_code: bool = False
) -> tuple[Any, Any]:
    """Load one agent's causal LM and tokenizer.

    Args:
        name_or_path: a built-in name (:data:`BUILTIN_MODELS`), a Hugging Face model id,
            a local directory (``save_pretrained`` format), a local ``.gguf`` file
            (dequantized to ``dtype``; needs ``gguf``; converted once, then read from the
            GGUF cache: :mod:`comlrl.algos.models.gguf`), or an agent checkpoint of a LoRA
            run (an adapter folder: its base with the adapter merged in,
            :func:`load_adapter_folder`; needs ``peft``).
        seed: weight seed for the built-in model (ignored otherwise).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        trust_remote_code: passed to ``from_pretrained``.

    Returns:
        ``(model, tokenizer)``; the tokenizer pads on the left and has a pad token. The
        model's ``comlrl_source`` attribute says where it came from (``{"model": the name,
        or a local file's absolute path, "seed": ..., "trust_remote_code": ...}``): a LoRA
        checkpoint records it as its base (:data:`~comlrl.algos.models.lora_policy.BASE_RECORD`).

    Raises:
        ValueError: an unknown ``builtin:`` name.
        OSError: a path-like name that is neither a directory nor a ``.gguf`` file ("no such
            directory or file"); a GGUF file without the ``gguf`` package; a Hub id
            that is not in the local cache while the Hub is unreachable or
            ``HF_HUB_OFFLINE=1`` (checked in seconds, before the Hub client's retries); a
            directory without model or tokenizer files; an adapter folder without its
            base record.
    """
    if is_adapter_folder(name_or_path):
        return load_adapter_folder(name_or_path, dtype=dtype, trust_remote_code=trust_remote_code)
    model, tokenizer = _load(name_or_path, seed, dtype, trust_remote_code)
    local = os.path.exists(os.path.expanduser(name_or_path))
    model.comlrl_source = {
        "model": os.path.abspath(os.path.expanduser(name_or_path)) if local else name_or_path,
        "seed": seed,
        "trust_remote_code": trust_remote_code,
    }
    return model, tokenizer


def _load(name_or_path: str, seed: int, dtype: str, trust_remote_code: bool) -> tuple[Any, Any]:
    """:func:`load_model_and_tokenizer` of a built-in name, Hub id, model folder or
    ``.gguf`` file."""
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        dtype
    ]
    if name_or_path == TINY_QWEN2:
        tokenizer = build_default_tokenizer()
        model = build_default_model(len(tokenizer), seed=seed).to(torch_dtype)
        return model, tokenizer
    if name_or_path == STORIES260K:
        return _load_stories260k(torch_dtype)
    if name_or_path.startswith("builtin:"):
        raise ValueError(
            f"unknown built-in model {name_or_path!r}; choose one of {sorted(BUILTIN_MODELS)}"
        )
    if is_gguf_file(name_or_path):
        from comlrl.algos.models.gguf import load_gguf

        return load_gguf(os.path.expanduser(name_or_path), torch_dtype)
    local = os.path.isdir(os.path.expanduser(name_or_path))
    if not local and (looks_like_path(name_or_path) or os.path.isfile(name_or_path)):
        what = (
            "a file that is not a .gguf file"
            if os.path.isfile(name_or_path)
            else "no such directory or file"
        )
        raise OSError(
            f"could not load model {name_or_path!r}: {what}. Pass the folder "
            "that holds config.json and the weights (save_pretrained format), a .gguf file, "
            "or a Hugging Face Hub id such as 'Qwen/Qwen2.5-0.5B'."
        )
    if local:
        name_or_path = os.path.expanduser(name_or_path)
        if not os.path.isfile(os.path.join(name_or_path, "config.json")):
            raise OSError(
                f"could not load model {name_or_path!r}: the directory has no config.json, so "
                "it lacks model or tokenizer files. Pass the folder written by save_pretrained "
                "(config.json, the weights and the tokenizer files), e.g. runs/x/final/agent_0."
            )
    local_only = local or _offline()
    if not local_only:
        try:  # the local cache first: no network needed for a model seen before
            return _from_pretrained(name_or_path, torch_dtype, trust_remote_code, local_only=True)
        except OSError:
            pass
        if not _hub_reachable():
            raise OSError(
                f"could not load model {name_or_path!r}: it is not in the local Hugging Face "
                "cache and the Hub cannot be reached (no network?). Pass a local directory "
                "with the model, or download it on a machine with network access and copy "
                "the cache (then set HF_HUB_OFFLINE=1)."
            )
    try:
        return _from_pretrained(name_or_path, torch_dtype, trust_remote_code, local_only=local_only)
    except OSError as exc:
        if local:
            hint = "The directory exists but lacks model or tokenizer files."
        elif _offline():
            hint = (
                "HF_HUB_OFFLINE is set and the model is not in the local cache: unset it on a "
                "machine with network access, or pass a local directory."
            )
        else:
            hint = (
                "Pass a local directory with the model (save_pretrained format), or a Hub id "
                "that exists (check the spelling)."
            )
        raise OSError(f"could not load model {name_or_path!r}: {exc}\n{hint}") from exc


def _from_pretrained(
    name_or_path: str, torch_dtype: torch.dtype, trust_remote_code: bool, *, local_only: bool
) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        name_or_path, trust_remote_code=trust_remote_code, local_files_only=local_only
    )
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path,
        dtype=torch_dtype,
        trust_remote_code=trust_remote_code,
        local_files_only=local_only,
    )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def is_adapter_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a LoRA adapter and no whole model (an agent
    checkpoint of a LoRA run: ``adapter_config.json`` without ``config.json``)."""
    p = Path(path).expanduser()
    return (p / "adapter_config.json").is_file() and not (p / "config.json").is_file()


def load_adapter_folder(
    path: str | Path, *, dtype: str = "float32", trust_remote_code: bool = False
) -> tuple[Any, Any]:
    """A LoRA agent's checkpoint folder as one plain model: its base (named in the
    folder's :data:`~comlrl.algos.models.lora_policy.BASE_RECORD`, loaded with the seed and
    settings recorded there and ``dtype``) with the adapter merged in
    (``W + (alpha / r) B A``, peft's ``merge_and_unload``), and the base's tokenizer.

    What ``comlrl eval --model runs/x/final/agent_0`` and ``--model`` of any command load
    for an agent of a LoRA run. Each call loads its own copy of the base.

    Raises:
        OSError: the folder has no base record (an adapter saved from a base that was not
            loaded by :func:`~comlrl.algos.models.loading.load_model_and_tokenizer`), the
            base does not load, or peft is missing (the message names the extra).
    """
    from comlrl.algos.models.lora_policy import BASE_RECORD, require_peft

    folder = Path(path).expanduser()
    try:
        record = json.loads((folder / BASE_RECORD).read_text())
        base_name, seed = str(record["model"]), int(record["seed"])
        remote_code = bool(record.get("trust_remote_code", trust_remote_code))
    except (OSError, ValueError, KeyError, TypeError):
        raise OSError(
            f"could not load model {str(path)!r}: it is a LoRA adapter without "
            f"{BASE_RECORD} naming its base, so the base is unknown. Load it in Python with "
            "PeftModel.from_pretrained(base, path), or pass its merged weights "
            "(lora.merge_adapters=true writes them to agent_<i>/merged)."
        ) from None
    try:
        peft = require_peft()
    except ImportError as exc:
        raise OSError(f"could not load model {str(path)!r}, a LoRA adapter: {exc}") from None
    base, tokenizer = load_model_and_tokenizer(
        base_name,
        seed=seed,
        dtype=dtype,
        trust_remote_code=remote_code,
    )
    model = peft.PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
    model.requires_grad_(True)  # peft froze the base: a loaded model trains as any other
    model.comlrl_source = {
        "model": str(folder.resolve()),
        "seed": seed,
        "trust_remote_code": remote_code,
    }
    return model, tokenizer
