"""The one loop driver (comlrl.algos.training.loop) as every recipe meets it: reporters for
actor-critic runs, a used output_dir refused by the library as by the command line, the
task or reward a run really used recorded in config.yaml, warnings only for what a recipe
uses, and the shared-trunk critic's update on the actors' one code path."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.actor_critic.recipe import ActorCriticConfig, IACTrainer
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training import loop as loop_driver
from comlrl.algos.training.config.rl import ConfigError, TrainConfig
from comlrl.algos.training.run.diagnostics import TrainingWarning
from comlrl.algos.training.run.outputs import RunOutputs
from comlrl.algos.training.update import logprobs as update_module

DATA = [{"id": i, "text": f"def f{i}(x):\n    return x + {i}"} for i in range(4)]


def _reward(c1: list[str], c2: list[str]) -> list[float]:
    return [-abs(len(a) - len(b)) / 50.0 for a, b in zip(c1, c2, strict=True)]


def _agents(tok: Any) -> list[HFAgent]:
    torch.manual_seed(0)
    return [
        HFAgent(build_default_model(len(tok), seed=i), tok, name=f"agent_{i}") for i in range(2)
    ]


def _settings(out: Path, **overrides: Any) -> dict[str, Any]:
    return {
        "num_steps": 2,
        "batch_size": 2,
        "num_generations": 2,
        "max_new_tokens": 4,
        "learning_rate": 1e-2,
        "output_dir": str(out),
        "progress": False,
        "parallel_agents": False,
        **overrides,
    }


def _group_trainer(tok: Any, out: Path, **overrides: Any) -> MultiAgentTrainer:
    return MultiAgentTrainer(
        _agents(tok),
        TrainConfig(**_settings(out, **overrides)),
        dataset=DATA,
        reward_func=_reward,
        formatters=[lambda ex: ex["text"]] * 2,
    )


def test_a_library_run_refuses_a_used_output_dir_unless_told_to_overwrite(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    _group_trainer(tiny_tokenizer, out).train()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    with pytest.raises(ConfigError, match="already holds a run") as caught:
        _group_trainer(tiny_tokenizer, out).train()
    assert "overwrite=True" in str(caught.value) and "resume" in str(caught.value)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2  # nothing appended
    _group_trainer(tiny_tokenizer, out, num_steps=1).train(overwrite=True)
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1, "overwrite=True must start the logs afresh, not append"


def test_config_yaml_records_a_custom_reward_function_as_such(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "custom"
    _group_trainer(tiny_tokenizer, out, num_steps=1).train()
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["task"]["name"] == f"custom:{__name__}._reward"


def test_config_yaml_and_the_curve_record_the_agents_models_and_the_real_reward(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """Python-API runs: ``models:`` says what the agents hold (not the config's default
    builtin:stories260k), and reward_curve.png is titled with the custom reward, not the
    default task."""
    from comlrl.algos.models.loading import builtin_model_path, load_model_and_tokenizer
    from comlrl.algos.training.run.reporting import RewardCurveReporter

    out = tmp_path / "custom"
    trainer = _group_trainer(tiny_tokenizer, out, num_steps=1)  # in-memory tiny models
    trainer.train()
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["models"] == ["Qwen2ForCausalLM (in-memory model, no name_or_path)"], saved
    reporters = trainer.outputs.reporters(trainer.schedule().title, trainer.record)
    curve = [r for r in reporters if isinstance(r, RewardCurveReporter)]
    assert curve and curve[0].title is not None
    assert curve[0].title.startswith(f"custom:{__name__}._reward - Qwen2ForCausalLM")

    copy = tmp_path / "my-model"
    import shutil

    shutil.copytree(builtin_model_path(), copy)
    agents = [HFAgent(*load_model_and_tokenizer(str(copy)), name=f"a{i}") for i in range(2)]
    loaded = MultiAgentTrainer(
        agents,
        TrainConfig(**_settings(tmp_path / "loaded", num_steps=1)),
        dataset=DATA,
        reward_func=_reward,
        formatters=[lambda ex: ex["text"]] * 2,
    )
    assert loaded.record["models"] == [str(copy)]
    default = MultiAgentTrainer(
        [HFAgent(*load_model_and_tokenizer("builtin:stories260k"), name=f"b{i}") for i in range(2)],
        TrainConfig(**_settings(tmp_path / "builtin", num_steps=1)),
        dataset=DATA,
        reward_func=_reward,
        formatters=[lambda ex: ex["text"]] * 2,
    )
    assert default.record["models"] == ["builtin:stories260k"]


def test_comlrl_eval_refuses_to_score_a_custom_reward_run_with_a_task(
    tiny_tokenizer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from comlrl.algos.cli.main import main

    out = tmp_path / "custom"
    _group_trainer(tiny_tokenizer, out, num_steps=1).train()
    assert main(["eval", "--model", str(out / "final" / "agent_0")]) == 2
    err = capsys.readouterr().err
    assert "reward function of its own" in err and "task.name=NAME" in err


def test_actor_critic_runs_write_the_reporters_they_are_asked_for(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("matplotlib")
    out = tmp_path / "iac"
    cfg = ActorCriticConfig(
        **_settings(out, num_generations=1, critic_mode="shared"),
        report_to=["tensorboard"],
        reward_curve=True,
    )
    trainer = IACTrainer(
        _agents(tiny_tokenizer),
        cfg,
        dataset=DATA,
        reward_func=_reward,
        formatters=[lambda ex: ex["text"]] * 2,
    )
    trainer.train()
    assert list((out / "tensorboard").glob("events.out.tfevents.*")), "no TensorBoard events"
    assert (out / "reward_curve.png").is_file()
    assert yaml.safe_load((out / "config.yaml").read_text())["algo"] == "iac"


def test_actor_critic_does_not_warn_about_an_estimator_it_does_not_use(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    cfg = ActorCriticConfig(**_settings(tmp_path / "iac", num_generations=1, critic_mode="shared"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        IACTrainer(
            _agents(tiny_tokenizer),
            cfg,
            dataset=DATA,
            reward_func=_reward,
            formatters=[lambda ex: ex["text"]] * 2,
        )
    assert not [w for w in seen if issubclass(w.category, TrainingWarning)]
    # the group-baseline recipe, which does use it, still warns
    with pytest.warns(TrainingWarning, match="will not change"):
        _group_trainer(tiny_tokenizer, tmp_path / "gb", num_generations=1, estimator="rloo")


@pytest.mark.parametrize("fused", [True, False])
def test_the_shared_trunk_update_honours_fused_logprobs(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fused: bool
) -> None:
    seen: list[bool] = []
    original = update_module.completion_logprobs

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(bool(kwargs.get("fused")))
        return original(*args, **kwargs)

    monkeypatch.setattr(update_module, "completion_logprobs", spy)
    cfg = ActorCriticConfig(
        **_settings(tmp_path / "iac", num_generations=1, critic_mode="shared"),
        fused_logprobs=fused,
    )
    trainer = IACTrainer(
        _agents(tiny_tokenizer),
        cfg,
        dataset=DATA,
        reward_func=_reward,
        formatters=[lambda ex: ex["text"]] * 2,
    )
    row = trainer.step().row
    assert seen and set(seen) == {fused}
    assert "value_loss/agent_0" in row or any(k.startswith("value") for k in row), sorted(row)


def test_the_loop_hands_samples_from_the_step_result_not_from_the_run(tmp_path: Path) -> None:
    class Counting:
        """The smallest recipe the loop drives: steps that count, a complete checkpoint."""

        global_step = 0

        def schedule(self) -> loop_driver.Schedule:
            return loop_driver.Schedule(num_steps=3)

        def step(self) -> loop_driver.StepResult:
            self.global_step += 1
            return loop_driver.StepResult({"step": self.global_step, "loss": 1 / self.global_step})

        def evaluate(self) -> dict[str, float]:
            raise AssertionError("no evaluation set")

        def checkpoint(self, path: Path) -> Path:  # complete, as list_checkpoints sees it
            path.mkdir(parents=True)
            (path / "training_state.pt").touch()
            (path / "checkpoint.json").write_text("{}")
            return path

        def save_final(self, path: Path) -> None:
            return None

        def collective(self) -> loop_driver.Collective:
            return loop_driver.Collective()

    outputs = RunOutputs(output_dir=tmp_path, save_every=1, keep_last=1, reward_curve=False)
    history = loop_driver.run_loop(Counting(), outputs)
    assert [r["step"] for r in history] == [1, 2, 3]
    assert all("time/step_s" in r for r in history)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000003"]
    assert not (tmp_path / "samples.jsonl").exists()
