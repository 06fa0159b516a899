"""The scripts of ``examples/comlrl143/`` (our own, written against CoMLRL 1.4.3's API)
run unchanged against comlrl.trainers: all of them in one subprocess on stories260k, in
seconds each, each output checked for what the script shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "comlrl143"
SHARED = ROOT.parent / "shared"
MODEL = SHARED / "models" / "stories260k"


# --- the example scripts ----------------------------------------------------------------------
SCRIPTS = {
    # script, arguments, what its output must show
    "legacy_names": (
        ["{out}"],
        [
            "comlrl.trainers.magrpo is CoMLRL's pre-1.4.3 module",
            "MAGRPOConfig(learning_rate=...)",
            "use agent_learning_rate=",
            "MAGRPOConfig(per_device_train_batch_size=...)",
            "MAGRPOTrainer(model=...) is CoMLRL's pre-1.4.3 name",
            "saved: ['agent_0', 'agent_1']",
        ],
    ),
    "processors_and_wandb": (["{out}"], ["eval: {", "saved: ['agent_0', 'agent_1']"]),
    "per_agent_iac": (["{out}"], ["IAC steps: 2", "saved: ['agent_0', 'agent_1']"]),
    "quick_demo_magrpo": (["{out}"], ["saved: ['agent_0', 'agent_1']"]),
    "multi_turn_magrpo": ([], ["eval: {", "'eval/turn_1/reward_mean'"]),
    "actor_critic": (
        ["iac", "{out}"],
        ["agent_0/critic ['config.json'", "'value_head.safetensors'"],
    ),
}


# One interpreter runs every script in turn (runpy, as __main__, with its own argv): the
# torch/transformers import is paid once. Each script's output sits between markers.
_DRIVER = """
import runpy, sys, traceback
for name, path, argv in SCRIPTS:
    sys.modules.pop("comlrl.trainers.magrpo", None)  # its import warning, once per script
    print(f"@@begin {name}", flush=True)
    print(f"@@begin {name}", file=sys.stderr, flush=True)
    sys.argv = [path, *argv]
    try:
        runpy.run_path(path, run_name="__main__")
        status = "ok"
    except BaseException:
        traceback.print_exc()
        status = "failed"
    sys.stdout.flush(); sys.stderr.flush()
    print(f"@@end {name} {status}", flush=True)
    print(f"@@end {name} {status}", file=sys.stderr, flush=True)
"""


def _section(text: str, name: str) -> str:
    start = text.index(f"@@begin {name}\n") if f"@@begin {name}\n" in text else -1
    end = text.find(f"@@end {name} ", start)
    return text[start:end] if start >= 0 and end >= 0 else ""


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """``name -> (status, output)`` for every script in :data:`SCRIPTS`."""
    if not MODEL.is_dir():
        pytest.skip(f"pretrained stories260k model not found at {MODEL} (../shared)")
    pytest.importorskip("datasets", reason="the examples build datasets.Dataset objects")
    work = tmp_path_factory.mktemp("examples")
    runs = [
        (name, str(EXAMPLES / f"{name}.py"), [a.format(out=work / name) for a in args])
        for name, (args, _) in SCRIPTS.items()
    ]
    env = {
        **os.environ,
        "COMLRL_EXAMPLE_MODEL": str(MODEL),
        "WANDB_MODE": "disabled",  # the placeholder wandb_config needs no network
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-u", "-c", f"SCRIPTS = {runs!r}\n{_DRIVER}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=600,
    )
    results = {}
    for name in SCRIPTS:
        out, err = _section(proc.stdout, name), _section(proc.stderr, name)
        ok = f"@@end {name} ok" in proc.stdout
        results[name] = ("ok" if ok else "failed", out + err)
    return results


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_example_runs_against_this_package(
    name: str, example_runs: dict[str, tuple[str, str]]
) -> None:
    status, output = example_runs[name]
    assert status == "ok", output[-3000:]
    for text in SCRIPTS[name][1]:
        assert text in output, output[-3000:]
