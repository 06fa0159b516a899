"""The one remote protocol of CoMLRL: what a task server and its trainer exchange.

A task server (:mod:`comlrl.envs.remote.task_server`) and its client
(:class:`comlrl.envs.remote.client.RemoteTask`) talk JSON over HTTP: one ``POST /v1/task``
per call of the :class:`~comlrl.core.Task` interface and ``GET /v1/health``. This module
holds the version both sides must share, the token's environment variable and the
plain-data forms of prompts, feedback, joint actions and example references.

The client never holds an example's data: ``load`` answers ``{"examples": [...],
"digest": ...}``, a *reference* per example, ``{"ref": [split, index], "id": ...}``
(``id``: the example's own ``task_id`` or ``id`` when it is a string or an int, else
``"split/index"``), and the SHA-256 of the split's examples (servers with the same digest
hold the same data, which references into it need). Every later call names its examples
by ``ref``; the server looks them up in its own data, so the tests and reference solutions
it scores against never leave it and a client cannot send its own. A request::

    {"protocol": 3, "request_id": "<uuid>", "task": "coop_humaneval", "op": "load",
     "split": "train"}
    {"op": "prompts", "example": {"ref": ["train", 4]}, "history": [<feedback>, ...]}
    {"op": "score", "examples": [{"ref": ["train", 4]}, ...], "example_index": [0, 0, ...],
     "completions": [["...", ...], ...]}
    {"op": "feedback", "example": {"ref": ["train", 4]}, "joint_action": <joint action>,
     "info": {... "server_seal": "..."}, "turn": 0}
    {"op": "tool", "agent": 0, "name": "python", "arguments": {"code": "..."}}

answered ``{"request_id": ..., "result": ...}`` or, on an error, ``{"error": "<kind>",
"message": "..."}`` with status 400 (malformed), 401 (token), 404 (task, tool or endpoint
not served), 408 (the body did not arrive in time), 409 (another protocol version, or a
request id used before with another body), 413 (body over the server's limit), 421 (a
``feedback`` info this server did not seal: ask the next server), 422 (the task rejected
the call: the same on any server) or 500 (the task failed on this server: another may
succeed).

On a multi-turn task each info that ``score`` returns carries :data:`SEAL_KEY`, an HMAC
of the example reference, the joint action and the info under the server's key (derived
from the token, so servers sharing a token accept each other's); ``feedback`` is given
only on a sealed info, so a client cannot ask for feedback on failures that never
happened (feedback can describe the example's tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from comlrl.core.prompts import ChatPrompt, Prompt
from comlrl.core.records import Feedback, JointAction

__all__ = [
    "SEAL_KEY",
    "TASK_PROTOCOL",
    "TOKEN_ENV",
    "decode_feedback",
    "decode_joint_action",
    "decode_prompt",
    "encode_feedback",
    "encode_joint_action",
    "encode_prompt",
]

TASK_PROTOCOL = 3
"""Version of the task-serving protocol (1: the reward-only workers, removed; 2: examples
sent whole; 3: examples named by reference, infos sealed)."""

TOKEN_ENV = "COMLRL_REMOTE_TOKEN"
"""The environment variable holding the token a server requires and its clients send
(``Authorization: Bearer <token>``)."""

SEAL_KEY = "server_seal"
"""The info key of a multi-turn task's seal (see the module docstring)."""


def encode_prompt(prompt: Prompt) -> Any:
    """A prompt as JSON data: a string stays a string; a :class:`ChatPrompt` becomes
    ``{"messages": [...], "raw": ...}``.

    Raises:
        TypeError: neither a ``str`` nor a :class:`ChatPrompt`.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, ChatPrompt):
        return {"messages": [dict(m) for m in prompt.messages], "raw": prompt.raw}
    raise TypeError(f"a prompt is a str or a ChatPrompt, got {type(prompt).__name__}")


def decode_prompt(data: Any) -> Prompt:
    """The prompt :func:`encode_prompt` encoded.

    Raises:
        ValueError: data of another shape.
    """
    if isinstance(data, str):
        return data
    if isinstance(data, Mapping) and isinstance(data.get("messages"), list):
        return ChatPrompt(messages=tuple(dict(m) for m in data["messages"]), raw=data.get("raw"))
    raise ValueError(f"not an encoded prompt: {data!r:.200}")


def encode_feedback(feedback: Feedback) -> dict[str, Any]:
    """A :class:`Feedback` as ``{"texts": [...], "done": bool, "info": {...}}``."""
    return {"texts": list(feedback.texts), "done": bool(feedback.done), "info": dict(feedback.info)}


def decode_feedback(data: Mapping[str, Any]) -> Feedback:
    """The :class:`Feedback` :func:`encode_feedback` encoded.

    Raises:
        ValueError: data without a ``texts`` list.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("texts"), list):
        raise ValueError(f"not an encoded feedback: {data!r:.200}")
    return Feedback(
        texts=tuple(str(t) for t in data["texts"]),
        done=bool(data.get("done", False)),
        info=dict(data.get("info") or {}),
    )


def encode_joint_action(action: JointAction) -> dict[str, Any]:
    """A :class:`JointAction` as ``{"indices": [...], "completions": [...]}``."""
    return {"indices": list(action.indices), "completions": list(action.completions)}


def decode_joint_action(data: Mapping[str, Any]) -> JointAction:
    """The :class:`JointAction` :func:`encode_joint_action` encoded.

    Raises:
        ValueError: data without ``indices`` and ``completions`` lists.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("completions"), list):
        raise ValueError(f"not an encoded joint action: {data!r:.200}")
    return JointAction(
        indices=tuple(int(i) for i in data.get("indices", [])),
        completions=tuple(str(c) for c in data["completions"]),
    )
