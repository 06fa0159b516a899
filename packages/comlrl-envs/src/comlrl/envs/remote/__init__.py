"""Remote reward workers: score a task's joint actions on other hosts.

A worker serves one task suite's reward over HTTP::

    python -m comlrl.envs.remote serve --task coop_humaneval --host 0.0.0.0 --port 8470

and a trainer uses it through :class:`RemoteRewardTask` (or the bare
:class:`RemoteReward`), or by configuration: ``task.remote_workers=["node7:8470",
"node8:8470"]``. A batch is split across the workers; the share of a worker that dies or
hangs past the timeout is retried on the others, and every joint action gets exactly one
reward (idempotent request ids, results kept by joint-action id). ``python -m
comlrl.envs.remote health HOST:PORT ...`` prints each worker's health check.

The transport is JSON over HTTP: the worker runs on aiohttp (extra ``comlrl-envs[serve]``,
shared with the task server of ``comlrl serve``, :mod:`comlrl.envs.remote.task_server`),
the trainer's client is the standard library's; arbitrary completion text (control
characters included) travels intact. Nothing here imports torch.
"""

from __future__ import annotations

from comlrl.envs.remote._protocol import PROTOCOL_VERSION, TOKEN_ENV, WorkerAddress, parse_worker
from comlrl.envs.remote.client import HOST_LOCAL_KWARGS, RemoteReward
from comlrl.envs.remote.errors import NoLiveWorkersError, RemoteRewardError, RemoteTaskError
from comlrl.envs.remote.server import RewardServer, build_task
from comlrl.envs.remote.task import RemoteRewardTask

__all__ = [
    "HOST_LOCAL_KWARGS",
    "PROTOCOL_VERSION",
    "TOKEN_ENV",
    "NoLiveWorkersError",
    "RemoteReward",
    "RemoteRewardError",
    "RemoteRewardTask",
    "RemoteTaskError",
    "RewardServer",
    "WorkerAddress",
    "build_task",
    "parse_worker",
]
