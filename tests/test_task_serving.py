"""Training on served tasks (``comlrl serve``, comlrl-envs' task server): a short ``comlrl
train`` against servers on loopback gives the same metrics as on the local task (a
single-turn task, a multi-turn one whose feedback goes through sealed infos, and one whose
tool calls run on the server), and ``comlrl serve`` itself: the start-up line names each
task's ``comlrl train`` arguments, and SIGTERM after serving a run stops it without a
traceback. The protocol's own tests (refusals, failover, idempotency) are comlrl-envs'
(``test_remote_serving.py``, ``test_reward_hacks_server.py``)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp", reason="comlrl serve needs comlrl-envs[serve] (aiohttp)")

from comlrl.core import get_task  # noqa: E402
from comlrl.envs.remote.task_server import TaskServer  # noqa: E402


def _address(server: TaskServer) -> str:
    host, port = server.address
    return f"{host}:{port}"


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


def _reward_means(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    return [{k: v for k, v in row.items() if "reward" in k and "time" not in k} for row in rows]


def _turns(run: Path) -> list[tuple[int, list[Any], list[str] | None]]:
    """Each sample's turn, prompts and feedback (the samples' other fields hold timings)."""
    rows = [json.loads(line) for line in (run / "samples.jsonl").open()]
    return [(r["turn"], r["prompts"], r["feedback"]) for r in rows]


@pytest.mark.slow
def test_training_a_multi_turn_served_task_matches_the_local_task(tmp_path: Path) -> None:
    from comlrl.algos.cli.main import main

    options = {"num_agents": 2, "rounds": 1, "num_train": 4, "num_eval": 2}
    server = TaskServer(
        {"debate_math": get_task("debate_math", **options)},
        task_kwargs={"debate_math": options},
    ).start()
    common = ["train", "task.name=debate_math", "num_turns=2", "num_steps=2", "batch_size=2"]
    common += [f"task.kwargs.{k}={v}" for k, v in options.items()]
    common += ["num_generations=2", "max_new_tokens=8", "progress=false"]
    try:
        remote = [*common, f"task.remote=[{_address(server)}]", f"output_dir={tmp_path / 'r'}"]
        assert main(remote) == 0
        scored = server.calls
    finally:
        server.close()
    assert main([*common, f"output_dir={tmp_path / 'l'}"]) == 0
    served, local = _reward_means(tmp_path / "r"), _reward_means(tmp_path / "l")
    assert served == local and len(served) == 2
    # the same feedback, and the same second-turn prompts built on it (sealed infos went
    # back to the server that scored them)
    turns = _turns(tmp_path / "r")
    assert turns == _turns(tmp_path / "l")
    assert any(t == 1 for t, _, _ in turns) and any(f for t, _, f in turns if t == 0)
    assert scored > 0


def _read_lines(proc: subprocess.Popen[str], n: int, deadline_s: float = 60.0) -> list[str]:
    """Up to ``n`` lines of ``proc``'s stdout, waiting at most ``deadline_s`` for the
    first and 10 s for each after it (a thread reads them: lines buffered after the first
    leave nothing for a select on the pipe)."""
    import queue
    import threading

    assert proc.stdout is not None
    stdout = proc.stdout
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(stdout.readline()) for _ in range(n)], daemon=True
    ).start()
    out = []
    for k in range(n):
        try:
            out.append(lines.get(timeout=deadline_s if k == 0 else 10.0))
        except queue.Empty:
            break
    return out


def _comlrl() -> list[str]:
    exe = shutil.which("comlrl", path=str(Path(sys.executable).parent)) or shutil.which("comlrl")
    return [exe] if exe else [sys.executable, "-m", "comlrl.algos.cli.main"]


def test_comlrl_serve_names_the_task_and_stops_cleanly_on_sigterm_after_serving() -> None:
    import urllib.request

    args = ["serve", "--task", "coop_story", "--option", "coop_story.limit=4", "--port", "0"]
    proc = subprocess.Popen(
        [*_comlrl(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        first, second = [*_read_lines(proc, 2), "", ""][:2]
        found = re.search(r"serving coop_story at (\S+):(\d+) ", first)
        assert found, first
        address = f"{found[1]}:{found[2]}"
        with urllib.request.urlopen(f"http://{address}/v1/health", timeout=30) as resp:
            protocol = json.loads(resp.read())["protocol"]
        for n in range(3):  # served calls, as a run makes them
            body = {"protocol": protocol, "request_id": f"r{n}", "task": "coop_story", "op": "load"}
            req = urllib.request.Request(
                f"http://{address}/v1/task", data=json.dumps(body).encode(), method="POST"
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert json.loads(resp.read())["request_id"] == f"r{n}"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        stderr = proc.stderr.read() if proc.stderr else ""
    assert code == 0, stderr
    assert "Traceback" not in stderr and "Invalid file descriptor" not in stderr, stderr
    # how to train on it, with the task's own name and options (not task.name=NAME)
    train = f"task.name=coop_story task.kwargs.limit=4 'task.remote=[{address}]'"
    assert second.strip() == f"train with: comlrl train {train}", first + second


# ------------------------------------------------------------------ tools of a served task
TOOL_MATH_OPTIONS = {"num_train": 8, "num_eval": 4}


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
