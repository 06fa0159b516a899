"""The wire format shared by the reward worker and its client (JSON over HTTP/1.0).

One ``POST /v1/score`` scores a *chunk* of joint actions::

    {"protocol": 1, "request_id": "<uuid>:<chunk>", "task": "coop_humaneval",
     "examples": [{...}, ...],                 # each distinct example once
     "items": [{"id": "<uuid>:17", "example": 0, "completions": ["...", "..."]}, ...]}

and is answered ``{"request_id": ..., "results": [{"id": ..., "reward": 0.5,
"info": {...}}, ...], "worker": {"pid": ..., "address": ...}}``. Items that share an
example index receive the same example object on the worker, so a reward that groups
joint actions by prompt (``examples[i] is examples[j]``, as
:func:`comlrl.core.as_joint_reward` does) sees the groups it would see locally.

``GET /v1/health`` answers ``{"status": "ok", "task": ..., "num_agents": ..., ...}``.
Errors come back as ``{"error": "<kind>", "message": "..."}`` with status 400 (malformed
request), 401 (bad token), 409 (wrong task), 413 (body too large), 422 (the task rejected
the batch: not worth retrying elsewhere) or 500 (the task failed on this worker: retried
elsewhere).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PROTOCOL_VERSION",
    "TOKEN_ENV",
    "WorkerAddress",
    "parse_worker",
    "dumps",
]

PROTOCOL_VERSION = 1
"""Bumped when a request or response field changes meaning."""

TOKEN_ENV = "COMLRL_REMOTE_TOKEN"
"""Environment variable holding the shared secret workers and clients use (optional)."""

_ADDRESS = re.compile(r"^(?:https?://)?(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(\d{1,5})/?$")


@dataclass(frozen=True)
class WorkerAddress:
    """A reward worker's ``host`` and TCP ``port``; ``str()`` gives ``"host:port"``."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_worker(spec: str | WorkerAddress) -> WorkerAddress:
    """Parse ``"host:port"`` (also ``"[::1]:port"`` and ``"http://host:port"``).

    Raises:
        ValueError: for anything else, or a port outside 1..65535; the message shows the
            bad value and the expected form.
    """
    if isinstance(spec, WorkerAddress):
        return spec
    match = _ADDRESS.match(str(spec).strip()) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(
            f"reward worker address {spec!r} is not of the form 'host:port' "
            "(e.g. 'node7:8470' or '[::1]:8470')"
        )
    host, port = match.group(1).strip("[]"), int(match.group(2))
    if not 1 <= port <= 65535:
        raise ValueError(f"reward worker address {spec!r} has port {port}; use 1..65535")
    return WorkerAddress(host, port)


def _jsonable(value: Any) -> Any:
    """Fallback for values JSON cannot hold: sets as sorted lists, anything else as repr."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if hasattr(value, "item") and callable(value.item):  # NumPy scalars
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    return repr(value)


def dumps(obj: Any) -> bytes:
    """``obj`` as compact UTF-8 JSON; NaN/inf floats are kept (Python's JSON extension)."""
    return json.dumps(obj, separators=(",", ":"), default=_jsonable, allow_nan=True).encode()


def is_number(value: Any) -> bool:
    """True for an ``int`` or ``float`` that is not a ``bool`` (NaN and inf included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
