"""Critic placement (``critic_devices`` of the actor-critic recipes): checked with a fake
device map before any model moves (no GPU needed), and a real short run on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from comlrl.algos import HFAgent
from comlrl.algos.models.devices import model_device
from comlrl.algos.models.value import Critic
from comlrl.algos.recipes.actor_critic.recipe import (
    ActorCriticConfig,
    IACTrainer,
    MAACTrainer,
    critic_placement,
)
from comlrl.algos.training.config.rl import ConfigError

DATA = [{"p": "def f"}, {"p": "x ="}, {"p": "y ="}]
CPU, GPU = torch.device("cpu"), [torch.device(f"cuda:{i}") for i in range(4)]


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that says it has 4 CUDA devices (nothing is allocated on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


def test_config_checks_critic_devices_before_anything_loads(four_gpus: None) -> None:
    cfg = ActorCriticConfig(agent_devices=["cuda:0", "cuda:1"], critic_devices=["cuda:2", "cuda:3"])
    assert cfg.critic_devices == ["cuda:2", "cuda:3"]
    assert ActorCriticConfig(critic_devices=["cuda:1"]).critic_devices == ["cuda:1"]  # MAAC
    with pytest.raises(ValueError, match="critic_devices lists 3 devices for num_agents=2"):
        ActorCriticConfig(critic_devices=["cuda:0", "cuda:1", "cuda:2"])
    with pytest.raises(ValueError, match="'cuda:7' does not exist on this machine"):
        ActorCriticConfig(critic_devices=["cuda:0", "cuda:7"])
    with pytest.raises(ValueError, match=r"critic_devices\[1\]='cuda:3' but agent 1 lives on"):
        ActorCriticConfig(
            critic_mode="shared",
            agent_devices=["cuda:0", "cuda:1"],
            critic_devices=["cuda:0", "cuda:3"],
        )
    shared = ActorCriticConfig(
        critic_mode="shared",
        agent_devices=["cuda:0", "cuda:1"],
        critic_devices=["cuda:0", "cuda:1"],
    )
    assert shared.critic_devices == ["cuda:0", "cuda:1"]


def test_critic_placement_per_method(four_gpus: None) -> None:
    agents = [GPU[0], GPU[1]]
    default = ActorCriticConfig()
    assert critic_placement(default, "iac", agents) == agents  # beside each agent
    assert critic_placement(default, "maac", agents) == [GPU[0]]  # beside agent 0
    assert critic_placement(
        ActorCriticConfig(critic_devices=["cuda:3", "cuda:2"]), "iac", agents
    ) == [GPU[3], GPU[2]]
    assert critic_placement(ActorCriticConfig(critic_devices=["cuda:2"]), "maac", agents) == [
        GPU[2]
    ]
    with pytest.raises(ConfigError, match="MAAC has 1 critic but critic_devices"):
        critic_placement(ActorCriticConfig(critic_devices=["cuda:2", "cuda:3"]), "maac", agents)
    with pytest.raises(ConfigError, match="IAC has 2 critics but critic_devices"):
        critic_placement(ActorCriticConfig(critic_devices=["cuda:2"]), "iac", agents)
    # a shared-trunk head lives with its actor, wherever setup actually put it
    shared = ActorCriticConfig(critic_mode="shared", critic_devices=["cuda:0", "cuda:2"])
    with pytest.raises(ConfigError, match=r"critic_devices\[1\]='cuda:2' but agent 1 is on"):
        critic_placement(shared, "iac", agents)
    assert critic_placement(shared, "iac", [GPU[0], GPU[2]]) == [GPU[0], GPU[2]]


def _agents(tok: Any, moves: list[tuple[str, str]]) -> list[HFAgent]:
    from comlrl.algos.models.loading import build_default_model

    agents = []
    for i in range(2):
        agent = HFAgent(build_default_model(len(tok), seed=i), tok, name=f"agent_{i}")
        _record_moves(agent.model, agent.name, moves)
        agents.append(agent)
    return agents


def _record_moves(model: Any, name: str, moves: list[tuple[str, str]]) -> None:
    """Record where ``model`` is moved (on the CPU the move itself is a no-op)."""
    real_to = model.to

    def to(device, *args, _name=name, _to=real_to, **kwargs):  # type: ignore[no-untyped-def]
        moves.append((_name, str(device)))
        return _to(device, *args, **kwargs)

    model.to = to


def _trainer(tok: Any, tmp_path: Path, method: str, moves: list[tuple[str, str]], **cfg: Any):  # type: ignore[no-untyped-def]
    from comlrl.algos.models.loading import build_default_model

    config = ActorCriticConfig(
        batch_size=2,
        num_turns=2,
        max_new_tokens=4,
        output_dir=str(tmp_path),
        progress=False,
        log_samples=0,
        **cfg,
    )
    agents = _agents(tok, moves)
    critics = []
    for i in range(2 if method == "iac" else 1):
        trunk = build_default_model(len(tok), seed=10 + i)
        _record_moves(trunk, f"critic_{i}", moves)
        critics.append(Critic(trunk, tok))
    cls = IACTrainer if method == "iac" else MAACTrainer
    return cls(
        agents,
        config,
        critics=critics,
        dataset=DATA,
        formatters=[lambda ex: ex["p"], lambda ex: ex["p"] + " #"],
        reward_func=lambda a, b: [float(len(x) > len(y)) for x, y in zip(a, b, strict=True)],
        transition=lambda **kw: [f"# {len(c)}\n" for c in kw["agent_completions"]],
    )


def test_a_critic_count_that_does_not_fit_the_method_fails_before_any_model_moves(
    tiny_tokenizer, four_gpus: None, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    moves: list[tuple[str, str]] = []
    with pytest.raises(ConfigError, match="MAAC has 1 critic"):
        _trainer(
            tiny_tokenizer,
            tmp_path,
            "maac",
            moves,
            agent_devices=["cuda:0", "cuda:1"],
            critic_devices=["cuda:2", "cuda:3"],
        )
    assert moves == []


@pytest.mark.parametrize(
    ("method", "devices"), [("iac", ["cpu", "cpu"]), ("maac", ["cpu"])], ids=["iac", "maac"]
)
def test_critics_train_on_their_devices(
    tiny_tokenizer, tmp_path: Path, method: str, devices: list[str]
) -> None:  # type: ignore[no-untyped-def]
    """A real short run with every device 'cpu': each critic is moved to its
    critic_devices entry, the step runs, and values meet the actors' advantages."""
    moves: list[tuple[str, str]] = []
    trainer = _trainer(
        tiny_tokenizer,
        tmp_path,
        method,
        moves,
        agent_devices=["cpu", "cpu"],
        critic_devices=devices,
    )
    critic_moves = [(n, d) for n, d in moves if n.startswith("critic")]
    assert critic_moves == [(f"critic_{i}", d) for i, d in enumerate(devices)]
    row = trainer.step().row
    assert [model_device(c.trunk) for c in trainer.critics] == [CPU] * len(devices)
    value_keys = [k for k in row if "value_loss" in k]
    assert value_keys and all(torch.isfinite(torch.tensor(row[k])) for k in value_keys)
    trainer.close()
