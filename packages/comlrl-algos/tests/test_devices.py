"""Per-agent devices (comlrl.algos.models.devices, agent_devices / reference_devices): early
validation with a fake device map (no GPU needed) and placement in the recipe's setup."""

from __future__ import annotations

import pytest
import torch
from comlrl.algos import HFAgent, TrainConfig
from comlrl.algos.models.devices import (
    agent_placement,
    device_exists,
    model_device,
    validate_devices,
)
from comlrl.algos.recipes.group_baseline import recipe as group_baseline
from comlrl.algos.rollout.environment import CallbackEnvironment
from comlrl.algos.training.config.rl import ConfigError, build_config


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that says it has 4 CUDA devices (nothing is allocated on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


def test_devices_that_exist_pass_and_come_back_in_agent_order(four_gpus: None) -> None:
    assert validate_devices(["cuda:2", "cuda:0", "cpu"], 3) == [
        torch.device("cuda:2"),
        torch.device("cuda:0"),
        torch.device("cpu"),
    ]
    assert agent_placement(2, ["cuda:1", "cuda:3"], torch.device("cpu")) == [
        torch.device("cuda:1"),
        torch.device("cuda:3"),
    ]
    assert agent_placement(2, None, torch.device("cuda:0")) == [torch.device("cuda:0")] * 2
    assert device_exists(torch.device("cuda:3")) and not device_exists(torch.device("cuda:4"))


def test_a_device_the_machine_lacks_is_named(four_gpus: None) -> None:
    with pytest.raises(
        ValueError, match=r"'cuda:4' does not exist on this machine \(4 CUDA devices"
    ):
        validate_devices(["cuda:0", "cuda:4"], 2)


def test_cpu_only_machine_has_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="'cuda:0' does not exist"):
        validate_devices(["cuda:0", "cpu"], 2)


def test_wrong_count_and_bad_names_fail_early(four_gpus: None) -> None:
    with pytest.raises(ValueError, match="3 devices for num_agents=2"):
        validate_devices(["cuda:0", "cuda:1", "cuda:2"], 2)
    with pytest.raises(ValueError, match="'gpu0' is not a device name"):
        validate_devices(["gpu0", "cpu"], 2)
    with pytest.raises(ValueError, match="'auto' is only valid"):
        validate_devices(["auto", "cpu"], 2)


def test_config_checks_agent_and_reference_devices(four_gpus: None) -> None:
    cfg = TrainConfig(
        agent_devices=["cuda:0", "cuda:1"], kl_coef=0.1, reference_devices=["cuda:2", "cuda:3"]
    )
    assert cfg.agent_devices == ["cuda:0", "cuda:1"]
    with pytest.raises(ConfigError, match="agent_devices lists 1 devices for num_agents=2"):
        build_config({"agent_devices": ["cuda:0"]})
    with pytest.raises(ConfigError, match="'cuda:7' does not exist"):
        build_config({"agent_devices": ["cuda:0", "cuda:7"]})
    with pytest.raises(ConfigError, match="give agent_devices alone"):
        build_config({"device": "cuda:0", "agent_devices": ["cuda:0", "cuda:1"]})
    with pytest.raises(ConfigError, match="kl_coef=0"):
        build_config({"reference_devices": ["cuda:0", "cuda:1"]})


def test_shared_lora_base_needs_one_device(four_gpus: None) -> None:
    pytest.importorskip("peft")
    with pytest.raises(ConfigError, match="shared_base=true keeps one base on one device"):
        build_config({"lora": {}, "agent_devices": ["cuda:0", "cuda:1"]})
    assert (
        TrainConfig(lora={"shared_base": False}, agent_devices=["cuda:0", "cuda:1"]).lora
        is not None
    )


def _agents(tiny_tokenizer, n: int = 2) -> list[HFAgent]:  # type: ignore[no-untyped-def]
    from comlrl.algos.models.loading import build_default_model

    return [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer, name=f"a{i}")
        for i in range(n)
    ]


def _env() -> CallbackEnvironment:
    return CallbackEnvironment(
        [lambda ex: ex["p"]] * 2, lambda a, b: [float(len(x) > len(y)) for x, y in zip(a, b)]
    )


def test_setup_places_each_agent_and_reference_on_its_device(tiny_tokenizer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    placed: list[tuple[str, str]] = []
    agents = _agents(tiny_tokenizer)
    for agent in agents:  # record where setup moves each model (on CPU the move is a no-op)
        real_to = agent.model.to

        def to(device, _name=agent.name, _to=real_to):  # type: ignore[no-untyped-def]
            placed.append((_name, str(device)))
            return _to(device)

        agent.model.to = to  # type: ignore[method-assign]
    cfg = TrainConfig(
        agent_devices=["cpu", "cpu"],
        reference_devices=["cpu", "cpu"],
        kl_coef=0.1,
        output_dir=str(tmp_path),
        progress=False,
        max_new_tokens=4,
        num_generations=2,
        batch_size=1,
    )
    run = group_baseline.GroupBaselineRecipe(
        agents, cfg, environment=_env(), dataset=[{"p": "def f"}, {"p": "x ="}]
    )
    assert placed[:2] == [("a0", "cpu"), ("a1", "cpu")]
    assert (
        run.ref_models is not None
        and [model_device(r) for r in run.ref_models] == [torch.device("cpu")] * 2
    )
    row = run.step().row
    assert "kl/agent_0" in row and "kl/agent_1" in row
    run.close()


def test_setup_rejects_one_model_object_on_two_devices(tiny_tokenizer, four_gpus, tmp_path) -> None:  # type: ignore[no-untyped-def]
    agent = _agents(tiny_tokenizer, 1)[0]
    cfg = TrainConfig(agent_devices=["cuda:0", "cuda:1"], output_dir=str(tmp_path), progress=False)
    with pytest.raises(ConfigError, match="shares its model with an agent placed on cuda:0"):
        group_baseline.GroupBaselineRecipe(
            [agent, agent], cfg, environment=_env(), dataset=[{"p": "a"}]
        )


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (agent 0 on cuda:0, agent 1 on cpu)"
)
def test_agents_and_references_on_mixed_devices_train(tiny_tokenizer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real mixed placement: agent 0 on cuda:0 with its reference on the CPU, agent 1 on
    the CPU with its reference on cuda:0; one training step runs and every model stays put."""
    agents = _agents(tiny_tokenizer)
    cfg = TrainConfig(
        agent_devices=["cuda:0", "cpu"],
        reference_devices=["cpu", "cuda:0"],
        kl_coef=0.1,
        output_dir=str(tmp_path),
        progress=False,
        max_new_tokens=4,
        num_generations=2,
        batch_size=2,
    )
    run = group_baseline.GroupBaselineRecipe(
        agents, cfg, environment=_env(), dataset=[{"p": "def f"}, {"p": "x ="}]
    )
    row = run.step().row
    assert [model_device(a.model).type for a in agents] == ["cuda", "cpu"]
    assert run.ref_models is not None
    assert [model_device(r).type for r in run.ref_models] == ["cpu", "cuda"]
    assert row["kl/agent_0"] >= 0 and row["kl/agent_1"] >= 0
    run.close()
