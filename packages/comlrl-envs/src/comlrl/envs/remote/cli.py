"""The task server's command line: ``comlrl-serve`` (a console script of comlrl-envs),
``python -m comlrl.envs.remote`` and ``comlrl serve`` (comlrl-algos) are this one.

``comlrl-serve --task NAME [--task NAME ...] [--option NAME.KEY=VALUE ...] [--host H]
[--port P]`` builds each registered task and serves it
(:class:`~comlrl.envs.remote.task_server.TaskServer`) until Ctrl-C or SIGTERM, which stop
it cleanly and close the tasks (their sandboxes with them). The token comes from the
``COMLRL_REMOTE_TOKEN`` environment variable (never a flag: command lines are visible to
every user of the machine); any address other than loopback needs one. Once it accepts
requests it prints ``serving NAME[, NAME...] at HOST:PORT (token on|off, pid N); ...``
and, per task, the ``comlrl train`` arguments that train on it. Needs comlrl-envs with
its ``[serve]`` extra (aiohttp); neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl.envs.remote.task_server import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PORT,
    DEFAULT_READ_TIMEOUT_S,
)
from comlrl.envs.remote.wire import TOKEN_ENV

__all__ = ["add_arguments", "main", "parse_options", "serve", "train_arguments"]

DESCRIPTION = (
    "Serve registered tasks over HTTP to trainers elsewhere (task.remote=[HOST:PORT]): "
    "example references, prompts, feedback, tool calls and rewards; the data, tests and "
    f"sandbox stay here. The token comes from {TOKEN_ENV}; addresses other than loopback "
    "need one. Needs comlrl-envs[serve]."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The task server's options, on ``parser``."""
    parser.add_argument("--task", action="append", required=True, help="a task name; repeatable")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME.KEY=VALUE",
        help="a task option (a JSON value, else a string), e.g. coop_story.limit=64; repeatable",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"TCP port, 0: any (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--max-concurrency", type=int, default=8, help="task calls running at once (default 8)"
    )
    parser.add_argument(
        "--max-body-mib",
        type=float,
        default=DEFAULT_MAX_BODY_BYTES / 2**20,
        help=f"largest request body in MiB (default {DEFAULT_MAX_BODY_BYTES / 2**20:g})",
    )
    parser.add_argument(
        "--read-timeout-s",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        help="seconds a client has to send a request's head, then its body "
        f"(default {DEFAULT_READ_TIMEOUT_S:g})",
    )


def parse_options(tasks: Sequence[str], options: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{task: {key: value}}`` from ``NAME.KEY=VALUE`` strings (a value is read as JSON
    when it parses, else kept as the string).

    Raises:
        ValueError: an option not of that form, or for a task not served.
    """
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
                f"--option {option!r} names task {name!r}, which is not served {list(tasks)}"
            )
        try:
            out[name][key] = json.loads(raw)
        except ValueError:
            out[name][key] = raw
    return out


def train_arguments(name: str, kwargs: Mapping[str, Any], address: str) -> str:
    """The ``comlrl train`` arguments that train on task ``name`` served at ``address``."""
    parts = [f"task.name={name}"]
    for key, value in kwargs.items():
        shown = value if isinstance(value, str) else json.dumps(value)
        parts.append(f"task.kwargs.{key}={shown}")
    parts.append(f"task.remote=[{address}]")
    return " ".join(shlex.quote(p) for p in parts)


def serve(args: argparse.Namespace, prog: str = "comlrl-serve") -> int:
    """Build the tasks of ``args`` and serve them until Ctrl-C or SIGTERM.

    Returns:
        the exit code: 0 after a clean stop, 2 for a bad task, option or address, a
        missing token or a missing package (the message on stderr says which).
    """
    from comlrl.core import get_task
    from comlrl.envs.remote.task_server import TaskServer

    def fail(message: str) -> int:
        print(f"{prog}: {message}", file=sys.stderr)
        return 2

    try:
        options = parse_options(list(args.task), list(args.option))
    except ValueError as exc:
        return fail(str(exc))
    tasks: dict[str, Any] = {}
    token = os.environ.get(TOKEN_ENV) or None
    try:
        for name, kwargs in options.items():
            try:
                tasks[name] = get_task(name, **kwargs)
            except (TypeError, ValueError, OSError) as exc:
                raise ValueError(f"task {name!r} rejected options {kwargs!r}: {exc}") from None
        server = TaskServer(
            tasks,
            host=args.host,
            port=args.port,
            token=token,
            task_kwargs=options,
            max_concurrency=args.max_concurrency,
            max_body_bytes=max(1, int(args.max_body_mib * 2**20)),
            read_timeout_s=args.read_timeout_s,
        )
    except (LookupError, ValueError, OSError, ImportError) as exc:  # LookupError: no such task
        for task in tasks.values():
            task.close()
        return fail(f"cannot serve: {exc}")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        host, port = server.address
        print(
            f"serving {', '.join(tasks)} at {host}:{port} (token {'on' if token else 'off'}, "
            f"pid {os.getpid()}); Ctrl-C or SIGTERM stops",
            flush=True,
        )
        for name in tasks:
            address = f"{host}:{port}"
            print(
                f"  train with: comlrl train {train_arguments(name, options[name], address)}",
                flush=True,
            )
        while server.running() and not stop.wait(0.5):
            pass
    finally:
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``comlrl-serve`` and ``python -m comlrl.envs.remote``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["serve"], ["health"]):
        print(
            "comlrl-serve: the reward workers' `serve`/`health` commands are gone: the task "
            "server scores too. Run `comlrl-serve --task NAME [--option NAME.KEY=VALUE]` "
            "and train with task.remote=[HOST:PORT] (see the health check with "
            "`curl http://HOST:PORT/v1/health`)",
            file=sys.stderr,
        )
        return 2
    parser = argparse.ArgumentParser(prog="comlrl-serve", description=DESCRIPTION)
    add_arguments(parser)
    return serve(parser.parse_args(argv))
