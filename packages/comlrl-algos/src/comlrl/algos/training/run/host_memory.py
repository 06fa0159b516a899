"""Give the host memory a training step freed back to the system.

A step frees most of what it allocated on the host (the update's activations, the
optimizer's temporaries, the rollout's tensors), but glibc's ``malloc`` keeps freed
blocks below its mmap threshold (up to 32 MiB) in its heaps for reuse, so the process's
resident set stays at its high-water mark: for two float32 SmolLM2-135M agents on a CPU
about 0.9 GB above what the live tensors hold (``benchmarks/bench_gguf_memory.py``,
``benchmarks/results/gguf_memory.json``). :func:`release_freed_memory` hands those pages
back with ``malloc_trim(0)``; the training loop calls it after every step of a process
that holds more than :data:`TRIM_ABOVE_BYTES`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

__all__ = ["TRIM_ABOVE_BYTES", "release_freed_memory", "resident_bytes"]


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or ``None`` (another C library or platform)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


#: :func:`release_freed_memory` trims only a process whose resident set is above this: a
#: small run's heap holds little and its steps are short (the built-in models' steps of
#: about a second would pay 1-3% for nothing).
TRIM_ABOVE_BYTES = 1 << 30


def resident_bytes() -> int | None:
    """This process's resident set in bytes (``/proc/self/statm``), ``None`` off Linux."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def release_freed_memory(min_resident_bytes: int = TRIM_ABOVE_BYTES) -> bool:
    """Return the free pages of the C heap to the system (glibc's ``malloc_trim(0)``) when
    the process's resident set is above ``min_resident_bytes``.

    Live memory is untouched, so it is safe at any time; it costs a walk over the heaps'
    free blocks (0.2 s on a loaded 2-core machine after a two-agent SmolLM2-135M step of
    about 40 s). A no-op returning ``False`` where glibc is not the C library, or below
    the threshold.

    Returns:
        whether memory was given back.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    resident = resident_bytes()
    if resident is None or resident < min_resident_bytes:
        return False
    return bool(trim(0))
