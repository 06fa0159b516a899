"""``--print-config`` and the defaults that read the registered tasks (a task's own
new-token budget, train's task checks): these need comlrl-envs' task suites installed, so
they run with all four packages (moved here from comlrl-algos' own tests, which run with
comlrl-algos alone)."""

from __future__ import annotations

import pytest
from comlrl.algos.cli import main as cli
from comlrl.algos.cli.main import main
from comlrl.algos.training.config.rl import TrainConfig

HUB = "Qwen/Qwen2.5-0.5B-Instruct"


def test_the_new_token_budget_is_the_named_tasks_own_or_256() -> None:
    assert TrainConfig(models=[HUB], task={"name": "coop_story"}).max_new_tokens == 48
    assert TrainConfig(models=[HUB], task={"name": "coop_humaneval"}).max_new_tokens == 256
    assert TrainConfig(models=[HUB]).max_new_tokens == 256  # no task named (own reward)


def test_print_config_of_a_hub_id_shows_the_table_without_loading_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from comlrl.algos.models import loading

    def no_loading(*a: object, **kw: object) -> None:
        raise AssertionError("--print-config must not load a model")

    monkeypatch.setattr(loading, "load_model_and_tokenizer", no_loading)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["train", "--model", HUB, "--print-config"]) == 0
    out = capsys.readouterr().out
    for line in (
        "optimizer: adamw",
        "learning_rate: 1.0e-06",
        "loss_reduction: token_mean",
        "num_generations: 8",
        "max_new_tokens: 48",  # the default task, coop_story, declares 48
    ):
        assert f"\n{line}\n" in out, line
    assert f"# defaults for pretrained LLMs ({HUB} is not a built-in model)" in out
    assert "# warning" not in out
    assert cli.main(["train", "--model", HUB, "learning_rate=1e-3", "--print-config"]) == 0
    assert "# warning: learning_rate=0.001 on the pretrained model" in capsys.readouterr().out


def test_print_config_shows_intermixed_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "train",
                "num_steps=2",
                "--model",
                "builtin:tiny-qwen2",
                "output_dir=y",
                "--print-config",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "num_steps: 2" in out and "output_dir: y" in out and "- builtin:tiny-qwen2" in out
    assert "# built-in models: builtin:stories260k" in out
