"""Served tasks: a trainer's :class:`RemoteTask` against real :class:`TaskServer` s on
loopback: the same prompts, feedback and rewards as the local task, scoring spread over
several servers (each joint action once, a server killed mid-batch or hung), failover,
idempotent requests, the token, protocol versions, a busy server still answering its
health check, tools run on the server, and the command line (start-up line, a clean
stop on SIGTERM).

Rewards are compared with ``==``: the reward is computed by the same code on the same
text in both places, and JSON carries Python floats exactly (shortest repr round-trip).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp", reason="the task server needs comlrl-envs[serve] (aiohttp)")

from comlrl.core import (  # noqa: E402
    ChatPrompt,
    Feedback,
    JointAction,
    RewardBatch,
    RewardFunctionError,
    Task,
    get_task,
)
from comlrl.envs.remote import (  # noqa: E402
    TASK_PROTOCOL,
    RemoteTask,
    RemoteTaskUnavailable,
    TaskServer,
)
from comlrl.envs.remote.wire import SEAL_KEY  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

TESTS_DIR = Path(__file__).resolve().parent
START_DEADLINE_S = 60.0  # a server process imports comlrl.envs; generous for a loaded machine


class _Talk(Task):
    """Two agents, two turns, chat prompts; counts reward calls; a reward call can be held
    (``gate``) to see the server while it is busy."""

    name = "talk"
    num_agents = 2
    max_turns = 2

    def __init__(self) -> None:
        self.scored = 0
        self.calls = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        topics = ["sea", "fox", "moon", "owl", "sun", "ice"]
        return [{"id": f"talk/{i}", "topic": t, "secret": f"key-{i}"} for i, t in enumerate(topics)]

    def prompts(self, example: Mapping[str, Any], history: Sequence[Feedback] = ()) -> list[Any]:
        said = " / ".join(t for f in history for t in f.texts)
        return [
            ChatPrompt(({"role": "user", "content": f"{example['topic']} {a} {said}"},), raw="r")
            for a in range(2)
        ]

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        self.scored += len(examples)
        self.calls += 1
        same = [examples[i] is examples[0] for i in range(len(examples))]
        return RewardBatch(
            [float(len(a) - len(b)) for a, b in zip(*completions, strict=True)],
            [{"same_example_object": s, "secret": ex["secret"]} for s, ex in zip(same, examples)],
        )

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        texts = tuple(f"{c.upper()} {info['secret']}" for c in joint_action.completions)
        return Feedback(texts=texts, done=turn > 0)


@pytest.fixture
def talk_server() -> Iterator[tuple[TaskServer, _Talk]]:
    task = _Talk()
    server = TaskServer({"talk": task}).start()
    yield server, task
    server.close()


def _address(server: TaskServer) -> str:
    host, port = server.address
    return f"{host}:{port}"


def _post(address: str, body: Mapping[str, Any]) -> Any:
    req = urllib.request.Request(
        f"http://{address}/v1/task", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _health(address: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{address}/v1/health", timeout=30) as resp:
        return dict(json.loads(resp.read()))


def without_seal(infos: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in info.items() if k != SEAL_KEY} for info in infos]


# ----------------------------------------------------------------------------- in process
def test_a_served_task_gives_what_the_local_task_gives(
    talk_server: tuple[TaskServer, _Talk],
) -> None:
    server, task = talk_server
    remote = RemoteTask("talk", [_address(server)])
    assert (remote.num_agents, remote.max_turns) == (2, 2)
    served = remote.load("train")
    local = task.load("train")
    assert served == [{"ref": ["train", i], "id": ex["id"]} for i, ex in enumerate(local)]
    assert remote.prompts(served[1]) == task.prompts(local[1])
    batch = remote.reward([["aaa", "b"], ["a", "bbb"]], [served[1], served[1]])
    assert batch.rewards == [2.0, -2.0]
    # the same example object twice on this side is one object on the server too
    assert [i["same_example_object"] for i in batch.infos] == [True, True]
    assert without_seal(batch.infos) == without_seal(
        task.reward([["a"], ["b"]], [local[1]]).infos * 2
    )
    assert all(isinstance(i[SEAL_KEY], str) for i in batch.infos)  # a multi-turn task's
    action = JointAction((0, 1), ("aaa", "a"))
    fb = remote.feedback(served[1], action, batch.infos[0], 0)
    assert fb == task.feedback(local[1], action, without_seal(batch.infos)[0], 0)
    assert remote.prompts(served[1], [fb]) == task.prompts(local[1], [fb])
    assert task.scored == 3  # two here, one for the expected infos
    with pytest.raises(ValueError, match="RemoteTask.load gave"):
        remote.prompts(local[1])


def test_a_batch_is_scored_across_the_servers_each_joint_action_once() -> None:
    tasks = [_Talk() for _ in range(3)]
    servers = [TaskServer({"talk": t}).start() for t in tasks]
    try:
        remote = RemoteTask("talk", [_address(s) for s in servers])
        served = remote.load()
        completions: list[list[str]] = [[], []]
        examples = []
        for n, ex in enumerate(served):  # 6 prompts x 4 joint actions
            for j in range(4):
                completions[0].append("x" * (n + j))
                completions[1].append("y" * j)
                examples.append(ex)
        batch = remote.reward(completions, examples)
        assert batch.rewards == [float(len(a) - len(b)) for a, b in zip(*completions)]
        assert sum(t.scored for t in tasks) == 24  # each joint action once
        assert all(t.calls >= 1 for t in tasks)  # on every server
        # a prompt's joint actions stay in one request: one example object per prompt
        assert all(info["same_example_object"] for info in batch.infos[::4])
    finally:
        for s in servers:
            s.close()


class _Limited:
    """What :meth:`RemoteTask._spans` reads of a client (servers and the body limit)."""

    def __init__(self, servers: int, max_body_bytes: int | None) -> None:
        self.servers = ["h:1"] * servers
        self.max_body_bytes = max_body_bytes


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    servers=st.integers(1, 4),
    length=st.integers(0, 3000),
    limit=st.one_of(st.none(), st.integers(4096 + 2000, 4096 + 40000)),
)
def test_score_requests_cover_each_joint_action_once_and_keep_prompts_whole(
    sizes: list[int], servers: int, length: int, limit: int | None
) -> None:
    examples: list[dict[str, Any]] = []
    for n, size in enumerate(sizes):
        ex = {"ref": ["train", n]}
        examples.extend([ex] * size)
    k = len(examples)
    texts = [["z" * length] * k, ["w"] * k]
    spans = RemoteTask._spans(_Limited(servers, limit), texts, examples)  # type: ignore[arg-type]
    assert [i for lo, hi in spans for i in range(lo, hi)] == list(range(k))  # once, in order
    starts = {sum(sizes[:n]) for n in range(len(sizes) + 1)}
    assert all(lo in starts and hi in starts for lo, hi in spans)  # prompts whole
    if servers == 1 and limit is None:
        assert spans == [(0, k)]
    per_joint_action = len(json.dumps(texts[0][0])) + len(json.dumps("w")) + 4
    for lo, hi in spans:
        one_prompt = sum(1 for s in starts if lo < s < hi) == 0
        if limit is not None and not one_prompt:
            assert (hi - lo) * per_joint_action <= limit - 4096


class _OtherTalk(_Talk):
    """``_Talk`` with other data under the same name and shape."""

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        return [{**ex, "topic": ex["topic"] + "!"} for ex in super().load(split)]


def test_options_of_the_host_may_differ_and_the_others_may_not() -> None:
    on_host = {"path": "/data/on/this/host.jsonl", "max_workers": 4, "limit": 6}
    server = TaskServer({"talk": _Talk()}, task_kwargs={"talk": on_host}).start()
    try:
        run = {"path": "/elsewhere.jsonl", "max_workers": 1, "limit": 6}
        assert len(RemoteTask("talk", [_address(server)], kwargs=run).load()) == 6
        with pytest.raises(ValueError, match="with options"):
            RemoteTask("talk", [_address(server)], kwargs={**run, "limit": 3})
    finally:
        server.close()


def test_servers_that_hold_different_examples_are_refused_at_load() -> None:
    servers = [TaskServer({"talk": t}).start() for t in (_Talk(), _OtherTalk())]
    try:
        remote = RemoteTask("talk", [_address(s) for s in servers])
        with pytest.raises(ValueError, match="hold different examples in split 'train'"):
            remote.load()
    finally:
        for s in servers:
            s.close()


def test_calls_fail_over_to_the_next_server(talk_server: tuple[TaskServer, _Talk]) -> None:
    server, task = talk_server
    spare = TaskServer({"talk": _Talk()})
    dead = _address(spare)
    spare.close()  # a port nothing listens on any more
    remote = RemoteTask("talk", [dead, _address(server)])
    ex = remote.load()[0]
    for _ in range(4):  # each call starts at another server; the dead one is skipped
        assert remote.reward([["aa"], ["a"]], [ex]).rewards == [1.0]
    assert task.scored == 4
    assert remote.failovers == 1  # once failed, the dead server is asked last
    server.close()
    with pytest.raises(RewardFunctionError, match="no task server answered 'score'"):
        remote.reward([["aa"], ["a"]], [ex])


def test_a_hung_server_is_left_after_the_timeout_and_the_batch_scored_once(
    talk_server: tuple[TaskServer, _Talk],
) -> None:
    server, task = talk_server
    stuck_task = _Talk()
    stuck_task.gate = threading.Event()  # never set until the end: the server hangs
    stuck = TaskServer({"talk": stuck_task}).start()
    try:
        remote = RemoteTask("talk", [_address(stuck), _address(server)], timeout_s=1.0)
        ex = remote.load()[0]  # from the first server that answers
        batch = remote.reward([["aaa"], ["a"]], [ex])
        assert batch.rewards == [2.0] and task.scored == 1
    finally:
        stuck_task.gate.set()
        stuck.close()


def test_a_repeated_request_id_is_answered_from_the_cache(
    talk_server: tuple[TaskServer, _Talk],
) -> None:
    server, task = talk_server
    body = {
        "protocol": TASK_PROTOCOL,
        "request_id": "same-id",
        "task": "talk",
        "op": "score",
        "examples": [{"ref": ["train", 0]}],
        "example_index": [0],
        "completions": [["aa"], ["a"]],
    }
    answers = [_post(_address(server), body) for _ in range(2)]  # a client retrying
    assert answers[0] == answers[1]
    assert task.scored == 1 and server.duplicates_served == 1


def test_the_token_the_protocol_and_the_task_name_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COMLRL_REMOTE_TOKEN", raising=False)
    server = TaskServer({"talk": _Talk()}, token="s3cret").start()
    try:
        with pytest.raises(ValueError, match="wrong token"):
            RemoteTask("talk", [_address(server)], token="guess")
        with pytest.raises(ValueError, match="wrong token"):
            RemoteTask("talk", [_address(server)])
        assert RemoteTask("talk", [_address(server)], token="s3cret").load()
        monkeypatch.setenv("COMLRL_REMOTE_TOKEN", "s3cret")
        assert RemoteTask("talk", [_address(server)]).load()
        with pytest.raises(ValueError, match="serves \\['talk'\\], not 'other'"):
            RemoteTask("other", [_address(server)])
        with pytest.raises(ValueError, match="with options"):
            RemoteTask("talk", [_address(server)], kwargs={"limit": 2})
        body = {"protocol": 2, "request_id": "x", "task": "talk", "op": "load"}
        req = urllib.request.Request(
            f"http://{_address(server)}/v1/task",
            data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer s3cret"},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 409
        assert "task protocol 2, this server 3" in json.loads(err.value.read())["message"]
    finally:
        server.close()
    with pytest.raises(RemoteTaskUnavailable, match="no task server answered"):
        RemoteTask("talk", ["127.0.0.1:9"])


def test_a_busy_server_answers_its_health_check(talk_server: tuple[TaskServer, _Talk]) -> None:
    server, task = talk_server
    task.gate = threading.Event()
    remote = RemoteTask("talk", [_address(server)])
    ex = remote.load()[0]
    worker = threading.Thread(target=remote.reward, args=([["a"], ["b"]], [ex]))
    worker.start()
    assert task.entered.wait(30)
    health = _health(_address(server))
    assert health["in_flight"] == 1
    assert health["max_body_bytes"] == 4 * 2**20 and health["read_timeout_s"] == 30.0
    task.gate.set()
    worker.join(30)
    assert task.scored == 1


def test_refusals_come_back_as_json(talk_server: tuple[TaskServer, _Talk]) -> None:
    server, _ = talk_server
    small = TaskServer({"talk": _Talk()}, max_body_bytes=100).start()
    try:
        for address, path, data, status, kind in (
            (_address(small), "/v1/task", b"x" * 101, 413, "too_large"),
            (_address(server), "/v1/nothing", b"{}", 404, "not_found"),
            (_address(server), "/v1/task", b"[1]", 400, "bad_request"),
        ):
            req = urllib.request.Request(f"http://{address}{path}", data=data, method="POST")
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=30)
            assert err.value.code == status
            assert json.loads(err.value.read())["error"] == kind
    finally:
        small.close()


# ----------------------------------------------------------------------------- tools
class _Broken(_Talk):
    """``_Talk`` whose agent 0 has a tool that fails as a tool (``ToolError``) or as code."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def tools(self, agent: int) -> Sequence[Any]:
        from comlrl.core import Tool, ToolError

        def run(x: int) -> str:
            self.runs += 1
            if x < 0:
                raise ToolError(f"x must be >= 0, got {x}")
            if x == 0:
                raise KeyError("zero")
            if x == 7:
                time.sleep(3)  # past timeout_s: the server stops waiting
            return str(x * 2)

        schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
        return (Tool("double", "Doubles x.", schema, run, timeout_s=0.5),) if agent == 0 else ()


def test_tool_errors_come_back_as_their_kinds_and_a_retried_call_runs_once() -> None:
    from comlrl.core import JsonToolFormat, run_tool_call

    task = _Broken()
    server = TaskServer({"talk": task}).start()
    try:
        remote = RemoteTask("talk", [_address(server)])
        assert remote.tools(1) == () and [t.name for t in remote.tools(0)] == ["double"]
        tools, fmt = {"double": remote.tools(0)[0]}, JsonToolFormat()
        kinds = []
        for x in (3, -1, 0):
            call = f'<tool_call>{{"name": "double", "arguments": {{"x": {x}}}}}</tool_call>'
            result = run_tool_call(tools, fmt, call)
            kinds.append((result.error, result.content))
        assert kinds[0] == (None, "6")
        assert kinds[1] == ("failed", "x must be >= 0, got -1")
        assert kinds[2][0] == "raised" and "KeyError" in kinds[2][1]
        assert task.runs == 3
        with pytest.raises(TimeoutError, match="did not return within 0.5 s on the server"):
            tools["double"].run(x=7)  # what run_tool_call reports as "timeout"
        body = {
            "protocol": TASK_PROTOCOL,
            "request_id": "tool-id",
            "task": "talk",
            "op": "tool",
            "agent": 0,
            "name": "double",
            "arguments": {"x": 5},
        }
        answers = [_post(_address(server), body) for _ in range(2)]  # a client retrying
        assert answers[0] == answers[1] == {"request_id": "tool-id", "result": {"text": "10"}}
        assert task.runs == 5 and server.tool_calls == 5 and server.duplicates_served == 1
        # arguments that do not fit the schema: the caller's malformed call, never run
        wrong = _post(_address(server), {**body, "request_id": "wrong", "arguments": {"y": 5}})
        assert wrong["result"] == {
            "error": "malformed",
            "message": "Error: double has no argument 'y' (its arguments: x).",
        }
        call = '<tool_call>{"name": "double", "arguments": {"x": "3"}}</tool_call>'
        assert run_tool_call(tools, fmt, call).error == "malformed"  # checked before sending
        assert task.runs == 5
    finally:
        server.close()


def test_a_served_tasks_tools_run_in_the_servers_sandbox() -> None:
    from comlrl.core import ToolError, get_tool_format, run_tool_call

    options = {"num_train": 8, "num_eval": 4}
    server = TaskServer(
        {"tool_math": get_task("tool_math", **options)}, task_kwargs={"tool_math": options}
    ).start()
    local = get_task("tool_math", **options)
    try:
        remote = RemoteTask("tool_math", [_address(server)], kwargs=options)
        assert (remote.tool_format, remote.max_tool_calls) == (
            local.tool_format,
            local.max_tool_calls,
        )
        for agent in range(2):
            (tool,) = remote.tools(agent)
            (mine,) = local.tools(agent)
            assert tool.schema() == mine.schema()
            assert (tool.timeout_s, tool.max_result_chars) == (
                mine.timeout_s,
                mine.max_result_chars,
            )
        tools = {t.name: t for t in remote.tools(0)}
        fmt = get_tool_format(remote.tool_format)
        ok = run_tool_call(tools, fmt, "```python\nprint(6 * 7)\n```")
        assert (ok.error, ok.content) == (None, "42")
        failed = run_tool_call(tools, fmt, "```python\n1 / 0\n```")
        assert failed.error == "failed" and "ZeroDivisionError" in failed.content
        with pytest.raises(ToolError, match="ZeroDivisionError"):
            tools["python"].run(code="1 / 0")
        unknown = run_tool_call(
            tools, get_tool_format("json"), '<tool_call>{"name": "sh"}</tool_call>'
        )
        assert unknown.error == "unknown_tool"
        assert server.tool_calls == 3  # the unknown tool never left here
        with pytest.raises(IndexError, match="agent 2"):
            remote.tools(2)
    finally:
        server.close()
        local.close()


# ----------------------------------------------------------------------------- processes
def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail naming ``what`` after the deadline."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(0.01)


class Servers:
    """Starts server processes and kills every one of them at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, argv: list[str], lines: int = 1) -> tuple[subprocess.Popen[str], list[str]]:
        """Start ``python ARGV`` with the tests folder importable; returns the process and
        its first ``lines`` lines of output (a thread reads them: lines buffered after the
        first leave nothing for a select on the pipe)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(TESTS_DIR), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        )
        env.pop("COMLRL_REMOTE_TOKEN", None)
        log = self.log_dir / f"server-{len(self.procs)}.stderr"
        with open(log, "w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, *argv], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
            )
        self.procs.append(proc)
        stdout = proc.stdout
        assert stdout is not None
        got: queue.Queue[str] = queue.Queue()
        threading.Thread(
            target=lambda: [got.put(stdout.readline()) for _ in range(lines)], daemon=True
        ).start()
        out = []
        for k in range(lines):
            try:
                out.append(got.get(timeout=START_DEADLINE_S if k == 0 else 10.0))
            except queue.Empty:
                break
        if not out or "serving" not in out[0]:
            proc.kill()
            proc.wait()
            pytest.fail(f"server {argv} did not start: {out!r}\n{log.read_text()}")
        return proc, out

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Servers]:
    s = Servers(tmp_path)
    yield s
    s.close()


def test_a_server_killed_mid_batch_loses_and_duplicates_no_reward(
    processes: Servers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    code = f"import _remote_tasks; _remote_tasks.serve({str(gate)!r})"
    started = [processes.start(["-c", code]) for _ in range(3)]
    procs = [p for p, _ in started]
    addresses = [re.search(r"at (\S+)", lines[0])[1] for _, lines in started]  # type: ignore[index]
    remote = RemoteTask("gated", addresses, timeout_s=60.0)
    served = remote.load()
    completions: list[list[str]] = [[], []]
    examples = []
    for n in range(6):  # 6 prompts x 4 joint actions: 6 requests of 4 over 3 servers
        for j in range(4):
            completions[0].append("a" * (n + j))
            completions[1].append("b" * j)
            examples.append(served[n])
    out: dict[str, Any] = {}

    def score() -> None:
        try:
            out["batch"] = remote.reward(completions, examples)
        except BaseException as exc:  # reported by the assertions below
            out["error"] = exc

    caller = threading.Thread(target=score)
    caller.start()
    # every server holds a request at the gate
    wait_for(
        lambda: all(list(gate.glob(f"started-{p.pid}-*")) for p in procs),
        "each server to enter a request",
    )
    victim = procs[0]
    victim.send_signal(signal.SIGKILL)  # while it holds a request
    victim.wait(30)
    (gate / "open").touch()
    caller.join(timeout=60)
    assert not caller.is_alive(), "the remote call did not finish within 60 s"
    assert "error" not in out, out.get("error")
    # GatedTask's reward: len(a) - len(b) + n, n the example's index
    want = [float(len(a) - len(b) + ex["ref"][1]) for a, b, ex in zip(*completions, examples)]
    assert out["batch"].rewards == want
    scored = {p.pid: 0 for p in procs}
    for mark in gate.glob("scored-*"):
        _, pid, _, k = mark.name.split("-")
        scored[int(pid)] += int(k)
    assert scored[victim.pid] == 0 and sum(scored.values()) == 24  # each joint action once
    assert remote.failovers >= 1


def test_the_command_line_serves_scores_like_the_local_task_and_stops_cleanly(
    processes: Servers, humaneval_file: Path, rows_by_id: dict[str, Any]
) -> None:
    options = {"path": str(humaneval_file), "limit": 3, "timeout_s": 10.0, "max_workers": 1}
    argv = ["-m", "comlrl.envs.remote", "--task", "coop_humaneval", "--port", "0"]
    for key, value in options.items():
        argv += ["--option", f"coop_humaneval.{key}={value}"]
    started = [processes.start(argv, lines=2) for _ in range(2)]
    addresses = []
    for proc, lines in started:
        found = re.match(
            r"serving coop_humaneval at (\S+):(\d+) \(token off, pid (\d+)\)", lines[0]
        )
        assert found, lines
        assert int(found[3]) == proc.pid
        address = f"{found[1]}:{found[2]}"
        addresses.append(address)
        assert lines[1].strip() == (
            f"train with: comlrl train task.name=coop_humaneval "
            f"task.kwargs.path={humaneval_file} task.kwargs.limit=3 task.kwargs.timeout_s=10.0 "
            f"task.kwargs.max_workers=1 'task.remote=[{address}]'"
        )
    remote = RemoteTask("coop_humaneval", addresses, kwargs=options, timeout_s=60.0)
    local = get_task("coop_humaneval", **options)
    try:
        served = remote.load()
        rows = list(local.load())
        helpers = ["x):\n    return x\n", "", "numbers):\n    return sum(numbers) / len(numbers)\n"]
        completions: list[list[str]] = [[], []]
        examples, local_examples = [], []
        for ex, row in zip(served, rows, strict=True):
            assert rows_by_id[ex["id"]]["prompt"] == row["prompt"]
            for j, main in enumerate(
                [row["canonical_solution"], "    return None\n", "    syntax error(\n"]
            ):
                completions[0].append(helpers[j])
                completions[1].append(main)
                examples.append(ex)
                local_examples.append(row)
        got = remote.reward(completions, examples)
        want = local.reward(completions, local_examples)
    finally:
        local.close()
    assert got.rewards == want.rewards
    assert len(set(got.rewards)) > 1, "the batch must hold different rewards to compare"
    timing = {"duration_s", SEAL_KEY}
    assert [{k: v for k, v in i.items() if k not in timing} for i in got.infos] == [
        {k: v for k, v in i.items() if k not in timing} for i in json.loads(json.dumps(want.infos))
    ]
    calls = [_health(a)["calls"] for a in addresses]
    assert all(c >= 2 for c in calls)  # scoring spread over both (a load to the first too)
    for proc, _ in started:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    for n in range(2):
        log = (processes.log_dir / f"server-{n}.stderr").read_text()
        assert "Traceback" not in log, log


def test_the_reward_workers_commands_are_gone_with_a_pointer() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "comlrl.envs.remote", "serve", "--task", "gsm8k"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "comlrl-serve --task NAME" in done.stderr and "task.remote" in done.stderr


def test_options_are_json_values_else_strings_and_bad_ones_are_named() -> None:
    from comlrl.envs.remote.cli import parse_options

    got = parse_options(["a", "b"], ["a.limit=64", "a.path=/data/x.jsonl", "b.r=[1, 2]"])
    assert got == {"a": {"limit": 64, "path": "/data/x.jsonl"}, "b": {"r": [1, 2]}}
    with pytest.raises(ValueError, match="is not NAME.KEY=VALUE"):
        parse_options(["a"], ["a=1"])
    with pytest.raises(ValueError, match="names task 'c', which is not served"):
        parse_options(["a"], ["c.limit=1"])
