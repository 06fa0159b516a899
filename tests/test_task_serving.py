"""Served tasks (``comlrl serve``): a trainer's :class:`RemoteTask` against real
:class:`TaskServer` s on loopback: the same data, prompts, feedback and rewards as the
local task, failover, idempotent requests, the token, protocol versions, a busy server
still answering its health check, and a training run equal to the local one."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp", reason="comlrl serve needs comlrl-envs[serve] (aiohttp)")

from comlrl.algos.rollout.remote_task import RemoteTask, RemoteTaskUnavailable  # noqa: E402
from comlrl.core import (  # noqa: E402
    ChatPrompt,
    Feedback,
    JointAction,
    RewardBatch,
    RewardFunctionError,
    Task,
    get_task,
)
from comlrl.core.wire import TASK_PROTOCOL  # noqa: E402
from comlrl.envs.remote.task_server import TaskServer  # noqa: E402


class _Talk(Task):
    """Two agents, two turns, chat prompts; counts reward calls; a reward call can be held
    (``gate``) to see the server while it is busy."""

    name = "talk"
    num_agents = 2
    max_turns = 2

    def __init__(self) -> None:
        self.scored = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def load(self, split: str = "train") -> list[dict[str, Any]]:
        return [{"id": f"talk/{i}", "topic": t} for i, t in enumerate(["sea", "fox", "moon"])]

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
        same = [examples[i] is examples[0] for i in range(len(examples))]
        return RewardBatch(
            [float(len(a) - len(b)) for a, b in zip(*completions, strict=True)],
            [{"same_example_object": s} for s in same],
        )

    def feedback(
        self,
        example: Mapping[str, Any],
        joint_action: JointAction,
        info: Mapping[str, Any],
        turn: int,
    ) -> Feedback:
        return Feedback(texts=tuple(c.upper() for c in joint_action.completions), done=turn > 0)


@pytest.fixture
def talk_server() -> Any:
    task = _Talk()
    server = TaskServer({"talk": task}).start()
    yield server, task
    server.close()


def _address(server: TaskServer) -> str:
    host, port = server.address
    return f"{host}:{port}"


def test_a_served_task_gives_what_the_local_task_gives(talk_server: Any) -> None:
    server, task = talk_server
    remote = RemoteTask("talk", [_address(server)])
    assert (remote.num_agents, remote.max_turns) == (2, 2)
    assert remote.load("train") == task.load("train")
    ex = remote.load("train")[1]
    fb = remote.feedback(ex, JointAction((0, 1), ("ab", "c")), {"k": 1}, 0)
    assert fb == Feedback(texts=("AB", "C"), done=False)
    assert remote.prompts(ex, [fb]) == task.prompts(ex, [fb])
    batch = remote.reward([["aaa", "b"], ["a", "bbb"]], [ex, ex])
    assert batch.rewards == [2.0, -2.0]
    # the same example object twice on this side is one object on the server too
    assert [i["same_example_object"] for i in batch.infos] == [True, True]
    assert task.scored == 2


def test_calls_fail_over_to_the_next_server(talk_server: Any) -> None:
    server, task = talk_server
    spare = TaskServer({"talk": _Talk()})
    dead = _address(spare)
    spare.close()  # a port nothing listens on any more
    remote = RemoteTask("talk", [dead, _address(server)])
    for _ in range(4):  # each call starts at another server; the dead one is skipped
        assert remote.reward([["aa"], ["a"]], [{"id": "x", "topic": "t"}]).rewards == [1.0]
    assert task.scored == 4
    assert remote.failovers == 1  # once failed, the dead server is asked last
    server.close()
    with pytest.raises(RewardFunctionError, match="no task server answered 'score'"):
        remote.reward([["aa"], ["a"]], [{"id": "x", "topic": "t"}])


def test_a_hung_server_is_left_after_the_timeout_and_the_batch_scored_once(
    talk_server: Any,
) -> None:
    server, task = talk_server
    stuck_task = _Talk()
    stuck_task.gate = threading.Event()  # never set until the end: the server hangs
    stuck = TaskServer({"talk": stuck_task}).start()
    try:
        remote = RemoteTask("talk", [_address(stuck), _address(server)], timeout_s=1.0)
        batch = remote.reward([["aaa"], ["a"]], [{"id": "x", "topic": "t"}])
        assert batch.rewards == [2.0] and task.scored == 1
    finally:
        stuck_task.gate.set()
        stuck.close()


def test_a_repeated_request_id_is_answered_from_the_cache(talk_server: Any) -> None:
    server, task = talk_server
    body = {
        "protocol": TASK_PROTOCOL,
        "request_id": "same-id",
        "task": "talk",
        "op": "score",
        "examples": [{"id": "x", "topic": "t"}],
        "example_index": [0],
        "completions": [["aa"], ["a"]],
    }
    answers = []
    for _ in range(2):  # a client retrying after a lost answer
        req = urllib.request.Request(
            f"http://{_address(server)}/v1/task", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            answers.append(json.loads(resp.read()))
    assert answers[0] == answers[1]
    assert task.scored == 1 and server.duplicates_served == 1


def test_the_token_the_protocol_and_the_task_name_are_checked() -> None:
    task = _Talk()
    server = TaskServer({"talk": task}, token="s3cret").start()
    try:
        with pytest.raises(ValueError, match="wrong token"):
            RemoteTask("talk", [_address(server)], token="guess")
        assert RemoteTask("talk", [_address(server)], token="s3cret").load()
        with pytest.raises(ValueError, match="serves \\['talk'\\], not 'other'"):
            RemoteTask("other", [_address(server)], token="s3cret")
        with pytest.raises(ValueError, match="with options"):
            RemoteTask("talk", [_address(server)], token="s3cret", kwargs={"limit": 2})
    finally:
        server.close()
    from comlrl.envs.remote import RewardServer

    worker = RewardServer(_Talk()).start()  # today's reward-only worker: protocol 1
    try:
        host, port = worker.address
        with pytest.raises(ValueError, match="task protocol 1, this client 2"):
            RemoteTask("talk", [f"{host}:{port}"])
    finally:
        worker.close()
    with pytest.raises(RemoteTaskUnavailable, match="no task server answered"):
        RemoteTask("talk", ["127.0.0.1:9"])


def test_a_busy_server_answers_its_health_check(talk_server: Any) -> None:
    server, task = talk_server
    task.gate = threading.Event()
    remote = RemoteTask("talk", [_address(server)])
    worker = threading.Thread(target=remote.reward, args=([["a"], ["b"]], [{"id": "x"}]))
    worker.start()
    assert task.entered.wait(30)
    with urllib.request.urlopen(f"http://{_address(server)}/v1/health", timeout=30) as resp:
        assert json.loads(resp.read())["in_flight"] == 1
    task.gate.set()
    worker.join(30)
    assert task.scored == 1


def test_training_on_a_served_task_matches_training_on_the_local_task(tmp_path: Path) -> None:
    from comlrl.algos.cli.main import main

    server = TaskServer(
        {"coop_story": get_task("coop_story", limit=8)}, task_kwargs={"coop_story": {"limit": 8}}
    ).start()
    common = ["train", "task.name=coop_story", "task.kwargs.limit=8", "num_steps=2"]
    common += ["batch_size=2", "num_generations=2", "max_new_tokens=8", "progress=false"]
    try:
        remote = [*common, f"task.remote=[{_address(server)}]", f"output_dir={tmp_path / 'r'}"]
        assert main(remote) == 0
    finally:
        server.close()
    assert main([*common, f"output_dir={tmp_path / 'l'}"]) == 0
    rows = {
        d: [json.loads(line)["reward_mean"] for line in (tmp_path / d / "metrics.jsonl").open()]
        for d in ("r", "l")
    }
    assert rows["r"] == rows["l"] and len(rows["r"]) == 2


def test_comlrl_serve_hosts_a_task_until_sigterm() -> None:
    import re
    import shutil
    import signal
    import subprocess
    import sys

    exe = shutil.which("comlrl", path=str(Path(sys.executable).parent)) or shutil.which("comlrl")
    cmd = [exe] if exe else [sys.executable, "-m", "comlrl.algos.cli.main"]
    args = ["serve", "--task", "coop_story", "--option", "coop_story.limit=4", "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"serving coop_story at (\S+):(\d+) ", line)
        assert found, line + (proc.stderr.read() if proc.stderr else "")
        remote = RemoteTask("coop_story", [f"{found[1]}:{found[2]}"], kwargs={"limit": 4})
        assert len(remote.load("train")) == 4
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_the_reward_worker_runs_on_aiohttp_and_answers_errors_as_json() -> None:
    import urllib.error

    from comlrl.envs.remote import RewardServer

    worker = RewardServer(_Talk(), max_body_bytes=100).start()
    host, port = worker.address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/v1/health", timeout=30) as resp:
            assert "aiohttp" in resp.headers["Server"]  # not the standard library's http.server
            assert json.loads(resp.read())["protocol"] == 1
        for path, data, status, kind in (
            ("/v1/score", b"x" * 101, 413, "too_large"),
            ("/v1/nothing", b"{}", 404, "not_found"),
        ):
            req = urllib.request.Request(f"http://{host}:{port}{path}", data=data, method="POST")
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=30)
            assert err.value.code == status
            assert json.loads(err.value.read())["error"] == kind
    finally:
        worker.close()


# ------------------------------------------------------------------ tools of a served task
TOOL_MATH_OPTIONS = {"num_train": 8, "num_eval": 4}


@pytest.fixture(scope="module")
def served_tool_math() -> Any:
    """``comlrl serve --task tool_math`` in a process of its own: ``(address, pid)``."""
    import re
    import shutil
    import signal
    import subprocess
    import sys

    exe = shutil.which("comlrl", path=str(Path(sys.executable).parent)) or shutil.which("comlrl")
    cmd = [exe] if exe else [sys.executable, "-m", "comlrl.algos.cli.main"]
    args = ["serve", "--task", "tool_math", "--port", "0"]
    for key, value in TOOL_MATH_OPTIONS.items():
        args += ["--option", f"tool_math.{key}={value}"]
    proc = subprocess.Popen(
        [*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"serving tool_math at (\S+):(\d+) ", line)
        assert found, line + (proc.stderr.read() if proc.stderr else "")
        yield f"{found[1]}:{found[2]}", proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def _health(address: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{address}/v1/health", timeout=30) as resp:
        return dict(json.loads(resp.read()))


def test_a_served_tasks_tools_run_in_the_servers_sandbox(served_tool_math: Any) -> None:
    import os

    from comlrl.core import ToolError, get_tool_format, run_tool_call

    address, pid = served_tool_math
    remote = RemoteTask("tool_math", [address], kwargs=TOOL_MATH_OPTIONS)
    local = get_task("tool_math", **TOOL_MATH_OPTIONS)
    assert (remote.tool_format, remote.max_tool_calls) == (local.tool_format, local.max_tool_calls)
    for agent in range(2):
        (tool,) = remote.tools(agent)
        (mine,) = local.tools(agent)
        assert tool.schema() == mine.schema()
        assert (tool.timeout_s, tool.max_result_chars) == (mine.timeout_s, mine.max_result_chars)
    health = _health(address)
    assert health["pid"] == pid != os.getpid()
    before = health["tool_calls"]
    tools = {t.name: t for t in remote.tools(0)}
    fmt = get_tool_format(remote.tool_format)
    ok = run_tool_call(tools, fmt, "```python\nprint(6 * 7)\n```")
    assert (ok.error, ok.content) == (None, "42")
    failed = run_tool_call(tools, fmt, "```python\n1 / 0\n```")
    assert failed.error == "failed" and "ZeroDivisionError" in failed.content
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        tools["python"].run(code="1 / 0")
    unknown = run_tool_call(tools, get_tool_format("json"), '<tool_call>{"name": "sh"}</tool_call>')
    assert unknown.error == "unknown_tool"
    assert _health(address)["tool_calls"] == before + 3  # the unknown tool never left here
    with pytest.raises(IndexError, match="agent 2"):
        remote.tools(2)


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
        answers = []
        for _ in range(2):  # a client retrying after a lost answer
            req = urllib.request.Request(
                f"http://{_address(server)}/v1/task", data=json.dumps(body).encode(), method="POST"
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                answers.append(json.loads(resp.read()))
        assert answers[0] == answers[1] == {"request_id": "tool-id", "result": {"text": "10"}}
        assert task.runs == 5 and server.tool_calls == 5 and server.duplicates_served == 1
    finally:
        server.close()


class _ScriptedSampler:
    """A generation backend that writes a tool call, then (once its output is in the
    context) an answer; NaN log-probs, so the agent measures them with its model."""

    name = "native"
    recompute_logprobs = False
    supports_stop = False

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def sample(
        self,
        input_ids: Any,
        attention_mask: Any,
        params: Any,
        generator: Any = None,
        stop: Any = None,
    ) -> Any:
        import torch

        rows = []
        for p in range(input_ids.shape[0]):
            context = self.tokenizer.decode(input_ids[p][attention_mask[p].bool()].tolist())
            text = "Answer: 42" if "print(6 * 7)" in context else "```python\nprint(6 * 7)\n```"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            for _ in range(params.num_generations):
                rows.append([*ids[: params.max_new_tokens - 1], self.tokenizer.eos_token_id])
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.int64)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
        return out, torch.full(out.shape, float("nan"))

    def after_update(self) -> None:
        """Nothing to do."""


def test_training_on_a_served_task_runs_its_tool_calls_on_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from comlrl.algos.cli.main import main
    from comlrl.algos.rollout.agent import HFAgent

    built = HFAgent.__init__

    def scripted(self: Any, model: Any, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        built(self, model, tokenizer, *args, **kwargs)
        self.generation_backend = _ScriptedSampler(tokenizer)

    monkeypatch.setattr(HFAgent, "__init__", scripted)
    server = TaskServer(
        {"tool_math": get_task("tool_math", **TOOL_MATH_OPTIONS)},
        task_kwargs={"tool_math": TOOL_MATH_OPTIONS},
    ).start()
    args = ["train", "task.name=tool_math", f"task.remote=[{_address(server)}]", "num_steps=1"]
    args += [f"task.kwargs.{k}={v}" for k, v in TOOL_MATH_OPTIONS.items()]
    args += ["batch_size=1", "num_generations=2", "max_new_tokens=48", "progress=false"]
    args += [f"output_dir={tmp_path}"]
    try:
        assert main(args) == 0
        ran = server.tool_calls
    finally:
        server.close()
    assert ran == 4  # 1 problem x 2 generations x 2 agents, one call each
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert row["tool_calls_mean/agent_0"] == row["tool_calls_mean/agent_1"] == 1.0
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").open()]
    calls = [c for s in samples for agent in s["tool_calls"] for c in agent]
    assert calls and all(
        (c["name"], c["result"], c["error"]) == ("python", "42", None) for c in calls
    )
