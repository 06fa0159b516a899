"""``task.remote``: the config setting that trains on tasks served by task servers.

A cross-package test (comlrl-algos' config and preflight, comlrl-envs' task server and its
client): it lives here, in the integration session that installs both, so CI runs it."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from comlrl.algos.training.config.rl import ConfigError, load_config
from comlrl.algos.training.config.task_setup import prepare_task

pytest.importorskip("aiohttp", reason="the task server needs comlrl-envs[serve] (aiohttp)")


@pytest.fixture
def story_server() -> Iterator[str]:
    from comlrl.core import get_task
    from comlrl.envs.remote import TaskServer

    server = TaskServer(
        {"coop_story": get_task("coop_story", limit=3)}, task_kwargs={"coop_story": {"limit": 3}}
    ).start()
    try:
        yield "{}:{}".format(*server.address)
    finally:
        server.close()


@pytest.mark.parametrize(
    "servers, needle",
    [
        (["node7"], "'node7' is not 'host:port'"),
        (["node7:0"], "'node7:0' is not 'host:port'"),
        (["a:1", "a:1"], "lists a server twice"),
    ],
)
def test_bad_server_addresses_are_config_errors(servers: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(None, ["task.remote=" + json.dumps(servers)])


def test_the_reward_workers_key_is_gone_naming_the_new_one() -> None:
    with pytest.raises(ConfigError, match=r"task.remote_workers is gone.*task.remote=\[HOST:PORT"):
        load_config(None, ['task.remote_workers=["node7:8470"]'])


def test_a_served_task_scores_like_the_configured_task(story_server: str) -> None:
    from comlrl.core import get_task
    from comlrl.envs.remote import RemoteTask

    config = load_config(
        None, ["task.name=coop_story", "task.kwargs.limit=3", f'task.remote=["{story_server}"]']
    )
    task, examples = prepare_task(config)
    local = get_task("coop_story", limit=3)
    try:
        assert isinstance(task, RemoteTask)
        rows = list(local.load())
        assert [ex["id"] for ex in examples] == [f"coop_story/{i}" for i in range(3)]
        assert task.prompts(examples[0]) == local.prompts(rows[0])
        first = "Tom found a small red ball in the park and he was very happy today."
        second = "Then Tom shared the ball with his sister and they played until the sun set."
        completions = [[first, first[:20], ""], [second, second, "no"]]
        batch = task.reward(completions, examples[:3])
        # same reward code on the same text; floats cross JSON exactly
        assert batch.rewards == local.reward(completions, rows).rewards
    finally:
        task.close()
        local.close()


def test_unreachable_servers_fail_before_training_naming_them() -> None:
    with socket.socket() as s:  # a port that nobody listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        config = load_config(None, [f'task.remote=["{address}"]', "task.kwargs.limit=2"])
        with pytest.raises(
            ConfigError, match=f"(?s)task.remote: no task server answered.*{address}"
        ):
            prepare_task(config)


def test_a_server_serving_other_task_options_is_a_config_error(story_server: str) -> None:
    config = load_config(
        None,
        ["task.kwargs.limit=3", "task.kwargs.min_words=5", f'task.remote=["{story_server}"]'],
    )
    with pytest.raises(ConfigError, match=r"serves 'coop_story' with options \{'limit': 3\}"):
        prepare_task(config)
