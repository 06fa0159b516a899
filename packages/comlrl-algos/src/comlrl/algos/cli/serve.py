"""``comlrl serve``: host whole tasks for trainers on other machines.

``comlrl serve --task NAME [--task NAME ...] [--option NAME.KEY=VALUE ...] --host H
--port P`` builds each registered task (needs ``comlrl-envs`` and its ``[serve]`` extra,
aiohttp) and serves its examples, prompts, feedback and rewards
(:class:`comlrl.envs.remote.task_server.TaskServer`) until Ctrl-C. A trainer uses it with
``task.name=NAME task.remote=[H:P, ...]`` (and the same ``task.kwargs`` as the
``--option``s). ``COMLRL_REMOTE_TOKEN`` (or ``--token``) sets the shared token. Ctrl-C or
SIGTERM stops it and closes the tasks (their sandboxes with them).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

__all__ = ["add_serve_parser", "parse_options", "run_serve"]


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` sub-command to ``comlrl``'s sub-parsers."""
    parser = sub.add_parser(
        "serve",
        help="host whole tasks (data, prompts, feedback, rewards) for remote trainers",
        description="Serve registered tasks over HTTP for trainers elsewhere "
        "(task.remote=[HOST:PORT]). Needs comlrl-envs[serve].",
    )
    parser.add_argument("--task", action="append", required=True, help="a task name; repeatable")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME.KEY=VALUE",
        help="a task option (YAML value), e.g. coop_story.limit=64; repeatable",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8471, help="TCP port (default 8471)")
    parser.add_argument(
        "--token", help="shared secret (default: the COMLRL_REMOTE_TOKEN environment variable)"
    )
    parser.add_argument(
        "--max-concurrency", type=int, default=8, help="task calls running at once (default 8)"
    )
    return parser


def parse_options(tasks: list[str], options: list[str]) -> dict[str, dict[str, Any]]:
    """``{task: {key: value}}`` from ``NAME.KEY=VALUE`` strings (values read as YAML).

    Raises:
        ValueError: an option not of that form, or for a task not served.
    """
    import yaml

    out: dict[str, dict[str, Any]] = {name: {} for name in tasks}
    for option in options:
        target, sep, raw = option.partition("=")
        name, dot, key = target.partition(".")
        if not sep or not dot or not key:
            raise ValueError(
                f"--option {option!r} is not NAME.KEY=VALUE (e.g. coop_story.limit=64)"
            )
        if name not in out:
            raise ValueError(
                f"--option {option!r} names task {name!r}, which is not served {tasks}"
            )
        out[name][key] = yaml.safe_load(raw)
    return out


def run_serve(args: argparse.Namespace) -> int:
    """Build the tasks and serve them until Ctrl-C. Returns an exit code (2: a bad task,
    option or address, or a missing package)."""
    try:
        from comlrl.envs.remote.task_server import TaskServer
    except ImportError as exc:
        print(f"comlrl: comlrl serve needs comlrl-envs: {exc}", file=sys.stderr)
        return 2
    from comlrl.algos.training.config.rl import ConfigError
    from comlrl.algos.training.config.task import TaskConfig
    from comlrl.algos.training.config.task_setup import build_task

    try:
        options = parse_options(list(args.task), list(args.option))
    except ValueError as exc:
        print(f"comlrl: {exc}", file=sys.stderr)
        return 2
    tasks: dict[str, Any] = {}
    try:
        for name, kwargs in options.items():
            tasks[name] = build_task(TaskConfig(name=name, kwargs=kwargs))
        token = args.token or os.environ.get("COMLRL_REMOTE_TOKEN") or None
        server = TaskServer(
            tasks,
            host=args.host,
            port=args.port,
            token=token,
            task_kwargs=options,
            max_concurrency=args.max_concurrency,
        )
    except (ConfigError, ValueError, OSError, ImportError) as exc:
        for task in tasks.values():
            task.close()
        hint = " (pip install 'comlrl-envs[serve]')" if isinstance(exc, ImportError) else ""
        print(f"comlrl: cannot serve: {exc}{hint}", file=sys.stderr)
        return 2
    host, port = server.address
    print(
        f"serving {', '.join(tasks)} at {host}:{port} (token {'on' if token else 'off'}); "
        f"train with task.name=NAME 'task.remote=[{host}:{port}]'; Ctrl-C stops",
        flush=True,
    )

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # `kill` stops it as Ctrl-C does: tasks closed
    server.serve_forever()
    return 0
