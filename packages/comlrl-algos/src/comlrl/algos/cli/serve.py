"""``comlrl serve``: the task server's command line, reached from ``comlrl``.

The same command as ``comlrl-serve`` and ``python -m comlrl.envs.remote``
(:mod:`comlrl.envs.remote.cli`, in comlrl-envs with its ``[serve]`` extra): its options
are added to this sub-command and its ``serve`` runs them. A machine that only serves
tasks installs comlrl-envs alone and runs ``comlrl-serve``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_serve_parser", "run_serve"]

HELP = "host whole tasks (examples, prompts, feedback, tools, rewards) for remote trainers"


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` sub-command (comlrl-envs' task server options) to ``comlrl``'s
    sub-parsers; without comlrl-envs it takes any arguments and :func:`run_serve` says
    what to install."""
    try:
        from comlrl.envs.remote.cli import DESCRIPTION, add_arguments
    except ImportError:
        parser = sub.add_parser("serve", help=HELP, add_help=False)
        parser.add_argument("rest", nargs=argparse.REMAINDER)
        return parser  # type: ignore[no-any-return]
    parser = sub.add_parser("serve", help=HELP, description=DESCRIPTION)
    add_arguments(parser)
    return parser  # type: ignore[no-any-return]


def run_serve(args: argparse.Namespace) -> int:
    """Serve the tasks of ``args`` until Ctrl-C or SIGTERM (comlrl-envs'
    :func:`~comlrl.envs.remote.cli.serve`); 2 when comlrl-envs is missing."""
    try:
        from comlrl.envs.remote.cli import serve
    except ImportError as exc:
        from comlrl.core.task import ENVS_INSTALL

        print(
            f"comlrl: comlrl serve needs comlrl-envs[serve] ({ENVS_INSTALL}): {exc}",
            file=sys.stderr,
        )
        return 2
    return serve(args, prog="comlrl serve")
