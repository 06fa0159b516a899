"""Reward hacks aimed at a task server, written as a client would write them: each must be
refused or earn nothing.

A client that reaches a task server's port speaks HTTP to it directly, so these tests do
too (``http.client`` and raw sockets, the protocol version read from the health answer):
reading the tests or reference solutions, scoring against tests it sends, asking for
feedback on failures it made up, replaying a request id with another body, holding a
connection open with half a request, sending a body past the limit, and reaching a
server bound to every address without a token. Each has a control: the honest request
gets its answer.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp", reason="the task server needs comlrl-envs[serve] (aiohttp)")

from comlrl.core import get_task  # noqa: E402
from comlrl.envs.remote.task_server import TaskServer  # noqa: E402

WRONG_MAIN = "def {entry}(*args, **kwargs):\n    return None\n"
NO_OP_TEST = "def check(candidate):\n    assert candidate is not None\n"


# ----------------------------------------------------------------------------- a client
class Client:
    """Raw HTTP to one task server, as any process that reaches its port can speak it."""

    def __init__(self, server: TaskServer, token: str | None = None) -> None:
        self.host, self.port = server.address
        self.token = token
        self.protocol = self.get("/v1/health")[1].get("protocol")
        self.n = 0

    def headers(self) -> dict[str, str]:
        out = {"Content-Type": "application/json"}
        if self.token:
            out["Authorization"] = f"Bearer {self.token}"
        return out

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request("GET", path, headers=self.headers())
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def post_raw(self, body: bytes) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request("POST", "/v1/task", body=body, headers=self.headers())
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode(errors="replace")

    def call(self, task: str, op: str, request_id: str | None = None, **fields: Any) -> Any:
        self.n += 1
        body = {
            "protocol": self.protocol,
            "request_id": request_id or f"hack-{self.n}-{time.monotonic_ns()}",
            "task": task,
            "op": op,
            **fields,
        }
        return self.post_raw(json.dumps(body).encode())


@pytest.fixture(scope="module")
def humaneval_server(humaneval_file: Path) -> Iterator[tuple[TaskServer, Any]]:
    local = get_task("coop_humaneval", path=str(humaneval_file), limit=3, max_workers=1)
    rows = list(local.load("train"))
    task = get_task("coop_humaneval", path=str(humaneval_file), limit=3, max_workers=1)
    server = TaskServer({"coop_humaneval": task}).start()
    yield server, rows
    server.close()
    local.close()


@pytest.fixture(scope="module")
def story_server() -> Iterator[TaskServer]:
    server = TaskServer({"coop_story": get_task("coop_story", limit=4)}).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def impatient_server() -> Iterator[TaskServer]:
    """A server that gives a client 1 s to send a request's head, then its body."""
    server = TaskServer({"coop_story": get_task("coop_story", limit=4)}, read_timeout_s=1.0)
    server.start()
    yield server
    server.close()


def _score(client: Client, examples: list[Any], completions: list[list[str]]) -> tuple[int, Any]:
    return client.call(
        "coop_humaneval",
        "score",
        examples=examples,
        example_index=list(range(len(examples))),
        completions=completions,
    )


# ----------------------------------------------------------------------------- binding
def test_a_server_on_every_address_without_a_token_refuses_to_start() -> None:
    story = get_task("coop_story", limit=2)
    with pytest.raises(ValueError, match="COMLRL_REMOTE_TOKEN"):
        TaskServer({"coop_story": story}, host="0.0.0.0")
    server = TaskServer({"coop_story": story}, host="0.0.0.0", token="t0ken-for-the-test")
    server.close()  # with a token it binds (the control)
    env = {k: v for k, v in os.environ.items() if k != "COMLRL_REMOTE_TOKEN"}
    args = ["--task", "coop_story", "--option", "coop_story.limit=2", "--host", "0.0.0.0"]
    done = subprocess.run(
        [sys.executable, "-m", "comlrl.envs.remote", *args, "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refusing to serve on '0.0.0.0' without a token" in done.stderr
    assert "export COMLRL_REMOTE_TOKEN=" in done.stderr  # says how to set one


def test_a_token_set_on_loopback_is_required_of_every_request() -> None:
    server = TaskServer({"coop_story": get_task("coop_story", limit=2)}, token="s3cret").start()
    try:
        host, port = server.address
        for path, method in (("/v1/health", "GET"), ("/v1/task", "POST")):
            for header in ({}, {"Authorization": "Bearer guess"}):
                conn = http.client.HTTPConnection(host, port, timeout=30)
                conn.request(method, path, body=b"{}" if method == "POST" else None, headers=header)
                resp = conn.getresponse()
                assert resp.status == 401, (path, header)
                assert json.loads(resp.read())["error"] == "unauthorized"
                conn.close()
        status, answer = Client(server, token="s3cret").call("coop_story", "load")
        assert status == 200 and len(answer["result"]["examples"]) == 2
    finally:
        server.close()


# ----------------------------------------------------------------------------- own data
def test_load_answers_references_never_tests_or_solutions(
    humaneval_server: tuple[TaskServer, Any],
) -> None:
    server, rows = humaneval_server
    client = Client(server)
    status, answer = client.call("coop_humaneval", "load", split="train")
    assert status == 200
    text = json.dumps(answer)
    for row in rows:  # not a line of a test or of a reference solution goes out
        for secret in (row["test"], row["canonical_solution"]):
            for line in secret.splitlines():
                if len(line.strip()) > 12:
                    assert line.strip() not in text
    served = answer["result"]["examples"]
    assert len(served) == len(rows) == 3
    assert all(set(ex) == {"ref", "id"} for ex in served), served
    _, health = client.get("/v1/health")
    assert rows[0]["test"].strip().splitlines()[-1] not in json.dumps(health)


def test_scoring_uses_the_servers_tests_never_the_clients(
    humaneval_server: tuple[TaskServer, Any],
) -> None:
    server, rows = humaneval_server
    client = Client(server)
    served = client.call("coop_humaneval", "load", split="train")[1]["result"]["examples"]
    wrong = [[""] * 3, [WRONG_MAIN.format(entry=row["entry_point"]) for row in rows]]
    status, honest = _score(client, served, wrong)
    assert status == 200
    honest_rewards = honest["result"]["rewards"]
    right = [[""] * 3, [row["prompt"] + row["canonical_solution"] for row in rows]]
    status, solved = _score(client, served, right)
    assert status == 200 and min(solved["result"]["rewards"]) > max(honest_rewards)  # control
    # the same wrong programs, with tests of the client's own beside each example's name
    forged = [{**ex, "test": NO_OP_TEST, "check": NO_OP_TEST} for ex in served]
    status, answer = _score(client, forged, wrong)
    assert status == 200
    assert answer["result"]["rewards"] == honest_rewards
    # a whole example of the client's making names nothing the server holds
    own = {**rows[0], "test": NO_OP_TEST}
    status, answer = _score(client, [own], [[""], [wrong[1][0]]])
    assert status == 400, answer
    assert answer["error"] == "bad_example"


def test_feedback_is_given_only_on_infos_the_server_sealed(
    humaneval_server: tuple[TaskServer, Any],
) -> None:
    server, rows = humaneval_server
    client = Client(server)
    served = client.call("coop_humaneval", "load", split="train")[1]["result"]["examples"]
    ex, row = served[0], rows[0]
    wrong = WRONG_MAIN.format(entry=row["entry_point"])
    action = {"indices": [0, 0], "completions": ["", wrong]}
    # made-up failures of every unit: the feedback would quote each failing test
    forged = {"status": "failed", "passed": 0, "total": 9}
    forged["errors"] = [f"assert #{n}: AssertionError" for n in range(1, 10)]
    status, answer = client.call(
        "coop_humaneval", "feedback", example=ex, joint_action=action, info=forged, turn=0
    )
    assert status == 421, answer
    assert answer["error"] == "unsealed_info"
    # the control: the info the server returned for this joint action gets its feedback
    status, scored = _score(client, [ex], [[""], [wrong]])
    assert status == 200
    info = scored["result"]["infos"][0]
    status, answer = client.call(
        "coop_humaneval", "feedback", example=ex, joint_action=action, info=info, turn=0
    )
    assert status == 200 and len(answer["result"]["texts"]) == 2
    for changed in (
        {**info, "errors": forged["errors"]},  # the sealed info, edited
        {k: v for k, v in info.items() if k != "server_seal"},  # the seal dropped
    ):
        status, answer = client.call(
            "coop_humaneval", "feedback", example=ex, joint_action=action, info=changed, turn=0
        )
        assert status == 421, answer
    other = {"indices": [0, 0], "completions": ["", "def f(): pass\n"]}  # another joint action
    status, _ = client.call(
        "coop_humaneval", "feedback", example=ex, joint_action=other, info=info, turn=0
    )
    assert status == 421
    status, _ = client.call(  # another example
        "coop_humaneval", "feedback", example=served[1], joint_action=action, info=info, turn=0
    )
    assert status == 421


# ----------------------------------------------------------------------------- request ids
def test_a_request_id_reused_with_another_body_gets_409(story_server: TaskServer) -> None:
    client = Client(story_server)
    served = client.call("coop_story", "load")[1]["result"]["examples"]
    fields = {"examples": served[:1], "example_index": [0], "completions": [["a b"], ["c d"]]}
    first = client.call("coop_story", "score", request_id="one-id", **fields)
    again = client.call("coop_story", "score", request_id="one-id", **fields)  # a retry
    assert first[0] == again[0] == 200 and first[1] == again[1]
    calls = client.get("/v1/health")[1]["calls"]
    other = {**fields, "completions": [["a b c d e f"], ["c d"]]}
    for op, body in (("score", other), ("prompts", {"example": served[0]})):
        status, answer = client.call("coop_story", op, request_id="one-id", **body)
        assert status == 409, answer
        assert answer["error"] == "request_id_reused"
    assert client.get("/v1/health")[1]["calls"] == calls  # nothing ran


# ----------------------------------------------------------------------------- HTTP limits
def test_a_body_over_the_limit_is_refused_with_413() -> None:
    server = TaskServer({"coop_story": get_task("coop_story", limit=2)}).start()  # the default
    try:
        client = Client(server)
        served = client.call("coop_story", "load")[1]["result"]["examples"]
        big = "word " * (5 * 2**20 // 5)  # 5 MiB: over the default of a few MiB
        status, answer = client.call(
            "coop_story",
            "score",
            examples=served[:1],
            example_index=[0],
            completions=[[big], ["c d"]],
        )
        assert status == 413, answer
        assert answer["error"] == "too_large"
        # a body declared too large is refused before a byte of it is read
        with socket.create_connection(server.address, timeout=10) as sock:
            head = "POST /v1/task HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n"
            sock.sendall(head.encode())
            reply = sock.recv(4096).decode(errors="replace")
        assert reply.startswith("HTTP/1.1 413"), reply
    finally:
        server.close()


def _read_until_closed(sock: socket.socket, deadline_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that
    took; fails when it is still open after ``deadline_s``."""
    start = time.monotonic()
    sock.settimeout(deadline_s)
    data = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            pytest.fail(f"the server kept a half-sent request open past {deadline_s} s: {data!r}")
        if not chunk:
            return data, time.monotonic() - start
        data += chunk


def test_a_half_sent_body_is_dropped_after_the_read_timeout(impatient_server: TaskServer) -> None:
    with socket.create_connection(impatient_server.address, timeout=10) as sock:
        head = "POST /v1/task HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        sock.sendall(head.encode() + b'{"protocol": ')  # and then nothing
        data, took = _read_until_closed(sock, deadline_s=15.0)
    assert data.startswith(b"HTTP/1.1 408"), data
    assert b"read_timeout" in data and took < 10.0
    status, _ = Client(impatient_server).call("coop_story", "load")  # the server still serves
    assert status == 200


def test_a_half_sent_head_is_dropped_after_the_read_timeout(impatient_server: TaskServer) -> None:
    with socket.create_connection(impatient_server.address, timeout=10) as sock:
        sock.sendall(b"POST /v1/task HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        _, took = _read_until_closed(sock, deadline_s=15.0)
    assert took < 10.0
