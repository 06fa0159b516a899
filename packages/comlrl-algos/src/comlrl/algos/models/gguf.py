"""Local GGUF files as agents' models, converted once and kept in the GGUF cache.

transformers reads a GGUF file's config, tokenizer and weights in three passes over the
file and dequantizes the weights (Q4/Q8 blocks become float weights), which costs about
24 CPU-seconds for SmolLM2-135M-Instruct's 98 MB Q4_1 file, mostly parsing the tokenizer's
49,152 tokens and merges three times. :func:`load_gguf` does that once per file: it writes
the converted model (float32 weights, tokenizer, chat template, generation config) as a
``save_pretrained`` folder into the GGUF cache, and later loads of a file with the same
bytes read that folder (about 3 s, measured in a fresh process).

The cache (``COMLRL_GGUF_CACHE``):

- a folder path: the cache lives there;
- ``off`` (or ``0``, ``false``, ``no``): every load converts the file and keeps no copy;
- unset: ``$XDG_CACHE_HOME/comlrl/gguf``, else ``~/.cache/comlrl/gguf``.

An entry is named by the SHA-256 of the file's bytes and the transformers release that
converted it (another release may convert differently), holds 4 bytes per parameter, and
is written into a temporary folder that is renamed into place, so an interrupted conversion
leaves no entry and two processes converting one file at once both end with a whole one.
An entry that fails to load is converted again. A cache folder that cannot be written is
said once, and the model is converted without caching.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["GGUF_CACHE_ENV", "gguf_cache_dir", "gguf_cache_entry", "load_gguf"]

#: The environment variable that names the GGUF cache folder, or turns it off.
GGUF_CACHE_ENV = "COMLRL_GGUF_CACHE"
_OFF = ("off", "0", "false", "no")
#: the file that marks a whole entry (written last, before the rename)
_MARKER = "comlrl_gguf.json"
#: bump when what an entry holds changes, so old entries are converted again
_FORMAT = 1


def gguf_cache_dir() -> Path | None:
    """The GGUF cache folder (``COMLRL_GGUF_CACHE``, else the user's cache folder), or
    ``None`` when the cache is off."""
    value = os.environ.get(GGUF_CACHE_ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "comlrl" / "gguf"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_cache_entry(path: str | os.PathLike[str]) -> Path | None:
    """The cache folder that holds (or will hold) ``path``'s converted model, or ``None``
    when the cache is off. Reads the whole file once (its SHA-256)."""
    cache = gguf_cache_dir()
    if cache is None:
        return None
    import transformers

    return cache / f"{_sha256(os.fspath(path))}-transformers-{transformers.__version__}"


def load_gguf(path: str, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    """Load a GGUF file's tokenizer and model, dequantized to ``torch_dtype``: from its
    cache entry when there is one, else converted from the file (and cached).

    The model is a plain float model: the ``quantization_config`` transformers attaches to
    a GGUF-loaded model is dropped (the weights are no longer quantized, and
    ``save_pretrained`` refuses a model that still carries it), so checkpoints are ordinary
    ``save_pretrained`` folders. The tokenizer pads on the left and has a pad token.

    Raises:
        OSError: ``gguf`` is not installed (install the extra), or the file cannot be read
            or holds an architecture transformers cannot read.
    """
    entry = gguf_cache_entry(path)
    if entry is not None and (entry / _MARKER).is_file():
        try:
            return _prepared(*_load_folder(entry, torch_dtype))
        except (OSError, ValueError, KeyError) as exc:
            print(
                f"comlrl: the GGUF cache entry {entry} does not load ({exc}); converting "
                f"{path} again",
                file=sys.stderr,
            )
            shutil.rmtree(entry, ignore_errors=True)
    if entry is None:
        return _prepared(*_convert(path, torch_dtype))
    model, tokenizer = _convert(path, torch.float32)
    _prepared(model, tokenizer)
    _store(entry, model, tokenizer, path)
    if torch_dtype != torch.float32:
        model = model.to(torch_dtype)
    return model, tokenizer


def _convert(path: str, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    """The model and tokenizer transformers reads from the GGUF file itself."""
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it)
    except ImportError as exc:
        raise OSError(
            f"could not load model {path!r}: loading a GGUF file needs the `gguf` package. "
            "Install it with `pip install 'comlrl-algos[gguf]'` (or `pip install gguf`)."
        ) from exc
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch_dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise OSError(
            f"could not load GGUF model {path!r}: {exc}. transformers reads GGUF files of "
            "the architectures it lists in transformers.integrations.ggml (Llama, Qwen2, "
            "Mistral, ...); convert others to save_pretrained format first."
        ) from exc
    for cfg in (model.config, getattr(model, "generation_config", None)):
        if cfg is not None and getattr(cfg, "quantization_config", None) is not None:
            delattr(cfg, "quantization_config")
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    if getattr(model, "is_quantized", False):
        model.is_quantized = False  # type: ignore[assignment]
    return model, tokenizer


def _load_folder(entry: Path, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(entry, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(entry, dtype=torch_dtype, local_files_only=True)
    return model, tokenizer


def _prepared(model: Any, tokenizer: Any) -> tuple[Any, Any]:
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _store(entry: Path, model: Any, tokenizer: Any, path: str) -> None:
    """Write the converted model into ``entry`` through a temporary folder and a rename."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    except OSError as exc:
        print(
            f"comlrl: cannot write the GGUF cache {entry.parent} ({exc}); {path} was converted "
            f"without keeping a copy (set {GGUF_CACHE_ENV} to a writable folder, or to off)",
            file=sys.stderr,
        )
        return
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        size = sum(p.stat().st_size for p in tmp.iterdir())
        import transformers

        marker = {
            "format": _FORMAT,
            "source": os.path.abspath(path),
            "sha256": entry.name.split("-", 1)[0],
            "transformers": transformers.__version__,
        }
        (tmp / _MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        try:
            os.rename(tmp, entry)
        except OSError:  # another process stored it first: keep theirs
            if not (entry / _MARKER).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return
        print(
            f"comlrl: converted {path} once into {entry} ({size / 2**20:.0f} MiB); later "
            f"loads of this file read that ({GGUF_CACHE_ENV}=off keeps no copy)",
            file=sys.stderr,
        )
    except (OSError, RuntimeError, ValueError) as exc:  # the cache only saves time
        shutil.rmtree(tmp, ignore_errors=True)
        print(
            f"comlrl: could not store {path}'s conversion in the GGUF cache ({exc}); it was "
            "loaded without keeping a copy",
            file=sys.stderr,
        )
