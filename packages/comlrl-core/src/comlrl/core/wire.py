"""The JSON form of what a served task and its trainer exchange (``comlrl serve``).

A task server (:mod:`comlrl.envs.remote.task_server`) and its client
(:class:`comlrl.algos.rollout.remote_task.RemoteTask`) talk JSON over HTTP: one
``POST /v1/task`` per call of the :class:`~comlrl.core.Task` interface and ``GET
/v1/health``. This module holds the version they must share and the plain-data forms of
prompts, feedback and joint actions, so neither side imports the other.

A request::

    {"protocol": 2, "request_id": "<uuid>", "task": "coop_story", "op": "load",
     "split": "train"}
    {"op": "prompts", "example": {...}, "history": [<feedback>, ...]}
    {"op": "feedback", "example": {...}, "joint_action": <joint action>, "info": {...},
     "turn": 0}
    {"op": "score", "examples": [{...}, ...], "completions": [["...", ...], ...]}

answered ``{"request_id": ..., "result": ...}`` or, on an error, ``{"error": "<kind>",
"message": "..."}`` with status 400 (malformed), 401 (token), 404 (task not served), 409
(protocol version), 422 (the task rejected the call: the same on any server) or 500 (the
task failed on this server: another may succeed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from comlrl.core.prompts import ChatPrompt, Prompt
from comlrl.core.records import Feedback, JointAction

__all__ = [
    "TASK_PROTOCOL",
    "decode_feedback",
    "decode_joint_action",
    "decode_prompt",
    "encode_feedback",
    "encode_joint_action",
    "encode_prompt",
]

TASK_PROTOCOL = 2
"""Version of the task-serving protocol (1 was the reward-only worker's)."""


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
