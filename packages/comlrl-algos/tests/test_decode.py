"""FastDecoder: the lean decode step equals the model's own forward, and HFAgent uses it safely."""

from __future__ import annotations

import warnings

import pytest
import torch
from comlrl.algos.models.hf_cache import output_cache
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.sampling.fast_decode.cpp_step import native_unavailable
from comlrl.algos.rollout.sampling.fast_decode.decoder import FastDecoder
from comlrl.core import SamplingParams
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

PROMPTS = ["def add(a, b):\n    return", "x = [1, 2, 3]\nprint(sum(x", "import os"]


def _tiny(kind: str, seed: int = 0, **overrides):  # type: ignore[no-untyped-def]
    """A small random Llama / Qwen2 / Mistral with GQA (4 query heads, 2 KV heads)."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    common.update(overrides)
    cfg_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),  # q/k/v projections with biases
        "mistral": (MistralConfig, MistralForCausalLM),
    }[kind]
    if kind == "mistral":
        common.setdefault("sliding_window", None)
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**common)).eval()
    with torch.no_grad():  # non-trivial norms and biases, so every term is exercised
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def _fast_vs_forward(  # type: ignore[no-untyped-def]
    model, prompt_lens: list[int], g: int, steps: int, seed: int, **start_kwargs
) -> float:
    """Max |logit| difference between FastDecoder steps and full forwards of the same
    sequences, relative to the largest |logit| (``start_kwargs``: ``static``, ``native``).
    Also checks that the C++ step served exactly when it should: ``native`` (the
    default), a growing cache, and a float32 CPU model."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    v = model.config.vocab_size
    p, s = len(prompt_lens), max(prompt_lens)
    ids = torch.randint(2, v, (p, s), generator=gen)
    mask = torch.zeros(p, s, dtype=torch.long)
    for i, n in enumerate(prompt_lens):  # left padding
        mask[i, s - n :] = 1
    ids = ids.masked_fill(mask == 0, 0)
    new = torch.randint(2, v, (p * g, steps), generator=gen)  # teacher-forced tokens
    ids, mask, new = ids.to(device), mask.to(device), new.to(device)
    with torch.no_grad():
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )
        fast = FastDecoder(model)
        start = mask.sum(-1, keepdim=True).repeat_interleave(g, dim=0)
        fast.start(
            output_cache(out),
            mask,
            g,
            start + torch.arange(steps, device=device),
            s + steps,
            **start_kwargs,
        )
        native = (
            start_kwargs.get("native", True)
            and not start_kwargs.get("static")
            and native_unavailable(model, device) is None
        )
        assert (fast.native_status == "on") == native, fast.native_status
        got = torch.stack([fast.step(new[:, t]) for t in range(steps)], dim=1)
        full_ids = torch.cat([ids.repeat_interleave(g, 0), new], dim=1)
        full_mask = torch.cat([mask.repeat_interleave(g, 0), torch.ones_like(new)], dim=1)
        ref = model(
            input_ids=full_ids,
            attention_mask=full_mask,
            position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0),
        ).logits[:, s:]
    return float((got - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("native", [False, True])  # the Python step and the C++ step
@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_fast_decode_steps_equal_the_models_forward(kind: str, native: bool) -> None:
    model = _tiny(kind)
    assert FastDecoder.unsupported_reason(model) is None
    # relative to the largest |logit|; float32 rounding is ~1e-7
    assert _fast_vs_forward(model, [5, 9, 1], g=3, steps=6, seed=0, native=native) < 1e-5


@settings(max_examples=15, deadline=None)
@given(
    kind=st.sampled_from(["llama", "qwen2"]),
    prompt_lens=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    g=st.integers(1, 4),
    steps=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(["python", "static", "native"]),
)
def test_fast_decode_matches_for_any_padding_and_group_size(
    kind: str, prompt_lens: list[int], g: int, steps: int, seed: int, mode: str
) -> None:
    model = _tiny(kind, seed=seed % 7)
    kw = {"static": mode == "static", "native": mode == "native"}
    assert _fast_vs_forward(model, prompt_lens, g, steps, seed, **kw) < 1e-5


def test_fixed_shape_steps_mask_the_slots_not_yet_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fixed-shape step (the CUDA graph's) attends over every completion slot; a slot
    # not yet written must count for nothing. Poison the unwritten slots: if the mask
    # let them through, the logits would move or turn NaN.
    model = _tiny("llama")
    base = _fast_vs_forward(model, [5, 2], g=2, steps=6, seed=3, static=True)
    original = FastDecoder.start

    def poisoned_start(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        for layer in self.layers:
            layer.keys.fill_(1e4)
            layer.values.fill_(1e4)

    monkeypatch.setattr(FastDecoder, "start", poisoned_start)
    poisoned = _fast_vs_forward(model, [5, 2], g=2, steps=6, seed=3, static=True)
    assert base < 1e-5 and poisoned < 1e-5


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("g", [1, 3])
def test_fixed_shape_steps_on_cuda_equal_the_models_forward(kind: str, g: int) -> None:
    model = _tiny(kind).cuda()
    # TF32 is off by default for matmuls; float32 rounding on the GPU stays ~1e-6
    assert _fast_vs_forward(model, [5, 9, 1], g=g, steps=7, seed=0, static=True) < 1e-5


@pytest.mark.cuda
@cuda
def test_agent_samples_the_same_tokens_with_and_without_cuda_graphs(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    model = tiny_model.cuda()
    params = SamplingParams(num_generations=3, max_new_tokens=16)
    batches = []
    for graphs in (False, True):
        agent = HFAgent(model, tiny_tokenizer, cuda_graphs=graphs)
        for _ in range(2):
            agent.seed(11)
            batches.append(agent.sample(PROMPTS, params).batch)
        assert agent.fast_decode_status == "on"
    for other in batches[1:]:
        assert torch.equal(other.input_ids, batches[0].input_ids)
        torch.testing.assert_close(
            other.behaviour_logprobs, batches[0].behaviour_logprobs, rtol=0, atol=1e-5
        )


def test_unfused_projections_give_the_same_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    import comlrl.algos.rollout.sampling.fast_decode.decoder as decode

    model = _tiny("qwen2")
    fused = _fast_vs_forward(model, [4, 7], g=2, steps=3, seed=1, native=False)
    monkeypatch.setattr(decode, "FUSE_MAX_ELEMENTS", 0)  # the large-model path
    unfused = _fast_vs_forward(model, [4, 7], g=2, steps=3, seed=1, native=False)
    assert unfused < 1e-5 and fused < 1e-5


class _CountingModule:
    """Stands in for comlrl.kernels' compiled _cpu module and counts linear_rows calls."""

    def __init__(self, real: object) -> None:
        self.real, self.calls = real, 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name == "linear_rows":
            self.calls += 1
        return getattr(self.real, name)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_cpu_gemv_kernel_gives_the_same_logits(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    import comlrl.algos.rollout.sampling.fast_decode.decoder as decode
    import comlrl.algos.rollout.sampling.fast_decode.linears as decode_linear
    from comlrl.kernels import _dispatch

    if _dispatch._cpu is None:
        pytest.skip(f"comlrl.kernels' _cpu module is not built ({_dispatch._CPU_ERROR})")
    counter = _CountingModule(_dispatch._cpu)
    monkeypatch.setattr(_dispatch, "cpu_module", lambda: counter)
    model = _tiny(kind)
    assert _fast_vs_forward(model, [4, 7], g=2, steps=3, seed=1, native=False) < 1e-5
    assert counter.calls == 0  # the tiny model's weights are below the threshold
    monkeypatch.setattr(decode_linear, "KERNEL_MIN_ELEMENTS", 0)  # every linear on the kernel
    for fuse in (1 << 24, 0):
        monkeypatch.setattr(decode, "FUSE_MAX_ELEMENTS", fuse)
        assert _fast_vs_forward(model, [4, 7], g=2, steps=3, seed=1, native=False) < 1e-5
    # 3 steps x (2 layers x (q|k|v: 1 fused or 3, o, gate|up: 1 or 2, down) + the head)
    assert counter.calls == 3 * (2 * 4 + 1) + 3 * (2 * 7 + 1)
    # 9 prompts x G=2 = 18 rows > MAX_ROWS: F.linear serves
    assert (
        _fast_vs_forward(model, [4, 7, 2, 5, 3, 6, 1, 2, 3], g=2, steps=2, seed=3, native=False)
        < 1e-5
    )
    assert counter.calls == 3 * (2 * 4 + 1) + 3 * (2 * 7 + 1)


def test_bfloat16_models_stay_close() -> None:
    model = _tiny("llama").to(torch.bfloat16)
    assert _fast_vs_forward(model, [6, 3], g=2, steps=4, seed=2) < 5e-2  # bf16 eps is 7.8e-3


class _LoraLikeLinear(nn.Linear):
    """Stands in for an adapter or quantized linear (a subclass, not a plain nn.Linear)."""


def test_models_it_cannot_reproduce_are_refused_with_a_reason() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    assert "model_type 'gpt2'" in (FastDecoder.unsupported_reason(gpt2) or "")
    assert FastDecoder.for_model(gpt2) is None

    adapted = _tiny("llama")
    old = adapted.model.layers[1].self_attn.q_proj
    adapted.model.layers[1].self_attn.q_proj = _LoraLikeLinear(
        old.in_features, old.out_features, bias=False
    )
    assert "layer 1" in (FastDecoder.unsupported_reason(adapted) or "")

    hooked = _tiny("llama")
    hooked.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert "hooks" in (FastDecoder.unsupported_reason(hooked) or "")

    windowed = _tiny("mistral", sliding_window=16)
    assert "sliding window" in (FastDecoder.unsupported_reason(windowed, max_length=40) or "")
    assert FastDecoder.unsupported_reason(windowed, max_length=16) is None  # never reached


def test_agent_samples_the_same_tokens_with_and_without_fast_decode(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(num_generations=3, max_new_tokens=16)
    batches = []
    for fast in (False, True):
        agent = HFAgent(tiny_model, tiny_tokenizer, fast_decode=fast)
        for _ in range(2):  # the second call runs without the forward check
            agent.seed(11)
            batches.append(agent.sample(PROMPTS, params).batch)
        assert agent.fast_decode_status == ("on" if fast else "off: fast_decode=False")
    for other in batches[1:]:
        assert torch.equal(other.input_ids, batches[0].input_ids)
        torch.testing.assert_close(
            other.behaviour_logprobs, batches[0].behaviour_logprobs, rtol=0, atol=1e-5
        )


def test_fast_decode_makes_one_model_call_per_generate_after_the_check(
    tiny_model, tiny_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    calls = []
    original = tiny_model.forward

    def counting_forward(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(tuple(kwargs["input_ids"].shape))
        return original(*args, **kwargs)

    tiny_model.forward = counting_forward  # not a hook: hooks would disable fast decoding
    agent = HFAgent(tiny_model, tiny_tokenizer)
    params = SamplingParams(num_generations=2, max_new_tokens=10)
    agent.generate(PROMPTS, params)
    assert calls[0][0] == 3 and calls[1] == (6, 1) and len(calls) == 2  # prefill + the check
    calls.clear()
    agent.generate(PROMPTS, params)
    assert len(calls) == 1 and calls[0][0] == 3  # prefill only


def test_a_disagreeing_fast_step_falls_back_to_the_models_forward(
    tiny_model, tiny_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(num_generations=2, max_new_tokens=12)
    reference = HFAgent(tiny_model, tiny_tokenizer, fast_decode=False)
    reference.seed(5)
    expected = reference.sample(PROMPTS, params).batch

    real_step = FastDecoder.step
    monkeypatch.setattr(FastDecoder, "step", lambda self, tokens: real_step(self, tokens) * 1.5)
    agent = HFAgent(tiny_model, tiny_tokenizer)
    agent.seed(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = agent.sample(PROMPTS, params).batch
    assert any("fast decoding disagrees" in str(w.message) for w in caught)
    assert agent.fast_decode_status.startswith("off: first decode step differs")
    # The run continued on the model's own forward: same samples as never using it.
    assert torch.equal(got.input_ids, expected.input_ids)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40),
    hidden=st.sampled_from([8, 48, 64, 96, 576, 1000]),
    scale=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_float32_rms_norm_is_bitwise_the_explicit_float32_formula(
    rows: int, hidden: int, scale: float, seed: int
) -> None:
    # The decode step's float32 RMSNorm is one F.rms_norm call; it must equal the
    # transformers formula bit for bit, or sampled tokens could change.
    from comlrl.algos.rollout.sampling.fast_decode.layers import rms_norm

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen) * scale
    w = torch.randn(hidden, generator=gen)
    explicit = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.equal(rms_norm(x, w, 1e-5), explicit)


@given(heads=st.integers(1, 6), half=st.integers(1, 16))
def test_rolling_by_half_the_head_swaps_the_halves(heads: int, half: int) -> None:
    # The rotary step uses x.roll(d/2) for [x2, x1] (the sign lives in the sin table).
    x = torch.randn(3, heads, 2 * half)
    swapped = x.view(3, heads, 2, half).flip(-2).reshape(3, heads, 2 * half)
    assert torch.equal(x.roll(half, dims=-1), swapped)
