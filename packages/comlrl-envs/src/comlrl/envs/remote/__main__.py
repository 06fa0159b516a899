"""``python -m comlrl.envs.remote``: the task server's command line (:mod:`.cli`)."""

from __future__ import annotations

from comlrl.envs.remote.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
