"""The update reads values back to the host a fixed number of times, not once or more per
micro-batch (on a GPU each read waits for all queued work), and builds the optimizer
torch runs fastest on the parameters' device."""

from __future__ import annotations

import traceback
from collections import Counter
from typing import Any

import pytest
import torch
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.training.update.agents import build_optimizer
from comlrl.algos.training.update.flat_radam import FlatRAdam
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from comlrl.core import SamplingParams
from torch.overrides import TorchFunctionMode

_READS = {"tolist", "item", "__float__", "__int__", "__bool__"}


class _HostReads(TorchFunctionMode):
    """Counts tensor-to-Python reads made by comlrl's own code (the model's forward, e.g.
    transformers' mask construction, and torch's optimizers are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in _READS:
            caller = traceback.extract_stack(limit=2)[0]
            if "/comlrl/" in caller.filename:
                self.reads[f"{caller.filename.rsplit('/', 1)[-1]}:{caller.lineno}"] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "settings",
    [
        UpdateSettings(),
        UpdateSettings(loss_reduction="token_mean", tis_level="token", clip_ratio=0.2),
    ],
)
def test_the_update_reads_the_device_a_fixed_number_of_times(
    tiny_model: Any, tiny_tokenizer: Any, settings: UpdateSettings
) -> None:
    agent = HFAgent(tiny_model, tiny_tokenizer)
    agent.seed(0)
    prompts = ["def add(a, b):", "def sub(a, b):", "class Stack:", "import os"]
    batch = agent.sample(prompts, SamplingParams(num_generations=2, max_new_tokens=6)).batch
    adv = torch.linspace(-1, 1, 8)
    counts = []
    for micro in (None, 2):  # one micro-batch per turn, then two
        opt = build_optimizer(agent.model.parameters(), "radam", lr=1e-3)
        with _HostReads() as seen:
            update_policy(
                agent.model,
                opt,
                [batch, batch],
                [adv, adv],
                UpdateSettings(**{**settings.__dict__, "micro_batch_size": micro}),
            )
        counts.append(sum(seen.reads.values()))
    # the token counts once, the metrics once, the CPU RAdam's step count once per step:
    # the same with four micro-batches as with two
    assert counts[0] == counts[1] <= 3, (counts, seen.reads)


def test_the_optimizer_is_the_cpu_one_pass_radam_on_cpu(tiny_model: Any) -> None:
    opt = build_optimizer(tiny_model.parameters(), "radam", lr=1e-3)
    assert isinstance(opt, FlatRAdam)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("name", "flag"), [("radam", "foreach"), ("adamw", "fused")])
def test_the_optimizer_on_cuda_is_torchs_multi_tensor_one(
    tiny_model: Any, name: str, flag: str
) -> None:
    opt = build_optimizer(tiny_model.cuda().parameters(), name, lr=1e-3)
    assert not isinstance(opt, FlatRAdam)
    assert opt.param_groups[0][flag] is True
