"""Helpers shared by the benchmark drivers and their CoMLRL 1.4.3 sides (stdlib only: the
sides run under CoMLRL 1.4.3's own Python, which has none of our packages)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

#: Environment of a CoMLRL 1.4.3 side: no network, no progress bars, no W&B.
SIDE_ENV = {
    "WANDB_MODE": "disabled",
    "WANDB_SILENT": "true",
    "TQDM_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info(threads: int, **extra: Any) -> dict[str, Any]:
    """The ``machine`` block of a benchmark's JSON: platform, CPUs, torch threads, Python,
    torch and transformers versions, plus ``extra`` (e.g. ``device=``)."""
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch_threads": threads,
        **extra,
        "python": platform.python_version(),
        "torch": dist_version("torch"),
        "transformers": dist_version("transformers"),
    }


def git_commit(repo: Path) -> str:
    """``git rev-parse HEAD`` of ``repo`` ('' outside a git checkout)."""
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def run_side(
    python: str, script: Path, spec: dict[str, Any], work: Path, tag: str, *, quiet: bool = False
) -> dict[str, Any]:
    """Run a side script as ``python script --spec S --out O`` with ``spec`` written to
    ``work/spec_<tag>.json``; returns the JSON it wrote to ``work/out_<tag>.json``.

    Raises:
        subprocess.CalledProcessError: the side failed (its stderr is shown).
    """
    spec_path, out_path = work / f"spec_{tag}.json", work / f"out_{tag}.json"
    spec_path.write_text(json.dumps(spec))
    subprocess.run(
        [python, str(script), "--spec", str(spec_path), "--out", str(out_path)],
        check=True,
        stdout=subprocess.DEVNULL if quiet else None,
        env={**os.environ, "TQDM_DISABLE": "1", "WANDB_MODE": "disabled"},
    )
    return json.loads(out_path.read_text())


def side_spec(description: str) -> tuple[dict[str, Any], Path]:
    """A side script's ``--spec`` (parsed) and ``--out`` path; sets :data:`SIDE_ENV` defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    for key, value in SIDE_ENV.items():
        os.environ.setdefault(key, value)
    return json.loads(Path(args.spec).read_text()), Path(args.out)
