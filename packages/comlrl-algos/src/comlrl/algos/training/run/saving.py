"""Folders written atomically (:func:`atomic_folder`: a temporary sibling, then a rename)
and an agent's weights and tokenizer saved that way (:func:`save_agent_checkpoint`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "atomic_folder",
    "save_agent_checkpoint",
]


def _fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename inside it) to disk where the OS allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Write a folder atomically: yields an empty temporary sibling
    (``.<name>.tmp-<pid>``) to fill; when the block ends without an exception it replaces
    ``path`` (an existing folder is moved aside to ``.<name>.old-<pid>`` first and removed
    after the rename). After an exception the temporary folder stays for
    :func:`comlrl.algos.training.run.checkpoint.clean_partial_checkpoints` and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    yield tmp
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_agent_checkpoint(
    agent: Any, path: str | Path, state_dict: Mapping[str, torch.Tensor] | None = None
) -> Path:
    """Write ``agent``'s model and tokenizer to ``path`` atomically (Hugging Face format).

    ``state_dict``: whole weights to write instead of ``agent.model.state_dict()`` (an
    FSDP2 model's gathered full state dict; its keys are the unwrapped model's).

    The files are written into a temporary sibling folder that is then renamed into place,
    so an interrupted save never leaves a half-written checkpoint at ``path``; an existing
    checkpoint at ``path`` is replaced only after the new one is complete.

    Returns:
        ``path`` as a :class:`~pathlib.Path`; load it with
        ``AutoModelForCausalLM.from_pretrained(path)``, or for a LoRA agent
        (:class:`~comlrl.algos.models.lora_policy.LoraPolicy`: adapter files only) with
        ``PeftModel.from_pretrained(base, path)`` (merged weights, when asked for, in
        ``path/merged``).
    """
    path = Path(path)
    with atomic_folder(path) as tmp:
        if state_dict is not None:
            agent.model.save_pretrained(tmp, state_dict=dict(state_dict))
        else:
            agent.model.save_pretrained(tmp)
        agent.tokenizer.save_pretrained(tmp)
        if (tmp / "merged").is_dir():  # a LoRA agent's merged weights (merge_adapters: true)
            agent.tokenizer.save_pretrained(tmp / "merged")
    return path
