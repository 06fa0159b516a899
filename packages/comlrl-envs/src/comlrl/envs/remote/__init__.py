"""Tasks served to trainers on other machines: CoMLRL's one remote protocol.

A task server hosts whole tasks (example references, prompts, multi-turn feedback, tool
calls and rewards; the data, tests and sandbox stay on its machine) over HTTP on aiohttp
(extra ``comlrl-envs[serve]``; no torch)::

    comlrl-serve --task coop_humaneval --option coop_humaneval.limit=64 --port 8471

(``python -m comlrl.envs.remote`` and ``comlrl serve`` are the same command,
:mod:`comlrl.envs.remote.cli`), and a trainer uses it with ``task.remote=["node7:8471",
...]`` in its config, or :class:`RemoteTask` in Python (standard-library HTTP, no
aiohttp). Several servers share the work: a batch's scoring is spread over them, and a
server that dies or hangs is skipped without losing or repeating a reward.

- :mod:`comlrl.envs.remote.wire`: the protocol's version, messages and data forms;
- :mod:`comlrl.envs.remote.task_server`: :class:`TaskServer` (token, limits, timeouts,
  request ids);
- :mod:`comlrl.envs.remote.served_task`: the operations on one task, on its own data;
- :mod:`comlrl.envs.remote.client`: :class:`RemoteTask`, the trainer's side.
"""

from __future__ import annotations

from comlrl.envs.remote.client import RemoteTask, RemoteTaskUnavailable
from comlrl.envs.remote.task_server import TaskServer
from comlrl.envs.remote.wire import TASK_PROTOCOL, TOKEN_ENV

__all__ = ["TASK_PROTOCOL", "TOKEN_ENV", "RemoteTask", "RemoteTaskUnavailable", "TaskServer"]
