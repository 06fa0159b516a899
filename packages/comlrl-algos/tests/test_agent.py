"""HFAgent: one batched generate per call, and behaviour log-probs that match training."""

from __future__ import annotations

import torch

from comlrl.algos.agent import HFAgent
from comlrl.algos.config import TrainConfig
from comlrl.algos.trainer import MultiAgentTrainer
from comlrl.core import SamplingParams

PROMPTS = ["def add(a, b):\n    return", "x = [1, 2, 3]\nprint(sum(x"]  # different lengths


def test_generate_returns_p_groups_of_g_completions_with_one_generate_call(tiny_model, tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    calls = []
    original = tiny_model.generate

    def counting_generate(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs["input_ids"].shape)
        return original(*args, **kwargs)

    tiny_model.generate = counting_generate
    agent = HFAgent(tiny_model, tiny_tokenizer)
    torch.manual_seed(0)
    groups = agent.generate(PROMPTS, SamplingParams(num_generations=3, max_new_tokens=12))
    assert len(calls) == 1 and calls[0][0] == 2
    assert [len(g) for g in groups] == [3, 3]
    for group in groups:
        for c in group:
            assert 1 <= c.num_tokens <= 12
            assert c.logprobs.shape == (c.num_tokens,) and c.logprobs.dtype == torch.float32
            assert bool((c.logprobs <= 0).all())
    batch = agent.last_batch
    assert batch is not None and batch.input_ids.shape[0] == 6
    # the mask covers exactly each completion's tokens
    assert batch.completion_mask.sum(dim=1).tolist() == [c.num_tokens for g in groups for c in g]


def test_behaviour_logprobs_match_the_training_forward_under_left_padding(tiny_model, tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Generation-time log-probs (KV cache, left padding) equal the recomputed ones (tol 1e-4)."""
    agent = HFAgent(tiny_model, tiny_tokenizer)
    torch.manual_seed(1)
    agent.generate(PROMPTS, SamplingParams(num_generations=2, max_new_tokens=10, temperature=0.7))
    gb = agent.last_batch
    assert gb is not None
    trainer = MultiAgentTrainer.__new__(MultiAgentTrainer)
    trainer.config = TrainConfig(temperature=0.7)
    with torch.no_grad():
        logp = trainer._completion_logprobs(
            tiny_model, gb.input_ids, gb.attention_mask, gb.completion_mask.shape[1]
        )
    m = gb.completion_mask
    torch.testing.assert_close(logp[m], gb.behaviour_logprobs[m], atol=1e-4, rtol=1e-4)
