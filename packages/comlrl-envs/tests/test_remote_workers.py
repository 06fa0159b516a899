"""Remote reward workers: same rewards as local scoring, exactly one per joint action.

Workers are real processes (``python -m comlrl.envs.remote serve --port 0``) on
localhost; the OS picks their ports and each prints its address once it listens. Tests
that need a worker inside a request use the test-only ``GatedGsm8kTask``
(tests/_remote_tasks.py): it marks each request it enters with a file and waits for a
gate file, so the tests wait on conditions (files, process exit) with deadlines and never
on a guessed sleep.

Rewards are compared with ``==``: the reward is computed by the same code on the same
text in both places, and JSON carries Python floats exactly (shortest repr round-trip).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from comlrl.core import RewardBatch, Task
from comlrl.envs.math import Gsm8kTask
from comlrl.envs.remote import (
    NoLiveWorkersError,
    RemoteReward,
    RemoteRewardError,
    RemoteRewardTask,
    RemoteTaskError,
    RewardServer,
    parse_worker,
)
from hypothesis import given, settings
from hypothesis import strategies as st

TESTS_DIR = Path(__file__).resolve().parent
GATED = "_remote_tasks:GatedGsm8kTask"
START_DEADLINE_S = 60.0  # a worker imports comlrl.envs; generous for a loaded CI machine


# ----------------------------------------------------------------------------- helpers
def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail naming ``what`` after the deadline."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(0.01)


class Workers:
    """Starts worker processes and kills every one of them at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self, task: str, kwargs: Mapping[str, Any] | None = None
    ) -> tuple[subprocess.Popen[str], str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(TESTS_DIR), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        )
        env.pop("COMLRL_REMOTE_TOKEN", None)
        stderr = open(self.log_dir / f"worker-{len(self.procs)}.stderr", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "comlrl.envs.remote",
                "serve",
                "--task",
                task,
                "--task-kwargs",
                json.dumps(dict(kwargs or {})),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        stderr.close()
        self.procs.append(proc)
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=START_DEADLINE_S)
        sel.close()
        line = proc.stdout.readline() if ready else ""
        if "serving" not in line:
            proc.kill()
            proc.wait()
            log = (self.log_dir / f"worker-{len(self.procs) - 1}.stderr").read_text()
            pytest.fail(
                f"worker for {task} did not start within {START_DEADLINE_S} s: {line!r}\n{log}"
            )
        address = line.split(" on ")[1].split()[0]
        return proc, address

    def kill(self, proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    yield w
    w.close()


def gsm8k_batch(groups: int = 6, g: int = 4) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """``groups`` GSM8K-style problems, ``g`` joint actions each (examples shared per group)."""
    replies = [
        ("So {a} * {b} = {c}.\n#### {c}", "{c}"),
        ("I think #### {w}", "#### {c}"),
        ("no idea", "The answer is {w}"),
        ("The answer is \\boxed{{{c}}}", "\x00\x1b odd bytes ####{c} \u00e9\u4e2d"),
    ]
    completions: list[list[str]] = [[], []]
    examples: list[dict[str, Any]] = []
    for n in range(groups):
        a, b = n + 2, n + 5
        c = a * b
        ex = {"question": f"What is {a} times {b}?", "answer": f"{a}*{b}={c}\n#### {c}"}
        for j in range(g):
            r1, r2 = replies[(n + j) % len(replies)]
            completions[0].append(r1.format(a=a, b=b, c=c, w=c + 1))
            completions[1].append(r2.format(a=a, b=b, c=c, w=c - 1))
            examples.append(ex)
    return completions, examples


def started(gate_dir: Path, pid: int | None = None) -> list[Path]:
    prefix = "started-" if pid is None else f"started-{pid}-"
    return sorted(gate_dir.glob(prefix + "*"))


def without_timing(infos: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Infos without the sandbox's wall-clock ``duration_s`` (differs run to run)."""
    return [{k: v for k, v in info.items() if k != "duration_s"} for info in infos]


# ----------------------------------------------------------------------------- addresses
def test_worker_addresses_parse_and_bad_ones_are_named() -> None:
    assert str(parse_worker("node7:8470")) == "node7:8470"
    assert str(parse_worker("http://10.0.0.2:80/")) == "10.0.0.2:80"
    assert str(parse_worker("[::1]:9000")) == "[::1]:9000"
    for bad in ("node7", "node7:", ":80", "node7:99999", "a b:1"):
        with pytest.raises(ValueError, match=repr(bad).replace("[", r"\[")):
            parse_worker(bad)
    with pytest.raises(ValueError, match="repeat"):
        RemoteReward(["h:1", "h:1"], task_name="gsm8k", check=False)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    live=st.integers(1, 4),
    chunk_size=st.one_of(st.none(), st.integers(1, 8)),
)
def test_chunks_cover_every_joint_action_once_and_keep_prompts_whole(
    sizes: list[int], live: int, chunk_size: int | None
) -> None:
    client = RemoteReward(["h:1"], task_name="gsm8k", chunk_size=chunk_size, check=False)
    examples: list[dict[str, Any]] = []
    for n, size in enumerate(sizes):
        ex = {"question": str(n)}
        examples.extend([ex] * size)
    k = len(examples)
    ids = [f"c:{i}" for i in range(k)]
    chunks = client._make_chunks("c", ids, [["x"] * k, ["y"] * k], examples, live)
    flat = [i for c in chunks for i in c.ids]
    assert flat == ids  # every joint action once, in order
    if chunk_size is None:  # automatic chunks never split one prompt's joint actions
        group_of = [n for n, size in enumerate(sizes) for _ in range(size)]
        for c in chunks:
            first, last = int(c.ids[0].split(":")[1]), int(c.ids[-1].split(":")[1])
            assert first == 0 or group_of[first] != group_of[first - 1]
            assert last == k - 1 or group_of[last] != group_of[last + 1]
    else:
        assert all(len(c.ids) <= max(chunk_size, 1) for c in chunks)


# ----------------------------------------------------------------------------- in-process
class CountingTask(Gsm8kTask):
    """GSM8K that counts how many joint actions its reward scored."""

    def __init__(self) -> None:
        super().__init__()
        self.scored = 0

    def reward(
        self, completions: Sequence[Sequence[str]], examples: Sequence[Mapping[str, Any]]
    ) -> RewardBatch:
        self.scored += len(examples)
        return super().reward(completions, examples)


def test_a_repeated_request_id_is_scored_once() -> None:
    task = CountingTask()
    server = RewardServer(task).start()
    try:
        host, port = server.address
        client = RemoteReward([f"{host}:{port}"], task_name="gsm8k", num_agents=2)
        completions, examples = gsm8k_batch(groups=2)
        chunks = client._make_chunks(
            "same", [f"same:{i}" for i in range(8)], completions, examples, 1
        )
        answers = [server.score(chunks[0].body) for _ in range(3)]
        assert [a[0] for a in answers] == [200, 200, 200]
        assert answers[0][1] == answers[1][1] == answers[2][1]
        assert task.scored == len(chunks[0].ids)
        assert server.health()["duplicates_served"] == 2
    finally:
        server.close()


def test_token_is_required_when_the_worker_sets_one(monkeypatch: pytest.MonkeyPatch) -> None:
    server = RewardServer(Gsm8kTask(), token="s3cret").start()
    try:
        address = "{}:{}".format(*server.address)
        monkeypatch.delenv("COMLRL_REMOTE_TOKEN", raising=False)
        with pytest.raises(RemoteRewardError, match="token"):
            RemoteReward([address], task_name="gsm8k")
        monkeypatch.setenv("COMLRL_REMOTE_TOKEN", "s3cret")
        completions, examples = gsm8k_batch(groups=1)
        got = RemoteReward([address], task_name="gsm8k")(completions, examples)
        assert got.rewards == Gsm8kTask().reward(completions, examples).rewards
    finally:
        server.close()


def test_a_worker_serving_another_task_or_options_is_refused() -> None:
    server = RewardServer(Gsm8kTask(), task_kwargs={"limit": 3, "bonus": 0.1}).start()
    try:
        address = "{}:{}".format(*server.address)
        with pytest.raises(RemoteRewardError, match=r"task 'gsm8k' \(expected 'mbpp'\)"):
            RemoteReward([address], task_name="mbpp")
        with pytest.raises(RemoteRewardError, match=r"num_agents=2 \(expected 3\)"):
            RemoteReward([address], task_name="gsm8k", num_agents=3)
        with pytest.raises(RemoteRewardError, match=r"bonus=0.1 \(expected 0.2\)"):
            RemoteReward([address], task_name="gsm8k", expect_kwargs={"bonus": 0.2})
        # `limit` only selects rows on each host: it may differ
        RemoteReward([address], task_name="gsm8k", expect_kwargs={"bonus": 0.1, "limit": 9})
    finally:
        server.close()


def test_a_batch_the_task_rejects_fails_once_without_retries() -> None:
    server = RewardServer(Gsm8kTask()).start()
    try:
        client = RemoteReward(["{}:{}".format(*server.address)], task_name="gsm8k")
        # an example without `answer` makes GSM8K's reward raise KeyError on any worker
        with pytest.raises(RemoteTaskError, match="rejected the batch: KeyError"):
            client([["#### 1"], ["#### 1"]], [{"question": "?"}])
    finally:
        server.close()


# ----------------------------------------------------------------------------- processes
def test_remote_scoring_equals_local_scoring_on_the_sandboxed_humaneval_reward(
    workers: Workers, humaneval_file: Path, rows_by_id: dict[str, Any]
) -> None:
    kwargs = {"path": str(humaneval_file), "timeout_s": 10.0, "max_workers": 1}
    addresses = [workers.start("coop_humaneval", kwargs)[1] for _ in range(2)]
    local = get_local_humaneval(kwargs)
    rows = [rows_by_id[f"HumanEval/{i}"] for i in (0, 2, 4)]
    helpers = ["x):\n    return x\n", "", "numbers):\n    return sum(numbers) / len(numbers)\n"]
    completions: list[list[str]] = [[], []]
    examples: list[dict[str, Any]] = []
    for row in rows:
        for j, main in enumerate(
            [row["canonical_solution"], "    return None\n", "    syntax error(\n"]
        ):
            completions[0].append(helpers[j])
            completions[1].append(main)
            examples.append(row)
    task = RemoteRewardTask(local, addresses, task_kwargs=kwargs, timeout_s=60.0)
    try:
        remote = task.reward(completions, examples)
        expected = local.reward(completions, examples)
    finally:
        local.close()
    assert remote.rewards == expected.rewards
    assert len(set(remote.rewards)) > 1, "the batch must hold different rewards to compare"
    assert without_timing(remote.infos) == without_timing(expected.infos)
    assert sum(task.remote.last_stats["items_by_worker"].values()) == len(examples)


def get_local_humaneval(kwargs: Mapping[str, Any]) -> Task:
    from comlrl.core import get_task

    return get_task("coop_humaneval", **kwargs)


def test_a_worker_killed_mid_batch_loses_and_duplicates_no_reward(
    workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    started_workers = [workers.start(GATED, {"gate_dir": str(gate)}) for _ in range(3)]
    procs = [p for p, _ in started_workers]
    addresses = [a for _, a in started_workers]
    client = RemoteReward(
        addresses, task_name="gsm8k", num_agents=2, timeout_s=60.0, backoff_s=0.05
    )
    completions, examples = gsm8k_batch(groups=6, g=4)  # 24 joint actions, 6 chunks of 4
    out: dict[str, Any] = {}

    def score() -> None:
        try:
            out["batch"] = client(completions, examples)
        except BaseException as exc:  # reported by the assertions below
            out["error"] = exc

    caller = threading.Thread(target=score)
    caller.start()
    # every worker holds its first chunk at the gate
    wait_for(lambda: all(started(gate, p.pid) for p in procs), "each worker to enter a request")
    victim = procs[0]
    workers.kill(victim)  # SIGKILL while it holds a chunk
    (gate / "open").touch()
    caller.join(timeout=60)
    assert not caller.is_alive(), "the remote call did not finish within 60 s"
    assert "error" not in out, out.get("error")
    batch = out["batch"]
    assert batch.rewards == Gsm8kTask().reward(completions, examples).rewards
    assert batch.infos == Gsm8kTask().reward(completions, examples).infos
    stats = client.last_stats
    assert stats["items_by_worker"][addresses[0]] == 0
    assert sum(stats["items_by_worker"].values()) == 24
    assert stats["retried_chunks"] == 1 and stats["duplicates_dropped"] == 0
    assert any(addresses[0] in e for e in stats["errors"])
    # the live workers scored each joint action exactly once between them
    health = client.health()
    assert isinstance(health[addresses[0]], str)  # the dead one does not answer
    scored = [h["items_scored"] for a, h in health.items() if a != addresses[0]]  # type: ignore[index]
    assert sum(scored) == 24


def test_a_worker_that_hangs_past_the_timeout_is_retried_elsewhere(
    workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "open").touch()
    _, fast = workers.start(GATED, {"gate_dir": str(gate)})
    hung_proc, hung = workers.start(GATED, {"gate_dir": str(gate), "hang": True})
    client = RemoteReward([fast, hung], task_name="gsm8k", timeout_s=1.0, backoff_s=0.05)
    completions, examples = gsm8k_batch(groups=4, g=4)
    try:
        batch = client(completions, examples)
    finally:
        (gate / "release-hang").touch()
    assert batch.rewards == Gsm8kTask().reward(completions, examples).rewards
    stats = client.last_stats
    assert stats["items_by_worker"] == {fast: 16, hung: 0}
    assert stats["retried_chunks"] >= 1 and stats["duplicates_dropped"] == 0
    assert any(hung in e and "no answer within 1 s" in e for e in stats["errors"])
    assert started(gate, hung_proc.pid), "the hung worker must have held a request"


def test_all_workers_gone_raises_an_error_naming_each(workers: Workers, tmp_path: Path) -> None:
    started_workers = [workers.start("gsm8k") for _ in range(2)]
    addresses = [a for _, a in started_workers]
    client = RemoteReward(addresses, task_name="gsm8k", backoff_s=0.01, max_backoff_s=0.05)
    completions, examples = gsm8k_batch(groups=2)
    assert (
        client(completions, examples).rewards == Gsm8kTask().reward(completions, examples).rewards
    )
    for proc, _ in started_workers:
        workers.kill(proc)
    with pytest.raises(NoLiveWorkersError) as info:
        client(completions, examples)
    message = str(info.value)
    assert all(a in message for a in addresses), message
    assert "python -m comlrl.envs.remote serve --task gsm8k" in message
    assert set(info.value.errors) == set(addresses)
    # and a client built against dead workers fails at once, naming them
    with pytest.raises(NoLiveWorkersError, match=addresses[1].replace(".", r"\.")):
        RemoteReward(addresses, task_name="gsm8k")
