"""What the trainer says to one reward worker and how it reads the answer.

One HTTP exchange (:func:`request`), the health probe (:func:`probe`), the check that a
worker serves the expected task (:func:`check_identity`) and the reading of a scoring
answer (:func:`read_results`). Failures worth retrying elsewhere raise
:class:`~comlrl.envs.remote.errors.TransientError`; the others raise the public errors.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.envs.remote._protocol import PROTOCOL_VERSION, WorkerAddress, dumps, is_number
from comlrl.envs.remote.errors import RemoteRewardError, RemoteTaskError, TransientError

__all__ = ["check_identity", "probe", "read_results", "request"]


def request(
    address: WorkerAddress,
    method: str,
    path: str,
    body: bytes | None,
    *,
    timeout_s: float,
    connect_timeout_s: float,
    token: str | None,
) -> tuple[int, dict[str, Any]]:
    """One HTTP exchange: ``(status, answer)`` with ``answer`` the JSON object the worker sent.

    Args:
        address: the worker.
        method, path: ``"GET"``/``"POST"`` and the endpoint (``/v1/health``, ``/v1/score``).
        body: the JSON request body, or ``None``.
        timeout_s: seconds the worker may stay silent once connected.
        connect_timeout_s: seconds to wait for the TCP connection.
        token: the shared secret sent as a bearer token (``None``: none sent).

    Raises:
        TransientError: a transport failure, a timeout, or an answer that is not a JSON object.
    """
    conn = http.client.HTTPConnection(address.host, address.port, timeout=connect_timeout_s)
    try:
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(timeout_s)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        status = response.status
    except TimeoutError as exc:
        raise TransientError(f"no answer within {timeout_s:g} s ({exc or 'timed out'})") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise TransientError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    try:
        answer = json.loads(raw)
    except ValueError as exc:
        raise TransientError(f"HTTP {status} with a body that is not JSON: {raw[:200]!r}") from exc
    if not isinstance(answer, dict):
        raise TransientError(f"HTTP {status} with JSON that is not an object")
    return status, answer


def probe(
    address: WorkerAddress, *, timeout_s: float, connect_timeout_s: float, token: str | None
) -> dict[str, Any]:
    """The worker's health answer (``/v1/health``), waiting at most
    ``min(timeout_s, connect_timeout_s)`` seconds.

    Raises:
        RemoteRewardError: the worker refused the token (HTTP 401).
        TransientError: no answer, or an answer other than ``status: ok``.
    """
    wait = min(timeout_s, connect_timeout_s)
    status, answer = request(
        address,
        "GET",
        "/v1/health",
        None,
        timeout_s=wait,
        connect_timeout_s=connect_timeout_s,
        token=token,
    )
    if status == 401:
        raise RemoteRewardError(f"reward worker {address}: {answer.get('message')}")
    if status != 200 or answer.get("status") != "ok":
        raise TransientError(
            f"health check answered HTTP {status}: {answer.get('message', answer)}"
        )
    return answer


def check_identity(
    address: WorkerAddress,
    answer: Mapping[str, Any],
    *,
    task_name: str,
    num_agents: int | None,
    expect_kwargs: Mapping[str, Any] | None,
    host_local: frozenset[str],
) -> None:
    """Check that a worker's health ``answer`` names the expected protocol, task, agent
    count and task options (options in ``host_local`` may differ).

    Raises:
        RemoteRewardError: naming every difference and the command that starts a worker
            with the trainer's task.
    """
    problems = []
    if answer.get("protocol") != PROTOCOL_VERSION:
        problems.append(f"protocol {answer.get('protocol')!r} (this client: {PROTOCOL_VERSION})")
    if answer.get("task") != task_name:
        problems.append(f"task {answer.get('task')!r} (expected {task_name!r})")
    if num_agents is not None and answer.get("num_agents") != num_agents:
        problems.append(f"num_agents={answer.get('num_agents')!r} (expected {num_agents})")
    if expect_kwargs is not None:
        theirs = answer.get("kwargs") or {}
        keys = (set(theirs) | set(expect_kwargs)) - host_local
        differ = {
            k: (expect_kwargs.get(k, "<default>"), theirs.get(k, "<default>"))
            for k in sorted(keys)
            if _canonical(expect_kwargs.get(k)) != _canonical(theirs.get(k))
        }
        if differ:
            problems.append(
                "task options "
                + ", ".join(f"{k}={v[1]!r} (expected {v[0]!r})" for k, v in differ.items())
            )
    if problems:
        raise RemoteRewardError(
            f"reward worker {address} serves a different task: {'; '.join(problems)}. "
            f"Restart it with `python -m comlrl.envs.remote serve --task {task_name}` "
            "and the trainer's task options."
        )


def read_results(
    address: WorkerAddress,
    request_id: str,
    ids: Sequence[str],
    status: int,
    answer: Mapping[str, Any],
) -> dict[str, tuple[float, dict[str, Any]]]:
    """The ``{joint-action id: (reward, info)}`` of a scoring answer to request
    ``request_id``, which asked for the joint actions ``ids``.

    Raises:
        RemoteTaskError: the worker's task rejected the batch (HTTP 422).
        RemoteRewardError: the worker refused the request (HTTP 400, 401, 409, 413).
        TransientError: another status, or an answer that does not match the request.
    """
    message = str(answer.get("message", answer))
    if status == 422:
        raise RemoteTaskError(f"reward worker {address}: {message}")
    if status in (400, 401, 409, 413):
        raise RemoteRewardError(
            f"reward worker {address} refused the request (HTTP {status}): {message}"
        )
    if status != 200:
        raise TransientError(f"HTTP {status}: {message}")
    results = answer.get("results")
    if answer.get("request_id") != request_id or not isinstance(results, list):
        raise TransientError("answer does not match the request (request_id or results missing)")
    out: dict[str, tuple[float, dict[str, Any]]] = {}
    for r in results:
        if not (isinstance(r, dict) and r.get("id") in ids and is_number(r.get("reward"))):
            raise TransientError(f"malformed result {str(r)[:200]}")
        info = r.get("info")
        out[r["id"]] = (float(r["reward"]), info if isinstance(info, dict) else {})
    if len(out) != len(ids):
        raise TransientError(f"answered {len(out)} of the chunk's {len(ids)} joint actions")
    return out


def _canonical(value: Any) -> str:
    """Options compared as JSON, so a tuple equals the list it became on the wire."""
    return dumps(value).decode()
