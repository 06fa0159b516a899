"""NativeSampler's C++ sampling step (comlrl.kernels.sample_tokens) against the Python one.

Both draw the same uniforms (:func:`draw_uniforms`, same streams and calls), so tokens are
equal unless a uniform lands within float rounding of a CDF boundary (probability ~1e-6
per draw here; the seeds are fixed). Log-probs: the C++ step uses float32 exponentials
and float64 sums, ``token_logprobs`` its own float32 reduction: both are within a few
float32 ulps of the tempered logits' range, checked at 1e-5 absolute (|logit / T| < ~20).
"""

from __future__ import annotations

import pytest
import torch
from comlrl.algos.rollout.sampling import native as native_mod
from comlrl.algos.rollout.sampling.draw import draw_uniforms, filtered_scores, sample_next
from comlrl.algos.rollout.sampling.native import NativeSampler
from comlrl.core import SamplingParams
from comlrl.kernels import token_logprobs, use_backend
from hypothesis import given, settings
from hypothesis import strategies as st

from .test_decode import _tiny

pytestmark = pytest.mark.skipif(
    not native_mod._native_sampling(torch.device("cpu")),
    reason="comlrl.kernels.sample_tokens is not available in this build",
)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    prompts=st.integers(1, 3),
    group=st.integers(1, 4),
    v=st.integers(1, 400),
    temperature=st.sampled_from([1.0, 0.6, 1.4]),
    top_k=st.sampled_from([0, 1, 3, 40]),
    top_p=st.sampled_from([1.0, 0.95, 0.7, 0.2]),
    streams=st.booleans(),
)
def test_same_tokens_and_logprobs_as_sample_next(
    seed: int,
    prompts: int,
    group: int,
    v: int,
    temperature: float,
    top_k: int,
    top_p: float,
    streams: bool,
) -> None:
    b = prompts * group
    logits = torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 4
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)

    def gens():  # type: ignore[no-untyped-def]
        if streams:
            return [torch.Generator().manual_seed(seed + p) for p in range(prompts)]
        return torch.Generator().manual_seed(seed)

    ref = sample_next(logits, params, gens())
    ref_logp = token_logprobs(logits, ref, temperature=temperature)
    u = draw_uniforms(b, gens(), logits.device, torch.float32)
    done = torch.zeros(b, dtype=torch.bool)
    tok, logp, _ = native_mod.sample_tokens(  # type: ignore[misc]
        logits,
        u,
        done,
        torch.tensor([1]),
        pad_id=0,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    assert torch.equal(tok, ref)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    # every drawn token is one the filters keep
    assert bool(filtered_scores(logits, params).gather(-1, tok[:, None]).isfinite().all())


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(num_generations=3, max_new_tokens=24),
        SamplingParams(num_generations=2, max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=20),
    ],
)
def test_sampler_output_equals_python_path(params: SamplingParams) -> None:
    model = _tiny("qwen2")
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (ids != 0).long()
    # Ten EOS ids: under this random model most rows end early and pad (the first case
    # stops one step early when all rows are done; measured 23 of 24 steps).
    eos = list(range(3, 13))

    def run(backend: str):  # type: ignore[no-untyped-def]
        sampler = NativeSampler(model, pad_token_id=0, eos_token_ids=eos)
        gens = [torch.Generator().manual_seed(11), torch.Generator().manual_seed(12)]
        with use_backend(backend):
            assert native_mod._native_sampling(torch.device("cpu")) == (backend == "auto")
            return sampler.sample(ids, mask, params, gens)

    ref_ids, ref_logp = run("torch")
    ids_c, logp_c = run("auto")
    assert torch.equal(ids_c, ref_ids)
    torch.testing.assert_close(logp_c, ref_logp, atol=1e-5, rtol=0)
    assert bool((ref_ids == 0).any())  # the done/pad bookkeeping was exercised


def test_a_model_without_eos_ids_samples_every_step() -> None:
    """No EOS ids (e.g. a model whose generation config names none): ``torch.tensor([])``
    is float32, which the C++ step refused ("eos is torch.float32"); the ids are int64."""
    model = _tiny("qwen2")
    ids = torch.tensor([[5, 6, 7]])
    params = SamplingParams(num_generations=2, max_new_tokens=6)
    sampler = NativeSampler(model, pad_token_id=0, eos_token_ids=[])
    out, logp = sampler.sample(ids, torch.ones_like(ids), params, torch.Generator().manual_seed(0))
    assert out.shape == (2, 6) and logp.shape == (2, 6)
