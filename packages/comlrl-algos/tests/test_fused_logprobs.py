"""The fused log-prob path (hidden states x lm_head in chunks) equals the materialised one.

Tolerances: both paths run the same decoder in float32; they differ only in how the
``[tokens, V]`` matmul is blocked (chunks of rows vs one call) and, in the backward, in the
order the lm_head gradient is summed (float32 accumulation over chunks vs one matmul).
That reorders float32 sums of ``H`` = 32 to 64 products, about 1e-7 relative per entry;
log-probs of order ``log V`` ~ 5 and gradients of order 1e-2 to 1 pass at atol 1e-5 with
room to spare, while any real difference (a dropped temperature, a shifted position, a
missing bias or soft-cap) moves them by 1e-2 or more.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from comlrl.algos.models import logprobs as logprobs_module
from comlrl.algos.models.logprobs import (
    completion_logprobs,
    default_logprob_chunk_size,
    fused_logprobs_unsupported,
)
from comlrl.algos.records import PolicyBatch
from comlrl.algos.training.update.policy import update_policy
from comlrl.algos.training.update.settings import UpdateSettings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

VOCAB = 97
ATOL, RTOL = 1e-5, 1e-5
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4


def _llama(seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def _qwen2(seed: int = 0) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=0,
    )
    model = Qwen2ForCausalLM(cfg)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


MODELS = {"llama": _llama, "qwen2_tied": _qwen2}


def _batch(
    seed: int, num_prompts: int = 2, group: int = 3, prompt_len: int = 7, length: int = 5
) -> PolicyBatch:
    """Left-padded prompts of different lengths (the first has 2 pad tokens, the last is
    full), completions of different lengths (masked after their end)."""
    gen = torch.Generator().manual_seed(seed)
    b = num_prompts * group
    prompt = torch.randint(1, VOCAB, (num_prompts, prompt_len), generator=gen)
    prompt_mask = torch.ones(num_prompts, prompt_len, dtype=torch.long)
    for n in range(num_prompts - 1):
        pad = 1 + (n + 1) % max(1, prompt_len - 1)
        prompt[n, :pad], prompt_mask[n, :pad] = 0, 0
    comp = torch.randint(1, VOCAB, (b, length), generator=gen)
    ends = torch.randint(1, length + 1, (b,), generator=gen)
    ends[0] = length
    comp_mask = torch.arange(length).unsqueeze(0) < ends.unsqueeze(1)
    comp = comp.masked_fill(~comp_mask, 0)
    ids = torch.cat([prompt.repeat_interleave(group, 0), comp], 1)
    mask = torch.cat([prompt_mask.repeat_interleave(group, 0), comp_mask.long()], 1)
    behaviour = -torch.rand(b, length, generator=gen) * 5 * comp_mask
    return PolicyBatch(ids, mask, comp_mask, behaviour, group)


def _logp_and_grads(
    model: Any, batch: PolicyBatch, **kw: Any
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logp = completion_logprobs(model, batch, slice(0, batch.num_prompts), **kw)
    weights = torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp) * batch.completion_mask
    (logp * weights).sum().backward()
    grads = [
        p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()
    ]
    return logp.detach(), grads


def _assert_same(model: Any, batch: PolicyBatch, **kw: Any) -> None:
    calls = []
    real = logprobs_module.linear_token_logprobs

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(kwargs.get("chunk_size"))
        return real(*args, **kwargs)

    logprobs_module.linear_token_logprobs = spy  # type: ignore[assignment]
    try:
        fused_lp, fused_g = _logp_and_grads(model, batch, fused=True, **kw)
        assert len(calls) == 1, "the fused path was not taken"
        plain_lp, plain_g = _logp_and_grads(model, batch, fused=False, **kw)
        assert len(calls) == 1, "fused=False must not call linear_token_logprobs"
    finally:
        logprobs_module.linear_token_logprobs = real  # type: ignore[assignment]
    m = batch.completion_mask
    torch.testing.assert_close(fused_lp[m], plain_lp[m], atol=ATOL, rtol=RTOL)
    assert max(float(g.abs().max()) for g in plain_g) > 1e-3, "gradients too small to compare"
    for a, b in zip(fused_g, plain_g, strict=True):
        torch.testing.assert_close(a, b, atol=GRAD_ATOL, rtol=GRAD_RTOL)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shared_prefix", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_path_gives_the_materialised_log_probs_and_parameter_gradients(
    name: str, shared_prefix: bool, temperature: float
) -> None:
    model = MODELS[name]()
    assert fused_logprobs_unsupported(model) is None
    # chunk_size=4 over 30 tokens: 8 chunks, the last one partial
    _assert_same(
        model, _batch(0), shared_prefix=shared_prefix, temperature=temperature, chunk_size=4
    )


def test_fused_path_handles_a_single_completion_token() -> None:
    model = _qwen2()
    for shared in (True, False):
        _assert_same(model, _batch(1, length=1), shared_prefix=shared)


_SHARED_MODELS = {name: build() for name, build in MODELS.items()}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(MODELS)),
    seed=st.integers(0, 10_000),
    num_prompts=st.integers(1, 3),
    group=st.integers(1, 3),
    prompt_len=st.integers(1, 6),
    length=st.integers(1, 6),
    shared_prefix=st.booleans(),
    temperature=st.floats(0.3, 2.0),
    chunk_size=st.one_of(st.none(), st.integers(1, 40)),
)
def test_fused_equals_materialised_for_any_batch_shape_temperature_and_chunk_size(
    name: str,
    seed: int,
    num_prompts: int,
    group: int,
    prompt_len: int,
    length: int,
    shared_prefix: bool,
    temperature: float,
    chunk_size: int | None,
) -> None:
    batch = _batch(seed, num_prompts, group, prompt_len, length)
    _assert_same(
        _SHARED_MODELS[name],
        batch,
        shared_prefix=shared_prefix,
        temperature=temperature,
        chunk_size=chunk_size,
    )


def test_default_chunk_keeps_a_float32_chunk_of_logits_within_256_mib() -> None:
    assert default_logprob_chunk_size(151_936) == 256  # 148 MiB
    assert default_logprob_chunk_size(32_000) == 1024  # capped at 1024 rows
    assert default_logprob_chunk_size(4_000_000) == 64  # floor
    with pytest.raises(ValueError, match="vocab_size"):
        default_logprob_chunk_size(0)


# --- models the fused path cannot handle exactly --------------------------------------


def _fallback(model: Any, match: str) -> None:
    """The reason names the problem; completion_logprobs warns once and returns the
    materialised path's values and gradients."""
    reason = fused_logprobs_unsupported(model)
    assert reason is not None and match in reason, reason
    batch = _batch(3)
    with pytest.warns(UserWarning, match="fused log-probs are not exact"):
        fused_lp, fused_g = _logp_and_grads(model, batch, fused=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        _logp_and_grads(model, batch, fused=True)
    plain_lp, plain_g = _logp_and_grads(model, batch, fused=False)
    torch.testing.assert_close(fused_lp, plain_lp, atol=0.0, rtol=0.0)  # the same code ran
    for a, b in zip(fused_g, plain_g, strict=True):
        torch.testing.assert_close(a, b, atol=0.0, rtol=0.0)


def test_an_lm_head_with_a_bias_falls_back() -> None:
    model = _llama()
    head = torch.nn.Linear(32, VOCAB, bias=True)
    torch.nn.init.normal_(head.bias, std=1.0)
    model.lm_head = head
    _fallback(model, "bias")


def test_final_logit_soft_capping_falls_back() -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        final_logit_softcapping=0.5,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=0,
    )
    model = Gemma2ForCausalLM(cfg)
    _fallback(model, "final_logit_softcapping")
    # and the cap matters here: the probe alone (no config check) sees hidden @ W.T differ
    # from the model's capped logits
    assert "differ" in (logprobs_module._probe(model, model.get_decoder(), model.lm_head) or "")


def test_logit_scaling_in_the_config_falls_back() -> None:
    model = _qwen2()
    model.config.logits_scaling = 8.0
    assert "logits_scaling=8.0" in (fused_logprobs_unsupported(model) or "")


def test_a_non_linear_head_and_hooks_fall_back() -> None:
    model = _llama()

    class Scaled(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2.0

    scaled = Scaled(32, VOCAB, bias=False)
    model.lm_head = scaled
    _fallback(model, "Scaled")
    model = _llama()
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out * 2.0)
    assert "hooks" in (fused_logprobs_unsupported(model) or "")
    handle.remove()
    assert fused_logprobs_unsupported(model) is None
    assert "not a transformers causal LM" in (
        fused_logprobs_unsupported(torch.nn.Linear(2, 2)) or ""
    )


def test_the_probe_catches_post_processing_no_check_knows_and_restores_train_modes() -> None:
    from transformers import LlamaForCausalLM

    class Doubled(LlamaForCausalLM):  # type: ignore[misc]
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2.0
            return out

    base = _llama()
    model = Doubled(base.config)
    model.train()
    model.model.layers[0].eval()
    modes = [m.training for m in model.modules()]
    reason = fused_logprobs_unsupported(model)
    assert reason is not None and "differ" in reason
    assert [m.training for m in model.modules()] == modes


# --- a whole update step ---------------------------------------------------------------


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_update_policy_step_gives_the_same_parameters_with_and_without_fused_logprobs(
    shared_prefix: bool,
) -> None:
    """Two turns, micro-batches, PPO clipping and a reference KL (whose log-probs also go
    through the fused path): SGD with lr 0.5 and no grad clipping, so the parameter change
    is the gradient itself; tolerance as for gradients, scaled by lr."""
    batches = [
        _batch(5, num_prompts=3, group=2),
        _batch(6, num_prompts=2, group=2, prompt_len=4, length=3),
    ]
    advantages = [torch.linspace(-1.0, 1.0, 6), torch.tensor([0.5, -0.5, 1.0, -1.0])]
    results = []
    for fused in (True, False):
        model, ref = _qwen2(seed=0), _qwen2(seed=1)
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        stats = update_policy(
            model,
            opt,
            batches,
            advantages,
            UpdateSettings(
                temperature=0.8,
                clip_ratio=0.2,
                kl_coef=0.1,
                micro_batch_size=2,
                max_grad_norm=None,
                num_iterations=2,
                shared_prefix=shared_prefix,
                fused_logprobs=fused,
            ),
            ref_model=ref,
        )
        moved = max(float((p.detach() - q).abs().max()) for p, q in zip(model.parameters(), before))
        assert moved > 1e-3
        results.append(([p.detach().clone() for p in model.parameters()], stats))
    (fused_params, fused_stats), (plain_params, plain_stats) = results
    for a, b in zip(fused_params, plain_params, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert fused_stats.keys() == plain_stats.keys()
    for key in fused_stats:
        assert fused_stats[key] == pytest.approx(plain_stats[key], rel=1e-4, abs=1e-5), key


@pytest.mark.parametrize("fused", [True, False])
def test_train_config_fused_logprobs_reaches_the_update_settings(
    tiny_tokenizer: Any, tmp_path: Any, fused: bool
) -> None:
    from comlrl.algos.models.loading import build_default_model
    from comlrl.algos.recipes.group_baseline.recipe import MultiAgentTrainer
    from comlrl.algos.rollout.agent import HFAgent
    from comlrl.algos.training.config.rl import TrainConfig

    assert TrainConfig().fused_logprobs is True  # the default
    cfg = TrainConfig(
        num_steps=1,
        batch_size=1,
        num_generations=2,
        max_new_tokens=4,
        progress=False,
        output_dir=str(tmp_path / "run"),
        fused_logprobs=fused,
    )
    agents = [
        HFAgent(build_default_model(len(tiny_tokenizer), seed=i), tiny_tokenizer) for i in range(2)
    ]
    trainer = MultiAgentTrainer(
        agents,
        cfg,
        dataset=[{"text": "def f(x):"}],
        reward_func=lambda a, b: [0.0] * len(a),
        formatters=[lambda ex: ex["text"], lambda ex: ex["text"]],
    )
    try:
        assert trainer.update_settings.fused_logprobs is fused
    finally:
        trainer.close()
