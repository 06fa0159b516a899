"""``task.remote_workers``: the config setting that sends the task's reward to workers.

A cross-package test (comlrl-algos' config and preflight, comlrl-envs' reward workers): it
lives here, in the integration session that installs both, so CI runs it."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import comlrl.envs.remote as remote
import pytest
from comlrl.algos.training.config.rl import ConfigError, load_config
from comlrl.algos.training.config.task_setup import prepare_task


@pytest.fixture
def story_worker() -> Iterator[tuple[str, object]]:
    from comlrl.core import get_task

    server = remote.RewardServer(get_task("coop_story", limit=3), task_kwargs={"limit": 3})
    server.start()
    try:
        yield "{}:{}".format(*server.address), server
    finally:
        server.close()


@pytest.mark.parametrize(
    "workers, needle",
    [
        (["node7"], "'node7' is not 'host:port'"),
        (["node7:0"], "'node7:0' is not 'host:port'"),
        (["a:1", "a:1"], "lists a worker twice"),
    ],
)
def test_bad_worker_addresses_are_config_errors(workers: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(None, ["task.remote_workers=" + json.dumps(workers)])


def test_remote_workers_score_the_configured_task(story_worker: tuple[str, object]) -> None:
    from comlrl.core import get_task

    address, server = story_worker
    config = load_config(
        None, ["task.name=coop_story", "task.kwargs.limit=3", f'task.remote_workers=["{address}"]']
    )
    task, examples = prepare_task(config)
    try:
        assert isinstance(task, remote.RemoteRewardTask)
        assert task.prompts(examples[0]) == get_task("coop_story").prompts(examples[0])
        first = "Tom found a small red ball in the park and he was very happy today."
        second = "Then Tom shared the ball with his sister and they played until the sun set."
        completions = [[first, first[:20], ""], [second, second, "no"]]
        batch = task.reward(completions, examples[:3])
        expected = get_task("coop_story", limit=3).reward(completions, examples[:3])
        # same reward code on the same text; floats cross JSON exactly
        assert batch.rewards == expected.rewards
        assert server.health()["items_scored"] == 3  # type: ignore[attr-defined]
    finally:
        task.close()


def test_unreachable_workers_fail_before_training_naming_them() -> None:
    with socket.socket() as s:  # a port that nobody listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        config = load_config(None, [f'task.remote_workers=["{address}"]', "task.kwargs.limit=2"])
        with pytest.raises(
            ConfigError,
            match=f"(?s)task.remote_workers: all 1 reward workers.*{address}: Connection",
        ):
            prepare_task(config)


def test_a_worker_serving_other_task_options_is_a_config_error(
    story_worker: tuple[str, object],
) -> None:
    address, _ = story_worker
    config = load_config(
        None,
        ["task.kwargs.limit=3", "task.kwargs.min_words=5", f'task.remote_workers=["{address}"]'],
    )
    with pytest.raises(ConfigError, match=r"min_words='<default>' \(expected 5\)"):
        prepare_task(config)
