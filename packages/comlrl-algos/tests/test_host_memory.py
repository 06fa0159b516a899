"""What a training process holds between steps: each agent's weights and optimizer states,
not a third copy in gradients kept from the last update, nor the freed memory of the step
that the C allocator would keep (``benchmarks/bench_gguf_memory.py`` measures the RSS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from comlrl.algos.models.loading import build_default_model
from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training import loop as loop_driver
from comlrl.algos.training.config.rl import TrainConfig
from comlrl.algos.training.run import host_memory
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.core import SamplingParams


def test_an_update_leaves_no_gradient_behind(tiny_tokenizer: Any) -> None:
    """A gradient is a full copy of the parameters: kept between steps it held 0.5 GB per
    SmolLM2-135M agent for nothing (the next update sets it to None before its backward)."""
    model = build_default_model(len(tiny_tokenizer), seed=0)
    agent = HFAgent(model, tiny_tokenizer)
    agent.seed(0)
    batch = agent.sample(["def f(x):", "x = "], SamplingParams(2, 6)).batch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    stats = update_policy(
        model, opt, [batch], [torch.tensor([1.0, -1.0, 0.5, -0.5])], UpdateSettings()
    )
    assert stats["grad_norm"] > 0
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert len(opt.state) == len(before)  # the optimizer states stay, of course


def test_the_loop_gives_the_freed_memory_of_every_step_back(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(loop_driver, "release_freed_memory", lambda: calls.append(1) or True)
    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer, name=f"a{i}")
        for i in range(2)
    ]
    config = TrainConfig(
        num_steps=3, batch_size=2, num_generations=2, max_new_tokens=4,
        output_dir=str(tmp_path / "run"), progress=False, parallel_agents=False,
    )  # fmt: skip
    MultiAgentTrainer(
        agents, config, dataset=[{"text": f"x = {i}"} for i in range(4)],
        reward_func=lambda a, b: [float(len(x)) for x in a],
        formatters=[lambda ex: ex["text"]] * 2,
    ).train()  # fmt: skip
    assert len(calls) == 3


def test_freed_memory_is_trimmed_only_above_the_threshold() -> None:
    resident = host_memory.resident_bytes()
    assert resident is None or resident > 1 << 20  # an interpreter with torch: > 1 MiB
    assert host_memory.release_freed_memory(1 << 62) is False  # below: nothing done
    assert isinstance(host_memory.release_freed_memory(0), bool)
