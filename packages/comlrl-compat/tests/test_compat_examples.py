"""The pre-1.4.3 names CoMLRL's tutorials use, and the scripts of ``examples/comlrl143/``
(our own, written against CoMLRL 1.4.3's API), against comlrl.trainers. Each script runs
here in a subprocess on stories260k in seconds.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from comlrl.trainers import MAGRPOConfig, MAGRPOTrainer, MARLOOConfig, UnsupportedFieldError

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "comlrl143"
SHARED = ROOT.parent / "shared"
MODEL = SHARED / "models" / "stories260k"


# --- the pre-1.4.3 names ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("learning_rate", "agent_learning_rate", 5e-5),
        ("per_device_train_batch_size", "rollout_buffer_size", 1),
        ("termination_threshold", "early_termination_threshold", 0.5),
    ],
)
def test_legacy_config_fields_warn_and_map_to_their_1_4_3_field(
    old: str, new: str, value: float
) -> None:
    for cls in (MAGRPOConfig, MARLOOConfig):
        with pytest.warns(DeprecationWarning, match=rf"{cls.__name__}\({old}=...\).* use {new}="):
            config = cls(**{old: value})
        assert getattr(config, new) == value
    with pytest.raises(TypeError, match=rf"got {old}= .* and {new}="):
        MAGRPOConfig(**{old: value, new: value})


def test_per_device_train_batch_size_sets_the_examples_per_step() -> None:
    with pytest.warns(DeprecationWarning):
        config = MAGRPOConfig(per_device_train_batch_size=3)
    assert (config.rollout_buffer_size, config.train_batch_size) == (3, 3)


def test_legacy_fields_without_a_counterpart_raise_naming_the_replacement() -> None:
    with pytest.raises(UnsupportedFieldError, match=r"output_dir=.*save_model\(output_dir\)"):
        MAGRPOConfig(output_dir="out")
    with pytest.raises(UnsupportedFieldError, match="dataset_type='humaneval'"):
        MAGRPOTrainer(model="no/such-model", dataset_type="humaneval")
    with pytest.raises(TypeError, match="got model= .* and agent_model="):
        MAGRPOTrainer(model="a", agent_model="b")


def test_legacy_module_warns_and_defaults_to_one_turn() -> None:
    sys.modules.pop("comlrl.trainers.magrpo", None)
    with pytest.warns(DeprecationWarning, match="comlrl.trainers.magrpo is CoMLRL's pre-1.4.3"):
        legacy = importlib.import_module("comlrl.trainers.magrpo")
    assert legacy.MAGRPOTrainer is MAGRPOTrainer
    assert issubclass(legacy.MAGRPOConfig, MAGRPOConfig)
    assert legacy.MAGRPOConfig().num_turns == 1 and MAGRPOConfig().num_turns == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the 1.4.3 names do not warn
        assert legacy.MAGRPOConfig(agent_learning_rate=1e-4).agent_learning_rate == 1e-4


def test_model_keyword_warns_and_loads_the_agents() -> None:
    if not MODEL.is_dir():
        pytest.skip(f"pretrained stories260k model not found at {MODEL} (../shared)")
    with pytest.warns(DeprecationWarning, match=r"MAGRPOTrainer\(model=...\).* agent_model="):
        trainer = MAGRPOTrainer(
            model=str(MODEL),
            reward_func=lambda a, b: [0.0],
            train_dataset=[{"prompt": "Once"}],
            args=MAGRPOConfig(num_turns=1),
        )
    assert len(trainer.agents) == 2 and trainer.model_name == str(MODEL)


# --- the example scripts ----------------------------------------------------------------------
SCRIPTS = {
    # script, arguments, what its output must show
    "legacy_names": (
        ["{out}"],
        [
            "comlrl.trainers.magrpo is CoMLRL's pre-1.4.3 module",
            "MAGRPOConfig(learning_rate=...)",
            "MAGRPOConfig(per_device_train_batch_size=...)",
            "MAGRPOTrainer(model=...) is CoMLRL's pre-1.4.3 name",
            "saved: ['agent_0', 'agent_1']",
        ],
    ),
    "processors_and_wandb": (["{out}"], ["eval: {", "saved: ['agent_0', 'agent_1']"]),
    "per_agent_iac": (["{out}"], ["IAC steps: 2", "saved: ['agent_0', 'agent_1']"]),
    "quick_demo_magrpo": (["{out}"], ["saved: ['agent_0', 'agent_1']"]),
    "multi_turn_magrpo": ([], []),
    "actor_critic": (["iac-shared", "{out}"], []),
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
