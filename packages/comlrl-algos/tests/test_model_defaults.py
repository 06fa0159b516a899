"""Defaults by model: built-in models keep the field defaults, any other model gets the
pretrained-LLM table; explicit values win everywhere; the header and --print-config say
which set applied; a high learning rate on a pretrained model warns."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from comlrl.algos.cli import main as cli
from comlrl.algos.recipes.launch import announce
from comlrl.algos.training.config.model_defaults import (
    FALLBACK_NEW_TOKENS,
    PRETRAINED_DEFAULTS,
    choose_defaults,
)
from comlrl.algos.training.config.rl import TrainConfig, load_config
from comlrl.algos.training.run.diagnostics import TrainingWarning
from comlrl.algos.training.run.outputs import RunOutputs

HUB = "Qwen/Qwen2.5-0.5B-Instruct"
TODAY = {  # the built-in defaults the README's default run and its pinned numbers rely on
    "optimizer": "radam",
    "learning_rate": 1e-3,
    "loss_reduction": "seq_mean_token_mean",
    "num_generations": 4,
    "max_new_tokens": 48,
}


def _values(cfg: TrainConfig) -> dict[str, object]:
    return {k: getattr(cfg, k) for k in TODAY}


def test_built_in_models_keep_todays_defaults() -> None:
    for cfg in (
        TrainConfig(),
        TrainConfig(models=["builtin:tiny-qwen2"]),
        TrainConfig(models=["builtin:stories260k", "builtin:tiny-qwen2"]),
    ):
        assert _values(cfg) == TODAY
        assert cfg.model_defaults().kind == "built-in"
        assert cfg.model_defaults().filled == {}


@pytest.mark.parametrize(
    "model", [HUB, "/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "runs/x/final/agent_0"]
)
def test_any_other_model_gets_the_pretrained_table(model: str) -> None:
    cfg = TrainConfig(models=[model])
    assert _values(cfg) == {**PRETRAINED_DEFAULTS, "max_new_tokens": FALLBACK_NEW_TOKENS}
    chosen = cfg.model_defaults()
    assert chosen.kind == "pretrained" and f"{model} is not a built-in model" in chosen.reason
    assert set(chosen.filled) == set(TODAY)
    # one pretrained agent among built-in ones is enough
    mixed = TrainConfig(models=["builtin:stories260k", model])
    assert mixed.model_defaults().kind == "pretrained"


def test_an_explicit_value_always_wins() -> None:
    python = TrainConfig(models=[HUB], learning_rate=5e-6, optimizer="radam", num_generations=2)
    assert (python.learning_rate, python.optimizer, python.num_generations) == (5e-6, "radam", 2)
    assert set(python.model_defaults().filled) == {"loss_reduction", "max_new_tokens"}
    python.max_new_tokens = 100  # an assignment is kept too
    assert python.max_new_tokens == 100


def test_yaml_and_command_line_values_win(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"models: [{HUB}]\nlearning_rate: 2.0e-5\nloss_reduction: seq_sum\n")
    cfg = load_config(path, ["num_generations=16"])
    assert (cfg.learning_rate, cfg.loss_reduction, cfg.num_generations) == (2e-5, "seq_sum", 16)
    assert cfg.optimizer == "adamw"  # not given: the pretrained table
    _, cli_cfg = cli._fresh_config(
        cli.parse_args(["train", "--model", HUB, "max_new_tokens=512", "optimizer=sgd"])
    )
    assert (cli_cfg.max_new_tokens, cli_cfg.optimizer) == (512, "sgd")
    assert cli_cfg.learning_rate == 1e-6


def test_a_high_learning_rate_on_a_pretrained_model_warns(tmp_path: Path) -> None:
    """At setup, judged by the models the agents hold (a Python run may give pretrained
    agents a config that names the built-in model); --print-config says it too."""
    from comlrl.algos.models.loading import load_model_and_tokenizer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.training.config.model_defaults import learning_rate_warning
    from comlrl.algos.training.run.diagnostics import warn_if_cannot_learn

    assert "learning_rate=0.001 on the pretrained model" in str(learning_rate_warning([HUB], 1e-3))
    assert learning_rate_warning([HUB], 1e-4) is not None
    assert learning_rate_warning([HUB], 5e-5) is None
    assert learning_rate_warning(["builtin:stories260k"], 1e-2) is None
    model, tok = load_model_and_tokenizer("builtin:stories260k")
    model.name_or_path = "my-org/pretrained-7b"  # what from_pretrained would say
    agents = [HFAgent(model, tok)]
    config = TrainConfig(num_agents=1)  # names builtin:stories260k, lr 1e-3
    with pytest.warns(TrainingWarning, match="on the pretrained model my-org/pretrained-7b"):
        warn_if_cannot_learn(config, agents, None, [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_cannot_learn(config.model_copy(update={"learning_rate": 2e-5}), agents, None, [])


def test_the_run_header_says_which_defaults_applied_and_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub = TrainConfig(models=[HUB], learning_rate=3e-6)
    announce(hub, RunOutputs.of(hub), 5, "a run", "2 agents")
    err = capsys.readouterr().err
    assert f"comlrl: defaults for pretrained LLMs ({HUB} is not a built-in model): " in err
    assert "optimizer=adamw" in err and "learning_rate" not in err.split("\n")[1]
    announce(TrainConfig(), RunOutputs.of(TrainConfig()), 5, "a run", "2 agents")
    assert "comlrl: defaults for the built-in models (every agent's model is builtin:*)" in (
        capsys.readouterr().err
    )


def test_choose_defaults_leaves_the_given_mapping_alone() -> None:
    data = {"models": [HUB], "learning_rate": 1e-5}
    filled, chosen = choose_defaults(data, ["builtin:stories260k"])
    assert data == {"models": [HUB], "learning_rate": 1e-5}
    assert filled["learning_rate"] == 1e-5 and filled["optimizer"] == "adamw"
    assert "learning_rate" not in chosen.filled


def test_a_local_copy_of_a_built_in_model_keeps_the_built_in_defaults(tmp_path: Path) -> None:
    """A folder with stories260k's architecture (a copy, or a run's final/agent_0 trained
    from it) is the built-in model; change its shape and it is a pretrained LLM."""
    import json
    import shutil

    from comlrl.algos.models.loading import builtin_model_path

    copy = tmp_path / "stories260k"
    shutil.copytree(builtin_model_path(), copy)
    cfg = TrainConfig(models=[str(copy)])
    assert _values(cfg) == TODAY
    assert "holds a built-in model's architecture" in cfg.model_defaults().reason
    assert f"{copy}: builtin:stories260k" in cfg.model_defaults().reason
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))
    assert TrainConfig(models=[str(copy)]).model_defaults().kind == "pretrained"


def test_a_saved_built_in_model_keeps_the_built_in_defaults_whichever_it_is(
    tmp_path: Path,
) -> None:
    """A run's final/agent_0 trained from builtin:tiny-qwen2 is built in, as one trained from
    builtin:stories260k is (save_pretrained's config.json, as a checkpoint writes it)."""
    from comlrl.algos.models.loading import load_model_and_tokenizer

    for name in ("builtin:tiny-qwen2", "builtin:stories260k"):
        model, tok = load_model_and_tokenizer(name)
        folder = tmp_path / name.split(":")[1]
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        cfg = TrainConfig(models=[str(folder)])
        assert cfg.model_defaults().kind == "built-in", (name, cfg.model_defaults().reason)
        assert _values(cfg) == TODAY
        assert f"{folder}: {name}" in cfg.model_defaults().reason
