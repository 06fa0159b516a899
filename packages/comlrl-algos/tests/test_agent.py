"""HFAgent: one batched generate per call, and behaviour log-probs that match training."""

from __future__ import annotations

import pytest
import torch
from comlrl.algos.models.logprobs import completion_logprobs
from comlrl.algos.rollout.agent import HFAgent
from comlrl.core import SamplingParams

PROMPTS = ["def add(a, b):\n    return", "x = [1, 2, 3]\nprint(sum(x"]  # different lengths


def test_hf_backend_samples_all_groups_with_one_generate_call(tiny_model, tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    calls = []
    original = tiny_model.generate

    def counting_generate(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs["input_ids"].shape)
        return original(*args, **kwargs)

    tiny_model.generate = counting_generate
    agent = HFAgent(tiny_model, tiny_tokenizer, backend="hf")
    torch.manual_seed(0)
    samples = agent.sample(PROMPTS, SamplingParams(num_generations=3, max_new_tokens=12))
    assert len(calls) == 1 and calls[0][0] == 2
    _check_groups(samples)


def test_native_backend_prefills_each_prompt_once_then_one_call_per_token(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    shapes = []
    hook = tiny_model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    agent = HFAgent(tiny_model, tiny_tokenizer)
    torch.manual_seed(0)
    samples = agent.sample(PROMPTS, SamplingParams(num_generations=3, max_new_tokens=12))
    hook.remove()
    assert shapes[0][0] == 2, "the prefill should see each prompt once, not G times"
    assert all(shape == (6, 1) for shape in shapes[1:])
    assert len(shapes) <= 12
    _check_groups(samples)


def _check_groups(samples) -> None:  # type: ignore[no-untyped-def]
    groups = samples.completions
    assert samples.prompts == tuple(PROMPTS)
    assert [len(g) for g in groups] == [3, 3]
    for group in groups:
        for c in group:
            assert 1 <= c.num_tokens <= 12
            assert c.logprobs.shape == (c.num_tokens,) and c.logprobs.dtype == torch.float32
            assert bool((c.logprobs <= 0).all())
    batch = samples.batch
    assert batch.input_ids.shape[0] == 6
    # the mask covers exactly each completion's tokens
    assert batch.completion_mask.sum(dim=1).tolist() == [c.num_tokens for g in groups for c in g]


@pytest.mark.parametrize("backend", ["native", "hf"])
def test_behaviour_logprobs_match_the_training_forward_under_left_padding(
    tiny_model, tiny_tokenizer, backend: str
) -> None:  # type: ignore[no-untyped-def]
    """Generation-time log-probs (KV cache, left padding) equal the recomputed ones (tol 1e-4)."""
    agent = HFAgent(tiny_model, tiny_tokenizer, backend=backend)
    torch.manual_seed(1)
    gb = agent.sample(
        PROMPTS, SamplingParams(num_generations=2, max_new_tokens=10, temperature=0.7)
    ).batch
    m = gb.completion_mask
    for shared in (True, False):
        with torch.no_grad():
            logp = completion_logprobs(
                tiny_model, gb, slice(0, 2), temperature=0.7, shared_prefix=shared
            )
        torch.testing.assert_close(logp[m], gb.behaviour_logprobs[m], atol=1e-4, rtol=1e-4)


def test_hf_backend_recomputes_logprobs_when_generate_returns_only_sequences(
    tiny_model, tiny_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A replaced ``generate`` that returns no step logits (a scripted policy) still gives
    behaviour log-probs: one forward pass recomputes them (tol 1e-5)."""
    from types import SimpleNamespace

    original = tiny_model.generate

    def sequences_only(*args, **kwargs):  # type: ignore[no-untyped-def]
        return SimpleNamespace(sequences=original(*args, **kwargs).sequences)

    monkeypatch.setattr(tiny_model, "generate", sequences_only)
    agent = HFAgent(tiny_model, tiny_tokenizer, backend="hf")
    torch.manual_seed(2)
    gb = agent.sample(
        PROMPTS, SamplingParams(num_generations=2, max_new_tokens=8, temperature=0.7)
    ).batch
    m = gb.completion_mask
    assert bool(torch.isfinite(gb.behaviour_logprobs).all())
    with torch.no_grad():
        logp = completion_logprobs(tiny_model, gb, slice(0, 2), temperature=0.7)
    torch.testing.assert_close(gb.behaviour_logprobs[m], logp[m].float(), atol=1e-5, rtol=1e-5)


def test_shared_prefix_forward_gives_the_plain_forwards_log_probs_and_gradient(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    agent = HFAgent(tiny_model, tiny_tokenizer)
    torch.manual_seed(2)
    gb = agent.sample(PROMPTS, SamplingParams(num_generations=3, max_new_tokens=9)).batch
    weights = torch.randn(gb.completion_mask.shape) * gb.completion_mask
    results = []
    for shared in (True, False):
        tiny_model.zero_grad()
        logp = completion_logprobs(tiny_model, gb, slice(0, 2), shared_prefix=shared)
        (logp * weights).sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in tiny_model.parameters()]))
    (lp_shared, g_shared), (lp_plain, g_plain) = results
    m = gb.completion_mask
    torch.testing.assert_close(lp_shared[m], lp_plain[m], atol=1e-5, rtol=1e-5)
    assert max(float(g.abs().max()) for g in g_plain) > 1e-4
    for a, b in zip(g_shared, g_plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_native_top_k_one_is_greedy(tiny_model, tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    agent = HFAgent(tiny_model, tiny_tokenizer)
    torch.manual_seed(0)
    groups = agent.generate(
        PROMPTS[:1], SamplingParams(num_generations=3, max_new_tokens=8, top_k=1)
    )
    assert len({tuple(c.token_ids.tolist()) for c in groups[0]}) == 1
    enc = tiny_tokenizer(PROMPTS[:1], return_tensors="pt")
    greedy = tiny_model.generate(
        input_ids=enc["input_ids"],
        attention_mask=enc["attention_mask"],
        do_sample=False,
        max_new_tokens=8,
        pad_token_id=0,
    )
    n = groups[0][0].num_tokens
    assert groups[0][0].token_ids.tolist() == greedy[0, enc["input_ids"].shape[1] :][:n].tolist()


def test_unknown_backend_is_rejected(tiny_model, tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="unknown generation backend 'sglang'"):
        HFAgent(tiny_model, tiny_tokenizer, backend="sglang")


def test_inverse_cdf_sampling_matches_the_tempered_filtered_distribution() -> None:
    from comlrl.algos.rollout.sampling.draw import sample_next as _sample_next

    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]])).repeat(40000, 1)
    draws = _sample_next(logits, SamplingParams(temperature=1.0))
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    torch.testing.assert_close(
        freq, torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625]), atol=0.01, rtol=0
    )
    # top_p=0.7 keeps the smallest prefix with mass >= 0.7: tokens 0 and 1 (0.75)
    draws = _sample_next(logits, SamplingParams(top_p=0.7))
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    torch.testing.assert_close(freq, torch.tensor([2 / 3, 1 / 3, 0, 0, 0]), atol=0.01, rtol=0)
    draws = _sample_next(logits, SamplingParams(top_k=2))
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    torch.testing.assert_close(freq, torch.tensor([2 / 3, 1 / 3, 0, 0, 0]), atol=0.01, rtol=0)
    draws = _sample_next(logits, SamplingParams(temperature=0.5))
    p = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625]) ** 2
    torch.testing.assert_close(
        torch.bincount(draws, minlength=5).float() / draws.numel(), p / p.sum(), atol=0.01, rtol=0
    )


def test_small_models_decode_on_one_thread_and_the_setting_is_restored(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    seen = []
    hook = tiny_model.register_forward_pre_hook(lambda *args: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        HFAgent(tiny_model, tiny_tokenizer).generate(
            PROMPTS, SamplingParams(num_generations=2, max_new_tokens=4)
        )
        assert set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        hook.remove()
        torch.set_num_threads(before)


def test_finished_marks_completions_that_ended_with_eos(tiny_model, tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    every_token = HFAgent(
        tiny_model, tiny_tokenizer, eos_token_ids=list(range(len(tiny_tokenizer)))
    )
    groups = every_token.generate(PROMPTS, SamplingParams(num_generations=2, max_new_tokens=5))
    assert all(c.finished and c.num_tokens == 1 for g in groups for c in g)
    never = HFAgent(tiny_model, tiny_tokenizer, eos_token_ids=[len(tiny_tokenizer) + 7])
    groups = never.generate(PROMPTS, SamplingParams(num_generations=2, max_new_tokens=5))
    assert all(not c.finished and c.num_tokens == 5 for g in groups for c in g)
