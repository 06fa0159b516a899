"""FastDecoder's C++ step (comlrl.kernels.DecodeStep) against its Python step.

The two run the same maths on the same cache in another summation order, so logits agree
to float32 rounding: checked within 1e-5 of the largest |logit| (measured ~1e-7..1e-6),
and greedy decoding must pick the same tokens on the pretrained stories260k model and on
a random tiny Qwen2 (q/k/v biases, GQA, left padding).
"""

from __future__ import annotations

import pytest
import torch
from comlrl.algos.models.hf_cache import output_cache
from comlrl.algos.rollout.agent import HFAgent
from comlrl.algos.rollout.sampling.fast_decode import cpp_step as decode_native
from comlrl.algos.rollout.sampling.fast_decode.decoder import FastDecoder
from comlrl.core import SamplingParams

from .test_decode import PROMPTS, _tiny

pytestmark = pytest.mark.skipif(
    decode_native.native_unavailable(torch.nn.Linear(1, 1), torch.device("cpu")) is not None,
    reason="the C++ decode step is not available in this comlrl-kernels build",
)


def _stories260k():  # type: ignore[no-untyped-def]
    from comlrl.algos.models.loading import builtin_model_path
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(builtin_model_path())).eval()


def _greedy(model, ids, mask, g: int, steps: int, native: bool):  # type: ignore[no-untyped-def]
    """Greedy tokens ``[B, steps]`` and the logits of every step ``[B, steps, V]``."""
    with torch.no_grad():
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )
        s = ids.shape[1]
        fast = FastDecoder(model)
        start = mask.sum(-1, keepdim=True).repeat_interleave(g, dim=0)
        fast.start(
            output_cache(out), mask, g, start + torch.arange(steps), s + steps, native=native
        )
        assert (fast.native_status == "on") == native, fast.native_status
        logits = out.logits[:, -1].repeat_interleave(g, dim=0)
        tokens, all_logits = [], []
        for _ in range(steps):
            tok = logits.argmax(-1)
            tokens.append(tok)
            logits = fast.step(tok)
            all_logits.append(logits)
        fast.release()
    return torch.stack(tokens, 1), torch.stack(all_logits, 1)


def _prompts(vocab: int, lens: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    s = max(lens)
    ids = torch.randint(3, vocab, (len(lens), s), generator=gen)
    mask = torch.zeros(len(lens), s, dtype=torch.long)
    for i, n in enumerate(lens):
        mask[i, s - n :] = 1
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("which", ["stories260k", "qwen2"])
def test_greedy_tokens_are_identical_to_the_python_step(which: str) -> None:
    model = _stories260k() if which == "stories260k" else _tiny("qwen2", seed=3)
    ids, mask = _prompts(model.config.vocab_size, [12, 5, 9], seed=0)
    py_tokens, py_logits = _greedy(model, ids, mask, g=2, steps=40, native=False)
    c_tokens, c_logits = _greedy(model, ids, mask, g=2, steps=40, native=True)
    assert torch.equal(c_tokens, py_tokens)
    err = float((c_logits - py_logits).abs().max() / py_logits.abs().max())
    assert err < 1e-5, err


def test_it_is_off_where_it_cannot_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _tiny("llama")
    ids, mask = _prompts(model.config.vocab_size, [4, 2], seed=1)

    def status(**kw) -> str:  # type: ignore[no-untyped-def]
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
            fast = FastDecoder(model)
            pos = mask.sum(-1, keepdim=True) + torch.arange(3)
            fast.start(output_cache(out), mask, 1, pos, ids.shape[1] + 3, **kw)
            return fast.native_status

    assert status() == "on"
    assert status(native=False).startswith("off")
    assert status(static=True).startswith("off")
    monkeypatch.setenv("COMLRL_KERNELS_BACKEND", "torch")
    assert "torch" in status()
    monkeypatch.delenv("COMLRL_KERNELS_BACKEND")
    model.to(torch.bfloat16)
    assert "float32" in status()


def test_agent_samples_the_same_tokens_with_the_cpp_step_and_without(
    tiny_model, tiny_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(num_generations=3, max_new_tokens=24)
    batches = []
    for native in (True, False):
        if not native:  # the kernel reports itself unavailable: the Python step serves
            monkeypatch.setattr(decode_native, "decode_step_unavailable", lambda: "test")
        agent = HFAgent(tiny_model, tiny_tokenizer)
        for _ in range(2):  # the second call runs without the forward check
            agent.seed(11)
            batches.append(agent.sample(PROMPTS, params).batch)
        assert agent.fast_decode_status == "on"
    for other in batches[1:]:
        assert torch.equal(other.input_ids, batches[0].input_ids)
        torch.testing.assert_close(
            other.behaviour_logprobs, batches[0].behaviour_logprobs, rtol=0, atol=1e-5
        )
