"""``python -m comlrl.envs.remote serve|health``: run a reward worker, or check workers.

``serve`` prints one line ``comlrl-remote: serving TASK on HOST:PORT (pid N)`` once it
accepts requests (with ``--port 0`` the OS picks the port and the line tells which), and
stops cleanly on SIGTERM or SIGINT. ``health`` prints each worker's health check as JSON
and exits 1 when any worker does not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from comlrl.envs.remote._protocol import TOKEN_ENV


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m comlrl.envs.remote", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve one task's reward")
    serve.add_argument("--task", required=True, help="registered task name, or module:attr")
    serve.add_argument(
        "--task-kwargs",
        default="{}",
        help='task options as a JSON object, e.g. \'{"path": "..."}\'',
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8470, help="TCP port; 0 = any free port")
    serve.add_argument(
        "--token-env",
        default=TOKEN_ENV,
        help=f"environment variable with the shared token (default {TOKEN_ENV}; unset = no token)",
    )
    health = sub.add_parser("health", help="health-check workers")
    health.add_argument("workers", nargs="+", metavar="HOST:PORT")
    health.add_argument("--timeout", type=float, default=10.0, help="seconds per worker")
    return parser


def _serve(args: argparse.Namespace) -> int:
    from comlrl.envs.remote.server import RewardServer, build_task

    try:
        kwargs = json.loads(args.task_kwargs)
    except ValueError as exc:
        print(
            f"comlrl-remote: --task-kwargs is not JSON ({exc}): {args.task_kwargs!r}",
            file=sys.stderr,
        )
        return 2
    if not isinstance(kwargs, dict):
        print(
            f"comlrl-remote: --task-kwargs must be a JSON object, got {args.task_kwargs!r}",
            file=sys.stderr,
        )
        return 2
    try:
        task = build_task(args.task, kwargs)
    except Exception as exc:  # reported, not a traceback
        print(
            f"comlrl-remote: cannot build task {args.task!r} with {kwargs!r}: {exc}",
            file=sys.stderr,
        )
        return 2
    try:
        server = RewardServer(
            task,
            host=args.host,
            port=args.port,
            token=os.environ.get(args.token_env),
            task_kwargs=kwargs,
        )
    except ImportError as exc:  # aiohttp missing: the message names the extra
        task.close()
        print(f"comlrl-remote: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        task.close()
        print(f"comlrl-remote: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    server.start()
    host, port = server.address
    print(f"comlrl-remote: serving {task.name} on {host}:{port} (pid {os.getpid()})", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.close()
    return 0


def _health(args: argparse.Namespace) -> int:
    from comlrl.envs.remote.client import RemoteReward

    probe = RemoteReward(
        args.workers,
        task_name="",
        timeout_s=args.timeout,
        connect_timeout_s=args.timeout,
        check=False,
    )
    answers = probe.health()
    print(json.dumps(answers, indent=2))
    return 0 if all(isinstance(a, dict) for a in answers.values()) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m comlrl.envs.remote``; returns the exit code."""
    args = _parser().parse_args(argv)
    return _serve(args) if args.command == "serve" else _health(args)


if __name__ == "__main__":
    raise SystemExit(main())
